//! Run a command as root of a new user namespace that maps ids `0..65536` to `BASE..`, as a
//! confined command of root runs: `cargo run -p shade-fusefs --example nsroot -- BASE DIR
//! CMD [ARGS...]` (as root). With the `mount` example's `SHADE_ID_SHIFT=BASE`, for poking
//! at (or running pjdfstest in) a shifted branch. `DIR` becomes the working directory
//! before the namespace is made, so it may lie below directories only root can search.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is valid for two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just made and are owned here only.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: nsroot BASE DIR CMD [ARGS...]".into());
    }
    let base: u32 = args[0].to_str().ok_or("BASE: a number")?.parse()?;
    let dir = CString::new(args[1].as_bytes())?;
    let argv_c: Vec<CString> = args[2..]
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut argv: Vec<*const libc::c_char> = argv_c.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let (ready_r, ready_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    // SAFETY: single-threaded here; the child only makes raw syscalls until exec.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid == 0 {
        // SAFETY: raw syscalls on prepared buffers.
        unsafe {
            let mut b = 0u8;
            if libc::chdir(dir.as_ptr()) != 0
                || libc::unshare(libc::CLONE_NEWUSER) != 0
                || libc::write(ready_w.as_raw_fd(), b"r".as_ptr().cast(), 1) != 1
                || libc::read(go_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1) != 1
                || libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(0, 0, 0) != 0
                || libc::setresuid(0, 0, 0) != 0
            {
                libc::_exit(126);
            }
            libc::execvp(argv[0], argv.as_ptr());
            libc::_exit(127);
        }
    }
    drop((ready_w, go_r));
    let mut b = [0u8; 1];
    std::fs::File::from(ready_r).read_exact(&mut b)?;
    let map = format!("0 {base} 65536\n");
    std::fs::write(format!("/proc/{pid}/uid_map"), &map)?;
    std::fs::write(format!("/proc/{pid}/gid_map"), &map)?;
    std::fs::File::from(go_w).write_all(b"g")?;
    let mut status = 0;
    // SAFETY: waiting on our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    std::process::exit(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    })
}

//! The outside layer's size limit (`outside_size`, issue 29): a branch's layer whose
//! commands may write only so much outside the project keeps its units' upper and work
//! directories on a tmpfs of that size, which shade holds for the branch's life as a
//! *detached* mount (fsopen/fsmount: an fd, mounted nowhere). Writes past it fail with
//! ENOSPC, the branch's later commands see what was written, and nothing is mounted on the
//! host: when shade ends, even by `kill -9`, the fd closes and the memory is freed; there
//! is nothing for `shade recover` to unmount.
//!
//! The units' directories in the outside directory (`uN`) are symlinks to
//! `/proc/self/fd/FD/uN`: shade (the lister, keep) and the pre-exec hooks of its commands
//! (the overlays' `upperdir`) reach the tmpfs through the fd, which has the same number in
//! both. The kernel takes an overlay layer on a detached mount since Linux 6.15; where it
//! does not, the overlay would fail (the unit then shows empty and read-only, see outside.rs), so
//! there the layer stays on disk, unbounded, said once in the log.
//!
//! As a plain user the tmpfs is made in a user namespace of shade's own, held by an fd
//! ([`holder`]); the command's mount namespace is then made in that same user namespace
//! (see `UserStage::enter`), since only a namespace's own may use a mount made in it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Sized layers of this process: (outside directory, the tmpfs, its size).
static SIZED: Mutex<Vec<(PathBuf, OwnedFd, u64)>> = Mutex::new(Vec::new());

/// The tmpfs of `outside`'s layer, when it is sized: its fd, for `/proc/self/fd/FD`.
pub(crate) fn root_of(outside: &Path) -> Option<RawFd> {
    SIZED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(p, _, _)| p == outside)
        .map(|(_, fd, _)| fd.as_raw_fd())
}

/// The path a unit `name` of a sized layer lives at.
pub(crate) fn unit_path(fd: RawFd, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}/{name}"))
}

/// Makes `outside`'s layer sized (`size` bytes) if it is new (no unit recorded yet) and
/// not sized already. A layer made before on disk stays there.
pub(crate) fn make(outside: &Path, size: u64, has_units: bool) {
    if has_units || root_of(outside).is_some() {
        return;
    }
    match tmpfs(size) {
        Ok(fd) => SIZED.lock().unwrap_or_else(PoisonError::into_inner).push((
            outside.to_path_buf(),
            fd,
            size,
        )),
        Err(e) => warn_once(&e),
    }
}

/// Forgets `outside`'s tmpfs (its memory is freed once no command's overlay holds it).
pub(crate) fn release(outside: &Path) {
    SIZED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|(p, _, _)| p != outside);
}

/// The size of `outside`'s layer when it is full (no block left, or under 64 KiB).
pub(crate) fn full(outside: &Path) -> Option<u64> {
    let list = SIZED.lock().unwrap_or_else(PoisonError::into_inner);
    let (_, fd, size) = list.iter().find(|(p, _, _)| p == outside)?;
    // SAFETY: fstatfs(2) on an fd we hold, into a zeroed struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    let free = st
        .f_bavail
        .saturating_mul(u64::try_from(st.f_bsize).unwrap_or(4096));
    (free < 64 << 10).then_some(*size)
}

fn warn_once(why: &str) {
    static WARNED: OnceLock<()> = OnceLock::new();
    if WARNED.set(()).is_ok() {
        tracing::warn!(
            "the outside layer's size limit is not enforced here ({why}): it stays on disk"
        );
    }
}

/// As a plain user: the user namespace shade's sized layers and its commands' stages are
/// made in, mapping our uid and gid to themselves (made once, held by an fd). `None` as
/// root, or where it cannot be had.
pub(crate) fn holder() -> Option<RawFd> {
    static HOLDER: OnceLock<Option<OwnedFd>> = OnceLock::new();
    if nix::unistd::geteuid().is_root() {
        return None;
    }
    HOLDER
        .get_or_init(|| {
            make_holder()
                .map_err(|e| warn_once(&format!("no user namespace of its own: {e}")))
                .ok()
        })
        .as_ref()
        .map(AsRawFd::as_raw_fd)
}

/// A child unshares a user namespace and maps itself (made dumpable again: shade is not,
/// which would leave its /proc files to root), then waits while we open the namespace.
fn make_holder() -> io::Result<OwnedFd> {
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (go_r, go_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let uid = nix::unistd::geteuid();
    let gid = nix::unistd::getegid();
    let uid_map = format!("{uid} {uid} 1\n").into_bytes();
    let gid_map = format!("{gid} {gid} 1\n").into_bytes();
    // SAFETY: the child only makes async-signal-safe system calls on data prepared
    // before the fork.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            libc::close(go_w.as_raw_fd());
            let ok = libc::unshare(libc::CLONE_NEWUSER) == 0 && {
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
                super::write_id_maps(&uid_map, &gid_map).is_ok()
            };
            let b = [u8::from(ok)];
            libc::write(ready_w.as_raw_fd(), b.as_ptr().cast(), 1);
            let mut x = [0u8; 1];
            libc::read(go_r.as_raw_fd(), x.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(go_r);
    let result = (|| {
        use std::io::Read;
        let mut ok = [0u8; 1];
        std::fs::File::from(ready_r).read_exact(&mut ok)?;
        if ok[0] != 1 {
            return Err(io::Error::other("unshare(CLONE_NEWUSER) was refused"));
        }
        Ok(OwnedFd::from(std::fs::File::open(format!(
            "/proc/{pid}/ns/user"
        ))?))
    })();
    drop(go_w);
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    result
}

const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_CMD_RECONFIGURE: libc::c_uint = 7;
const FSPICK_CLOEXEC: libc::c_uint = 1;
const FSPICK_EMPTY_PATH: libc::c_uint = 8;

/// A detached tmpfs of `size` bytes: made here as root; as a plain user by a child that
/// shares our fd table (clone with CLONE_FILES), enters [`holder`]'s user namespace and a
/// mount namespace of its own (fsopen wants CAP_SYS_ADMIN over the mount namespace).
/// Refused before Linux 6.15, whose overlayfs does not take a layer on a detached mount.
fn tmpfs(size: u64) -> Result<OwnedFd, String> {
    if !kernel_at_least(6, 15) {
        return Err("Linux 6.15 or later is needed".into());
    }
    let opt = size_option(size);
    let fd = match holder() {
        None if nix::unistd::geteuid().is_root() => {
            // SAFETY: only fd-returning system calls on NUL-terminated strings.
            unsafe { detached_tmpfs(&opt) }
        }
        None => return Err("no user namespace of its own".into()),
        Some(ns) => in_namespace(ns, &Job::Create(&opt)),
    };
    let fd = RawFd::try_from(fd)
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or_else(|| format!("cannot make a tmpfs: {}", io::Error::last_os_error()))?;
    // SAFETY: the fd was just made (in our fd table) and is ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Bytes of the layer's size per inode it may have: tmpfs charges each inode and every
/// xattr (`user.*` on the overlay's files reach the upper) to an inode space of
/// `nr_inodes` KiB, *not* to `size`; the kernel's default `nr_inodes` (half of RAM's pages)
/// let a command pin about RAM/8 of xattrs past any size. One inode per 4 KiB of size
/// keeps inodes and xattrs within a quarter of the size.
const BYTES_PER_INODE: u64 = 4096;

/// The fewest inodes a sized layer gets (a tiny size still holds a tree of directories).
const MIN_INODES: u64 = 1024;

/// Inodes one unit takes before its command writes anything (its `uN`, the overlay's upper
/// and work directories and what overlayfs makes in the work directory), with room: the
/// layer gets these on top of its size's share ([`fit_units`]), so that a plain user with a
/// few hundred writable siblings of the project's ancestors (one unit each) and a small
/// `outside_size` is not out of inodes (ENOSPC) before the command has written a byte.
const INODES_PER_UNIT: u64 = 8;

/// `n` as a NUL-terminated decimal string for fsconfig, made before any fork.
fn option_text(n: u64) -> [u8; 32] {
    let mut opt = [0u8; 32];
    let t = n.to_string();
    opt[..t.len()].copy_from_slice(t.as_bytes());
    opt
}

/// The inodes of a layer of `size` bytes with `units` units.
fn inodes_for(size: u64, units: u64) -> u64 {
    (size / BYTES_PER_INODE)
        .max(MIN_INODES)
        .saturating_add(units.saturating_mul(INODES_PER_UNIT))
}

/// Give `outside`'s sized layer the inodes its `units` units take on top of its size's
/// share (a tmpfs reconfigure, in the holder's user namespace for a plain user). A layer
/// that is not sized, or a reconfigure that fails, is left as it is (said in the log).
pub(crate) fn fit_units(outside: &Path, units: usize) {
    let list = SIZED.lock().unwrap_or_else(PoisonError::into_inner);
    let Some((_, fd, size)) = list.iter().find(|(p, _, _)| p == outside) else {
        return;
    };
    let inodes = option_text(inodes_for(*size, units as u64));
    let job = Job::Reconfigure(fd.as_raw_fd(), &inodes);
    let rc = match holder() {
        // SAFETY: fd-taking system calls on NUL-terminated strings we own.
        None if nix::unistd::geteuid().is_root() => unsafe { run_job(&job) },
        None => -1,
        Some(ns) => in_namespace(ns, &job),
    };
    if rc < 0 {
        tracing::debug!(
            "the outside layer {} keeps its inodes ({units} units): {}",
            outside.display(),
            io::Error::last_os_error()
        );
    }
}

/// What [`in_namespace`] does there.
enum Job<'a> {
    /// Make a tmpfs ([`detached_tmpfs`]).
    Create(&'a TmpfsOptions),
    /// Set the `nr_inodes` of the tmpfs mounted (detached) at this fd.
    Reconfigure(RawFd, &'a [u8; 32]),
}

/// Do `job` here; an fd (Create), 0 (Reconfigure) or -1. async-signal-safe.
unsafe fn run_job(job: &Job) -> libc::c_long {
    match job {
        Job::Create(opt) => detached_tmpfs(opt),
        Job::Reconfigure(fd, inodes) => {
            let fs = libc::syscall(
                libc::SYS_fspick,
                *fd,
                c"".as_ptr(),
                FSPICK_CLOEXEC | FSPICK_EMPTY_PATH,
            );
            if fs < 0 {
                return -1;
            }
            let ok = set_string(fs, c"nr_inodes", inodes.as_ptr())
                && fs_command(fs, FSCONFIG_CMD_RECONFIGURE);
            libc::close(fs as libc::c_int);
            if ok {
                0
            } else {
                -1
            }
        }
    }
}

/// fsconfig(2)'s FSCONFIG_SET_STRING of `key` to `value` (NUL-terminated) on the fs context
/// `fs`; whether it succeeded. async-signal-safe.
unsafe fn set_string(fs: libc::c_long, key: &std::ffi::CStr, value: *const u8) -> bool {
    libc::syscall(
        libc::SYS_fsconfig,
        fs,
        FSCONFIG_SET_STRING,
        key.as_ptr(),
        value,
        0,
    ) == 0
}

/// fsconfig(2)'s command `cmd` (create, reconfigure) on the fs context `fs`; whether it
/// succeeded. async-signal-safe.
unsafe fn fs_command(fs: libc::c_long, cmd: libc::c_uint) -> bool {
    libc::syscall(
        libc::SYS_fsconfig,
        fs,
        cmd,
        std::ptr::null::<libc::c_char>(),
        std::ptr::null::<libc::c_char>(),
        0,
    ) == 0
}

/// The tmpfs's `size` and `nr_inodes` as fsconfig's NUL-terminated strings, made before
/// any fork (no allocation after).
struct TmpfsOptions {
    size: [u8; 32],
    inodes: [u8; 32],
}

/// [`TmpfsOptions`] for a layer of `size` bytes.
fn size_option(size: u64) -> TmpfsOptions {
    TmpfsOptions {
        size: option_text(size),
        inodes: option_text(inodes_for(size, 0)),
    }
}

/// fsopen + fsconfig + fsmount: the fd of a detached tmpfs sized by `opt` (see
/// [`size_option`]), or -1. async-signal-safe: it allocates nothing.
unsafe fn detached_tmpfs(opt: &TmpfsOptions) -> libc::c_long {
    let fs = libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 1 as libc::c_uint);
    if fs < 0 {
        return -1;
    }
    let ok = set_string(fs, c"size", opt.size.as_ptr())
        && set_string(fs, c"nr_inodes", opt.inodes.as_ptr())
        && set_string(fs, c"mode", c"0755".as_ptr().cast())
        && fs_command(fs, FSCONFIG_CMD_CREATE);
    let m = if ok {
        libc::syscall(libc::SYS_fsmount, fs, FSMOUNT_CLOEXEC, 0 as libc::c_uint)
    } else {
        -1
    };
    libc::close(fs as libc::c_int);
    m
}

/// [`run_job`] in the holder's user namespace (and a mount namespace of its own), by a
/// child sharing our fd table; the fd it made (in our table too), 0 or -1.
fn in_namespace(ns: RawFd, job: &Job) -> libc::c_long {
    let Ok((rd, wr)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return -1;
    };
    // SAFETY: a fork that shares the fd table (no CLONE_VM: the child has its own copy of
    // memory and stack, as after fork); it makes only async-signal-safe system calls.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_FILES | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return -1;
    }
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            let m = if libc::setns(ns, libc::CLONE_NEWUSER) == 0
                && libc::unshare(libc::CLONE_NEWNS) == 0
            {
                run_job(job)
            } else {
                -1
            };
            let b = m.to_ne_bytes();
            libc::write(wr.as_raw_fd(), b.as_ptr().cast(), b.len());
            libc::_exit(0);
        }
    }
    // The fd table is shared: the write end stays open until the child has written (it
    // fits in the pipe) and ended.
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
    drop(wr);
    let mut b = [0u8; 8];
    let got = {
        use std::io::Read;
        std::fs::File::from(rd).read_exact(&mut b).is_ok()
    };
    if got {
        libc::c_long::from_ne_bytes(b)
    } else {
        -1
    }
}

/// Whether the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: uname(2) into a zeroed struct; its release is NUL-terminated.
    let release = unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return false;
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    };
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (Some(a), Some(b)) = (parts.next(), parts.next()) else {
        return false;
    };
    (a, b) >= (major, minor)
}

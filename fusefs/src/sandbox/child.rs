//! The child side of a run: what happens between fork and exec.
//!
//! Everything here runs in a forked copy of a multi-threaded process, so it may only make
//! async-signal-safe system calls on data prepared before the fork: no allocation, no
//! locks, no `nix` helpers that build CStrings. Progress goes to the parent through the
//! report channel (report.rs).

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::report::{self, Stage};
use super::{cstring, RunSpec};

impl Stage {
    /// Context for an error at this stage, in the user's terms.
    pub(crate) fn describe(self, spec: &RunSpec) -> String {
        let (project, mount, cwd) = (
            spec.project.display(),
            spec.mount.display(),
            spec.cwd.display(),
        );
        match self {
            Stage::Setpgid => "creating a process group for the command".into(),
            Stage::Unshare => "creating a private namespace for the command".into(),
            Stage::UserMaps => "mapping our user into a new user namespace".into(),
            Stage::Private => "making the command's mount namespace private".into(),
            Stage::Bind => format!("bind-mounting the branch {mount} over {project}"),
            Stage::Tmp => "mounting a private /tmp".into(),
            Stage::ReadOnly => {
                "making the file system read-only outside the branch (needs Linux 5.12+)".into()
            }
            Stage::Scratch => format!(
                "binding a throw-away cache branch ({})",
                spec.binds
                    .iter()
                    .map(|b| b.target.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Stage::Loopback => "bringing up the loopback interface in the private network".into(),
            Stage::Chdir => format!("entering the working directory {cwd}"),
            Stage::Exec => "starting the command".into(),
        }
    }
}

/// How the child sets itself up.
pub(crate) enum Mode {
    Namespaced(Box<NsPlan>),
    /// No namespace: just enter the working directory translated into the mount.
    Fallback {
        cwd: CString,
    },
}

pub(crate) struct NsPlan {
    project: CString,
    mount: CString,
    cwd: CString,
    /// Set when we are not root: create a user namespace mapping our own ids.
    user_maps: Option<UserMaps>,
    network: bool,
    tmp: Option<TmpPlan>,
    /// Make every mount read-only except the branch, `binds` and the private /tmp.
    read_only: bool,
    /// Writable directories bound over paths outside the project: (source, target).
    binds: Vec<(CString, CString)>,
}

struct UserMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

struct TmpPlan {
    /// The project lies under /tmp: after the tmpfs hides it, recreate its path and
    /// bind the branch there again.
    rebind: bool,
    /// Directories between /tmp and the project, outermost first, to create in the tmpfs.
    mkdirs: Vec<CString>,
}

impl Mode {
    pub(crate) fn namespaced(spec: &RunSpec) -> super::Result<Mode> {
        let euid = nix::unistd::geteuid();
        let user_maps = (!euid.is_root()).then(|| {
            let gid = nix::unistd::getegid();
            UserMaps {
                uid_map: format!("{euid} {euid} 1\n").into_bytes(),
                gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            }
        });
        let tmp = if spec.isolation.private_tmp || spec.isolation.read_only {
            let tmp = Path::new("/tmp");
            let rebind = spec.project.starts_with(tmp);
            let mut mkdirs = Vec::new();
            if rebind {
                let mut dir = PathBuf::from(tmp);
                for part in spec
                    .project
                    .strip_prefix(tmp)
                    .unwrap_or(&spec.project)
                    .components()
                {
                    dir.push(part);
                    mkdirs.push(cstring(&dir)?);
                }
            }
            Some(TmpPlan { rebind, mkdirs })
        } else {
            None
        };
        Ok(Mode::Namespaced(Box::new(NsPlan {
            project: cstring(&spec.project)?,
            mount: cstring(&spec.mount)?,
            cwd: cstring(&spec.cwd)?,
            user_maps,
            network: spec.isolation.network,
            tmp,
            read_only: spec.isolation.read_only,
            binds: spec
                .binds
                .iter()
                .map(|b| Ok((cstring(&b.source)?, cstring(&b.target)?)))
                .collect::<super::Result<_>>()?,
        })))
    }
}

/// Everything the pre-exec hook needs, built before the fork.
pub(crate) struct ChildPlan {
    mode: Mode,
    report_fd: RawFd,
    hand_tty: bool,
    /// Not handed the terminal, but kept in our session ([`RunSpec::user_session`]).
    user_session: bool,
}

impl ChildPlan {
    /// `report` (the child end of the channel) must stay open until the spawn returns.
    pub(crate) fn new(
        mode: Mode,
        report: &OwnedFd,
        hand_tty: bool,
        user_session: bool,
    ) -> ChildPlan {
        ChildPlan {
            mode,
            report_fd: report.as_raw_fd(),
            hand_tty,
            user_session,
        }
    }

    /// The working directory the command will see, for `$PWD`.
    pub(crate) fn cwd_os(&self) -> &OsStr {
        let cwd = match &self.mode {
            Mode::Namespaced(ns) => &ns.cwd,
            Mode::Fallback { cwd } => cwd,
        };
        OsStr::from_bytes(cwd.as_bytes())
    }

    /// Runs in the child after fork, before exec. Async-signal-safe only.
    pub(crate) fn enter(&self) -> io::Result<()> {
        self.stage(Stage::Setpgid);
        if self.hand_tty || self.user_session {
            // SAFETY: plain system calls on prepared data.
            check(unsafe { libc::setpgid(0, 0) })?;
            if self.hand_tty {
                take_tty();
            }
        } else {
            detach_from_terminal()?;
        }
        cloexec_inherited_fds();
        match &self.mode {
            Mode::Namespaced(ns) => self.enter_namespace(ns)?,
            Mode::Fallback { cwd } => {
                self.stage(Stage::Chdir);
                // SAFETY: as above.
                check(unsafe { libc::chdir(cwd.as_ptr()) })?;
            }
        }
        self.stage(Stage::Exec);
        Ok(())
    }

    fn enter_namespace(&self, ns: &NsPlan) -> io::Result<()> {
        let mut flags = libc::CLONE_NEWNS;
        if ns.user_maps.is_some() {
            flags |= libc::CLONE_NEWUSER;
        }
        if ns.network {
            flags |= libc::CLONE_NEWNET;
        }
        self.stage(Stage::Unshare);
        // SAFETY: all calls below are plain system calls on data built before the fork.
        unsafe {
            check(libc::unshare(flags))?;
            if let Some(maps) = &ns.user_maps {
                self.stage(Stage::UserMaps);
                super::write_id_maps(&maps.uid_map, &maps.gid_map)?;
            }
            report::send_mnt_ns(self.report_fd);
            self.stage(Stage::Private);
            // Nothing we mount may propagate back to the real namespace.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            self.stage(Stage::Bind);
            bind(&ns.mount, &ns.project)?;
            if ns.read_only {
                self.stage(Stage::ReadOnly);
                // Binds copy the flags of their source, so the branch (and every scratch
                // bind below) is made writable again after the whole tree went read-only.
                set_read_only(c"/", true)?;
                set_read_only(&ns.project, false)?;
            }
            for (source, target) in &ns.binds {
                self.stage(Stage::Scratch);
                bind(source, target)?;
                if ns.read_only {
                    set_read_only(target, false)?;
                }
            }
            if let Some(tmp) = &ns.tmp {
                self.stage(Stage::Tmp);
                private_tmp(&ns.project, tmp)?;
                if ns.read_only {
                    private_shm()?;
                }
            }
            if ns.network {
                self.stage(Stage::Loopback);
                loopback_up()?;
            }
            self.stage(Stage::Chdir);
            // Only now: a chdir before the bind would leave us on the real tree.
            check(libc::chdir(ns.cwd.as_ptr()))?;
        }
        Ok(())
    }

    fn stage(&self, stage: Stage) {
        report::send_stage(self.report_fd, stage);
    }
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

unsafe fn bind(source: &CStr, target: &CStr) -> io::Result<()> {
    check(libc::mount(
        source.as_ptr(),
        target.as_ptr(),
        std::ptr::null(),
        libc::MS_BIND | libc::MS_REC,
        std::ptr::null(),
    ))
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const AT_RECURSIVE: libc::c_int = 0x8000;

/// Sets or clears read-only on the mount tree rooted at `path` (Linux 5.12+), in one call.
unsafe fn set_read_only(path: &CStr, on: bool) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: if on { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: if on { 0 } else { MOUNT_ATTR_RDONLY },
        propagation: 0,
        userns_fd: 0,
    };
    let ret = libc::syscall(
        libc::SYS_mount_setattr,
        libc::AT_FDCWD,
        path.as_ptr(),
        AT_RECURSIVE,
        &attr as *const MountAttr,
        std::mem::size_of::<MountAttr>(),
    );
    check(if ret == -1 { -1 } else { 0 })
}

/// Shared memory (shm_open, Python's multiprocessing) needs a writable /dev/shm; under a
/// read-only root it gets its own tmpfs, like /tmp. No /dev/shm: nothing to do.
unsafe fn private_shm() -> io::Result<()> {
    let ret = libc::mount(
        c"tmpfs".as_ptr(),
        c"/dev/shm".as_ptr(),
        c"tmpfs".as_ptr(),
        libc::MS_NOSUID | libc::MS_NODEV,
        c"mode=1777".as_ptr().cast(),
    );
    if ret == -1 && *libc::__errno_location() == libc::ENOENT {
        return Ok(());
    }
    check(ret)
}

/// Mounts a fresh tmpfs on /tmp. If the project lives under /tmp the tmpfs hides the
/// branch bound over it, so the bind is reached again through an fd opened beforehand.
unsafe fn private_tmp(project: &CStr, tmp: &TmpPlan) -> io::Result<()> {
    let fd = libc::open(
        project.as_ptr(),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    check(fd)?;
    let result = (|| {
        check(libc::mount(
            c"tmpfs".as_ptr(),
            c"/tmp".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"mode=1777".as_ptr().cast(),
        ))?;
        if tmp.rebind {
            for dir in &tmp.mkdirs {
                if libc::mkdir(dir.as_ptr(), 0o755) == -1
                    && *libc::__errno_location() != libc::EEXIST
                {
                    return Err(io::Error::last_os_error());
                }
            }
            let mut buf = [0u8; 32];
            bind(fd_path(&mut buf, fd), project)?;
        }
        Ok(())
    })();
    libc::close(fd);
    result
}

/// Formats `/proc/self/fd/N` into `buf` without allocating.
fn fd_path(buf: &mut [u8; 32], fd: RawFd) -> &CStr {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
    // The buffer holds exactly one NUL, just written.
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/proc/self/fd/")
}

/// A new network namespace has only `lo`, and it is down.
unsafe fn loopback_up() -> io::Result<()> {
    let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    check(sock)?;
    let mut req: libc::ifreq = std::mem::zeroed();
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    let result = (|| {
        check(libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(libc::ioctl(sock, libc::SIOCSIFFLAGS, &req))
    })();
    libc::close(sock);
    result
}

/// Errors from unshare or the id maps that mean "not allowed here", not "broken".
pub(crate) fn is_no_privileges(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::EPERM
            | Errno::EACCES
            | Errno::EINVAL
            | Errno::ENOSPC
            | Errno::EUSERS
            | Errno::ENOSYS
    )
}

/// In a child before exec, for a command nobody watches (speculation, MCP, lint, language
/// servers, the agent's shell, a `shade run` that is not the terminal's foreground job): a
/// new session of its own, so it has no controlling terminal. Opening `/dev/tty` then fails
/// (ENXIO), and it can neither become a terminal's foreground group (TIOCSPGRP) nor take a
/// terminal that is some session's already (TIOCSCTTY). The session's process group has the
/// child's pid, so killing that group still kills what it started. Async-signal-safe.
pub fn detach_from_terminal() -> io::Result<()> {
    // SAFETY: setsid(2) takes no data.
    check(unsafe { libc::setsid() })
}

/// In a child before exec: every fd above stdio is closed at exec, so the command inherits
/// none of ours, nor any its parent's parent leaked to us (an inherited terminal, a socket);
/// a hook that means to pass an fd on clears its flag afterwards. Async-signal-safe.
pub fn cloexec_inherited_fds() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range(2) and fcntl(2) on fd numbers only.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) == 0 {
            return;
        }
        // Before Linux 5.11: one fd at a time, up to the fd limit (bounded).
        let mut lim: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as libc::c_int
        } else {
            1024
        };
        for fd in 3..max {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags != -1 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// Make `cmd`'s process die with shade, as the very last step before exec (after every
/// namespace and credential change, each of which clears the setting): SIGKILL when the
/// thread that starts it ends, and no exec at all when shade already died during the
/// set-up. bwrap's `--die-with-parent` covers the sandbox only from its own start: a shade
/// killed during the stage (tens of ms of namespaces and mounts) left the command running
/// unwatched, orphaned with its limits and no time limit.
pub(crate) fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl(2) and getppid(2) on plain integers; async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            check(libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// We hand the terminal to the command only if we are its foreground job: otherwise an
/// interactive command in its own process group would be stopped by SIGTTIN.
pub(crate) fn can_hand_tty() -> bool {
    // SAFETY: plain queries on fd 0.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// In the child: make our new process group the terminal's foreground group.
/// SIGTTOU is blocked meanwhile because we are a background group at this point.
pub(crate) fn take_tty() {
    // SAFETY: signal-mask and terminal system calls on stack data.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        libc::tcsetpgrp(0, libc::getpid());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// The terminal as it was when shade handed it to a command: what [`restore_tty`] puts
/// back, whatever the command left (`stty -echo`, raw mode, a killed editor's settings).
#[derive(Clone, Copy)]
pub(crate) struct Handed {
    modes: Option<libc::termios>,
}

/// Whether a foreground command gets the terminal ([`can_hand_tty`]), with the terminal's
/// modes saved to be put back after it.
pub(crate) fn hand_tty(foreground: bool) -> Option<Handed> {
    if !foreground || !can_hand_tty() {
        return None;
    }
    // SAFETY: tcgetattr(3) fills the struct it is given.
    let modes = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        (libc::tcgetattr(0, &mut t) == 0).then_some(t)
    };
    Some(Handed { modes })
}

/// In the parent, after the command: take the terminal's foreground back, and its modes
/// as they were before the command (red team round 9: `stty -echo` outlived it).
pub(crate) fn restore_tty(handed: Option<&Handed>) {
    let Some(handed) = handed else { return };
    // SAFETY: getpgrp(2) cannot fail.
    set_foreground(unsafe { libc::getpgrp() });
    // SAFETY: as in set_foreground; tcsetattr(3) reads the saved struct, the ioctls take
    // no argument, and a failure changes nothing. We are the foreground group again, so
    // no SIGTTOU; blocked anyway in case we are not.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        // What else a command may leave set that outlives it (red team round 10): output
        // suspended (`tcflow(TCOOFF)`: the user's shell hangs writing its prompt, and ^Q
        // does not undo it) and exclusive mode (TIOCEXCL: every later open of the terminal
        // fails with EBUSY but for root). Output first: nothing below waits for it.
        libc::tcflow(0, libc::TCOON);
        libc::ioctl(0, libc::TIOCNXCL);
        if let Some(modes) = &handed.modes {
            libc::tcsetattr(0, libc::TCSANOW, modes);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Take the terminal's foreground back (the command was stopped: the user's shell will
/// see to its modes, and the command's own on `fg`).
pub(crate) fn take_back_foreground() {
    // SAFETY: getpgrp(2) cannot fail.
    set_foreground(unsafe { libc::getpgrp() });
}

/// Makes `pgid` the terminal's foreground group; SIGTTOU is blocked meanwhile because the
/// caller may be in a background group.
pub(crate) fn set_foreground(pgid: libc::pid_t) {
    // SAFETY: signal-mask and terminal system calls on stack data.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        libc::tcsetpgrp(0, pgid);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

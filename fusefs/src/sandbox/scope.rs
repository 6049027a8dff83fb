//! Landlock scopes (Linux 6.12+, Landlock ABI 6): a confined command may not connect to an
//! abstract unix socket made outside its sandbox (X11's `@/tmp/.X11-unix/X0`, a session
//! bus, a tmux or IDE helper listening on one), nor signal a process outside it. Abstract
//! sockets have no file, so no mount hides them: where the command shares the host's
//! network namespace (`shade run` without `--no-network`), only this closes them.
//!
//! Only scopes are asked for (no file system or network rules): the domain does not stop
//! bwrap from mounting, and it holds for every process of the sandbox, across exec.
//! Where the kernel lacks scopes, commands run without them and `shade doctor` says so.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version.
const CREATE_RULESET_VERSION: libc::c_uint = 1;
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`.
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;
/// `LANDLOCK_SCOPE_SIGNAL`.
const SCOPE_SIGNAL: u64 = 2;
/// The first ABI with scopes.
pub(crate) const SCOPES_ABI: i64 = 6;

/// `struct landlock_ruleset_attr` as of ABI 6.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// The kernel's Landlock ABI version; 0 where Landlock is missing or disabled.
pub fn abi() -> i64 {
    // SAFETY: landlock_create_ruleset(2) with a null attr and the version flag only
    // returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    v.max(0)
}

/// A ruleset that scopes abstract unix sockets and signals, made once and applied in each
/// command's pre-exec hook ([`restrict`]); `None` where the kernel has no scopes.
pub(crate) fn ruleset() -> Option<OwnedFd> {
    if abi() < SCOPES_ABI {
        return None;
    }
    let attr = RulesetAttr {
        handled_access_fs: 0,
        handled_access_net: 0,
        scoped: SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
    };
    // SAFETY: landlock_create_ruleset(2) reads `attr` (its size given) and returns an fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the fd was just made and is ours; close-on-exec already (Landlock sets it).
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// In the pre-exec hook (async-signal-safe): the calling process and all it starts enter
/// the scoped domain of `ruleset`. Sets no_new_privs first (Landlock wants it, or
/// CAP_SYS_ADMIN; bwrap sets it anyway).
pub(crate) fn restrict(ruleset: RawFd) -> std::io::Result<()> {
    // SAFETY: prctl(2) and landlock_restrict_self(2) on an fd we hold.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

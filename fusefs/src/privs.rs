//! Dropping setuid/setgid bits when a file changes, as a local file system does.
//!
//! The mount asks for `FUSE_HANDLE_KILLPRIV_V2`: the kernel then stops checking
//! `security.capability` before every write (one GETXATTR round trip per write) and leaves
//! clearing the bits to us. Its rules, which we follow:
//! - a write by a process without `CAP_FSETID` arrives flagged `FUSE_WRITE_KILL_SUIDGID`;
//! - a truncate by such a process (fuser does not pass the setattr flag, so we ask
//!   `/proc/PID/status` ourselves, only when the file has a bit to lose);
//! - a chown of a non-directory, by anyone.
//!
//! What is dropped: setuid, the `security.capability` attribute, and setgid as `kill`
//! says.

use crate::node::Meta;
use std::ffi::OsStr;

const CAP_FSETID: u32 = 4;

/// Who changes a file, as FUSE tells us.
#[derive(Clone, Copy)]
pub(crate) struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// The id shift of the branch: `/proc` shows the caller's groups in host ids.
    pub shift: Option<crate::idmap::IdShift>,
}

/// Whether `m` has anything a kill could drop.
pub(crate) fn has_privs(m: &Meta) -> bool {
    m.perm & (libc::S_ISUID | libc::S_ISGID) != 0
        || m.xattrs.contains_key(OsStr::new("security.capability"))
}

/// Drop setuid, file capabilities and setgid from `m` as the kernel's
/// `setattr_should_drop_suidgid` does: setgid goes when group-execute is set, or (a
/// mandatory-locking mark otherwise) when `caller` is neither in the file's group nor
/// holds CAP_FSETID.
pub(crate) fn kill(m: &mut Meta, caller: Caller) {
    if !has_privs(m) {
        return;
    }
    let drop_sgid = m.perm & libc::S_ISGID != 0
        && (m.perm & libc::S_IXGRP != 0 || !in_group_or_capable(caller, m.gid));
    m.perm &= !libc::S_ISUID;
    if drop_sgid {
        m.perm &= !libc::S_ISGID;
    }
    m.xattrs.remove(OsStr::new("security.capability"));
    m.changed();
}

/// What `/proc/PID/status` says of a process: effective capabilities and groups.
fn status(pid: u32) -> Option<(u64, Vec<u32>)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let caps = s
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    let groups = s
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Some((caps, groups))
}

/// Whether `caller` holds CAP_FSETID (may keep setuid bits on a file it changes). If the
/// process is gone, root is assumed to hold it and everyone else not.
pub(crate) fn may_keep(caller: Caller) -> bool {
    match status(caller.pid) {
        Some((caps, _)) => caps & (1 << CAP_FSETID) != 0,
        None => caller.uid == 0,
    }
}

fn in_group_or_capable(caller: Caller, gid: u32) -> bool {
    if caller.gid == gid {
        return true;
    }
    match status(caller.pid) {
        Some((caps, groups)) => {
            caps & (1 << CAP_FSETID) != 0
                || groups
                    .iter()
                    .any(|g| crate::idmap::take(caller.shift, *g) == Some(gid))
        }
        None => caller.uid == 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_follows_the_local_rules() {
        let mut m = Meta::new(0o6755, 0, 0);
        m.xattrs.insert("security.capability".into(), vec![1, 2, 3]);
        m.xattrs.insert("user.keep".into(), vec![1]);
        let me = Caller {
            pid: std::process::id(),
            uid: 0,
            gid: 0,
            shift: None,
        };
        kill(&mut m, me);
        assert_eq!(m.perm, 0o755);
        assert!(!m.xattrs.contains_key(OsStr::new("security.capability")));
        assert!(m.xattrs.contains_key(OsStr::new("user.keep")));
        // setgid without group-execute is a locking mark: kept for a member of the group.
        let mut m = Meta::new(0o6745, 0, 0);
        kill(&mut m, me);
        assert_eq!(m.perm, 0o2745);
    }

    #[test]
    fn this_process_is_judged_by_its_capabilities() {
        let me = Caller {
            pid: std::process::id(),
            uid: 1000,
            gid: 1000,
            shift: None,
        };
        assert_eq!(may_keep(me), nix::unistd::geteuid().is_root());
    }
}

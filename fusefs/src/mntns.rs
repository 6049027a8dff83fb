//! Which mount namespaces hold a mount of a given file system, asked of the mounts
//! themselves (Linux 6.11+): every mount namespace in turn (`NS_MNT_GET_NEXT`/`PREV` on an
//! nsfs fd), its mounts (`listmount`) and each one's superblock (`statmount`).
//!
//! Why not `/proc/*/mountinfo`: a namespace need not have a process in it. One kept alive
//! by a bind mount of its nsfs file (`unshare -m --mount=FILE true`) holds copies of every
//! mount that existed when it was made, and `nsenter --mount=FILE` reaches them later; a
//! scan of processes never sees it. The kernel's list of namespaces does.
//!
//! The walk needs `CAP_SYS_ADMIN` over every namespace on the machine: the kernel ends it
//! with `EPERM` at the first one it may not show (it does not skip). So it answers for
//! root; for anyone else, or on an older kernel, it says it cannot and the caller looks
//! through `/proc` instead.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ioctl` on an nsfs fd of a mount namespace: `_IOR(0xb7, nr, struct mnt_ns_info)`.
const fn ns_ioctl(nr: u64) -> u64 {
    (2 << 30) | ((std::mem::size_of::<MntNsInfo>() as u64) << 16) | (0xb7 << 8) | nr
}
const NS_MNT_GET_INFO: u64 = ns_ioctl(10);
const NS_MNT_GET_NEXT: u64 = ns_ioctl(11);
const NS_MNT_GET_PREV: u64 = ns_ioctl(12);

/// The same number on every architecture (the generic system call table, Linux 6.8+).
const SYS_STATMOUNT: libc::c_long = 457;
const SYS_LISTMOUNT: libc::c_long = 458;
/// `listmount` from the namespace's root mount.
const LSMT_ROOT: u64 = u64::MAX;
/// `statmount`: the superblock's device, type and flags.
const STATMOUNT_SB_BASIC: u64 = 1;

/// `struct mnt_ns_info` (uapi/linux/nsfs.h).
#[repr(C)]
#[derive(Default)]
struct MntNsInfo {
    size: u32,
    nr_mounts: u32,
    mnt_ns_id: u64,
}

/// `struct mnt_id_req`, second version (with the namespace's id).
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
    mnt_ns_id: u64,
}

/// The head of `struct statmount` up to the superblock's device, with room for the rest
/// of the fixed part (the kernel copies at most the buffer's size).
#[repr(C)]
struct StatmountHead {
    size: u32,
    mnt_opts: u32,
    mask: u64,
    sb_dev_major: u32,
    sb_dev_minor: u32,
    rest: [u64; 64],
}

impl Default for StatmountHead {
    fn default() -> Self {
        StatmountHead {
            size: 0,
            mnt_opts: 0,
            mask: 0,
            sb_dev_major: 0,
            sb_dev_minor: 0,
            rest: [0; 64],
        }
    }
}

/// How many mounts of the file system with device (0, `minor`) each mount namespace on the
/// machine holds, ours first, as `(namespace id, count, ours)` for those with any;
/// `None` when the kernel cannot list them all for us (see the module's text).
pub(crate) fn mounts_of(minor: u32) -> Option<Vec<(u64, usize, bool)>> {
    let ours = std::fs::File::open("/proc/self/ns/mnt").ok()?;
    let ours = OwnedFd::from(ours);
    let mut info = MntNsInfo {
        size: std::mem::size_of::<MntNsInfo>() as u32,
        ..Default::default()
    };
    // SAFETY: NS_MNT_GET_INFO fills a `mnt_ns_info` of the size we say.
    let rc = unsafe { libc::ioctl(ours.as_raw_fd(), NS_MNT_GET_INFO as _, &mut info) };
    if rc != 0 {
        return None;
    }
    let mut ids = vec![info.mnt_ns_id];
    for op in [NS_MNT_GET_PREV, NS_MNT_GET_NEXT] {
        let mut at: Option<OwnedFd> = None;
        loop {
            let fd = at.as_ref().map_or(ours.as_raw_fd(), AsRawFd::as_raw_fd);
            let mut next = MntNsInfo {
                size: std::mem::size_of::<MntNsInfo>() as u32,
                ..Default::default()
            };
            // SAFETY: the ioctl fills `next` and returns a new fd of that namespace.
            let rc = unsafe { libc::ioctl(fd, op as _, &mut next) };
            if rc < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    // The end of the list.
                    Some(libc::ENOENT) => break,
                    // One we may not see (the walk cannot go past it), or no such ioctl.
                    _ => return None,
                }
            }
            // SAFETY: a new fd the kernel just gave us.
            at = Some(unsafe { OwnedFd::from_raw_fd(rc) });
            ids.push(next.mnt_ns_id);
        }
    }
    let mut out = Vec::new();
    for (i, ns) in ids.into_iter().enumerate() {
        let n = mounts_in(ns, minor)?;
        if n > 0 {
            out.push((ns, n, i == 0));
        }
    }
    Some(out)
}

/// How many mounts of device (0, `minor`) namespace `ns` holds; `None` if it cannot say.
fn mounts_in(ns: u64, minor: u32) -> Option<usize> {
    let mut ids = vec![0u64; 1024];
    let n = loop {
        let req = MntIdReq {
            size: std::mem::size_of::<MntIdReq>() as u32,
            spare: 0,
            mnt_id: LSMT_ROOT,
            param: 0,
            mnt_ns_id: ns,
        };
        // SAFETY: listmount writes at most `ids.len()` mount ids into `ids`.
        let n = unsafe {
            libc::syscall(
                SYS_LISTMOUNT,
                &req as *const MntIdReq,
                ids.as_mut_ptr(),
                ids.len(),
                0u32,
            )
        };
        match usize::try_from(n) {
            Ok(n) if n < ids.len() => break n,
            Ok(_) if ids.len() < 1 << 20 => ids.resize(ids.len() * 4, 0),
            Ok(_) => return None,
            // Gone since we listed it: it holds nothing now.
            Err(_) if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) => {
                return Some(0)
            }
            Err(_) => return None,
        }
    };
    let mut count = 0;
    for &id in &ids[..n] {
        let req = MntIdReq {
            size: std::mem::size_of::<MntIdReq>() as u32,
            spare: 0,
            mnt_id: id,
            param: STATMOUNT_SB_BASIC,
            mnt_ns_id: ns,
        };
        let mut head = StatmountHead::default();
        // SAFETY: statmount writes at most the buffer size we give it.
        let rc = unsafe {
            libc::syscall(
                SYS_STATMOUNT,
                &req as *const MntIdReq,
                &mut head as *mut StatmountHead,
                std::mem::size_of::<StatmountHead>(),
                0u32,
            )
        };
        if rc != 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                // Unmounted, or its namespace gone, since the listing.
                Some(libc::ENOENT) => continue,
                // EOVERFLOW would mean strings asked for; anything else: cannot say.
                _ => return None,
            }
        }
        if head.mask & STATMOUNT_SB_BASIC != 0
            && head.sb_dev_major == 0
            && head.sb_dev_minor == minor
        {
            count += 1;
        }
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As root on Linux 6.11+, our own namespace's root file system is listed as ours.
    #[test]
    fn finds_the_root_file_system_in_our_namespace() {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata("/proc").map(|m| m.dev()).unwrap_or(0);
        // /proc is an anonymous-device file system (major 0) on every Linux.
        assert_eq!(libc::major(dev), 0);
        let Some(found) = mounts_of(libc::minor(dev)) else {
            // Not root, or an older kernel: the caller falls back to /proc. The suite runs
            // as root on 6.11+ (CI), where this must answer.
            assert!(
                nix::unistd::geteuid().as_raw() != 0,
                "root could not list mount namespaces"
            );
            return;
        };
        assert!(
            found.iter().any(|&(_, n, ours)| ours && n >= 1),
            "{found:?}"
        );
    }
}

//! The host ids a confined command runs as when shade runs as root.
//!
//! The command is root of a user namespace that maps `0..65536` to `B..B+65536`; `B` is
//! an unprivileged host id range nobody else uses, so the command's root is nobody on the
//! host, and the branch shows its files shifted by `B` (`crate::idmap`).

use crate::idmap::RANGE;

/// Start of the host id range a confined command's ids map to: `SHADE_SANDBOX_IDS` (a
/// number) if set, else the `shade` entry of /etc/subuid, else the highest 65536-aligned
/// start below 2^31 that collides with no id in /etc/passwd, /etc/group, /etc/subuid and
/// /etc/subgid.
pub fn sandbox_base() -> u32 {
    static BASE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *BASE.get_or_init(find_base)
}

fn find_base() -> u32 {
    if let Some(b) = std::env::var("SHADE_SANDBOX_IDS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        return b;
    }
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    if let Some(b) = sub_entry(&subuid, "shade") {
        return b;
    }
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for f in ["/etc/passwd", "/etc/group"] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in text.lines() {
            if let Some(id) = line.split(':').nth(2).and_then(|v| v.parse::<u64>().ok()) {
                taken.push((id, id + 1));
            }
        }
    }
    for f in ["/etc/subuid", "/etc/subgid"] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in text.lines() {
            let mut parts = line.split(':').skip(1);
            let start = parts.next().and_then(|v| v.parse::<u64>().ok());
            let count = parts.next().and_then(|v| v.parse::<u64>().ok());
            if let (Some(s), Some(c)) = (start, count) {
                taken.push((s, s + c));
            }
        }
    }
    free_start(&taken)
}

/// The start of `name`'s range in a subuid file, if it has one at least 65536 long.
fn sub_entry(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut parts = line.split(':');
        if parts.next()? != name {
            return None;
        }
        let start = parts.next()?.trim().parse::<u32>().ok()?;
        let count = parts.next()?.trim().parse::<u32>().ok()?;
        (count >= RANGE).then_some(start)
    })
}

/// The highest 65536-aligned start below 2^31 whose range overlaps no `[from, to)` range.
fn free_start(taken: &[(u64, u64)]) -> u32 {
    let range = u64::from(RANGE);
    let mut start = (1u64 << 31) - range;
    while start >= range {
        let end = start + range;
        if !taken.iter().any(|&(a, b)| a < end && start < b) {
            return start as u32;
        }
        start -= range;
    }
    // Every aligned range is used: the top one, as the rule's last resort.
    ((1u64 << 31) - range) as u32
}

/// One per-user-namespace limit (`/proc/sys/user/NAME`) and the value a sandbox's own
/// namespace gets, as written (decimal, newline).
pub(crate) type NsLimit = (std::ffi::CString, Vec<u8>);

/// The limits of the sandbox's own user namespace: the kernel charges inotify instances
/// and watches, fanotify groups and marks, and namespaces per user *and up the namespace
/// tree*, so without a limit of its own a command takes all of its user's (the user's
/// editors and file watchers on the host then get EMFILE). Each is set to a quarter of the
/// host's (inotify, fanotify) or to a handful (namespaces: bwrap makes one of each;
/// `shared`, root's one namespace for every command of the process, gets more). Computed
/// before the fork; written by [`write_limits`] inside the namespace.
pub(crate) fn userns_limits(shared: bool) -> Vec<NsLimit> {
    let host = |name: &str, fallback: u64| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/user/{name}"))
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(fallback)
    };
    let namespaces: u64 = if shared { 512 } else { 8 };
    let mut out = Vec::new();
    for (name, value) in [
        (
            "max_inotify_instances",
            (host("max_inotify_instances", 128) / 8).max(8),
        ),
        (
            "max_inotify_watches",
            (host("max_inotify_watches", 8192) / 8).max(1024),
        ),
        (
            "max_fanotify_groups",
            (host("max_fanotify_groups", 128) / 8).max(1),
        ),
        (
            "max_fanotify_marks",
            (host("max_fanotify_marks", 8192) / 8).max(1024),
        ),
        // bwrap's, and the one that owns the command's IPC namespace (see ipc.rs).
        ("max_user_namespaces", if shared { namespaces } else { 3 }),
        ("max_mnt_namespaces", namespaces),
        ("max_pid_namespaces", namespaces),
        ("max_ipc_namespaces", namespaces),
        ("max_net_namespaces", namespaces),
        ("max_uts_namespaces", namespaces),
        ("max_cgroup_namespaces", namespaces),
        ("max_time_namespaces", namespaces),
    ] {
        if let Ok(path) = std::ffi::CString::new(format!("/proc/sys/user/{name}")) {
            out.push((path, format!("{value}\n").into_bytes()));
        }
    }
    out
}

/// Writes `limits` in the current user namespace (its creator, with its capabilities);
/// a limit this kernel does not have (no file) is skipped; the inotify ones must hold.
///
/// # Safety
/// Async-signal-safe (open, write, close): callable between fork and exec.
pub(crate) unsafe fn write_limits(limits: &[NsLimit]) -> std::io::Result<()> {
    for (path, value) in limits {
        match super::write_file(path, value) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            other => other?,
        }
    }
    Ok(())
}

/// A plain user's command: a user namespace of its own (our ids mapped to themselves),
/// made in the pre-exec hook, with [`userns_limits`] set, that bwrap's namespace is made
/// in. Its limits bound everything the command does below it.
///
/// # Safety
/// Async-signal-safe; between fork and exec.
pub(crate) unsafe fn own_userns(
    uid_map: &[u8],
    gid_map: &[u8],
    limits: &[NsLimit],
) -> std::io::Result<()> {
    if libc::unshare(libc::CLONE_NEWUSER) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // shade is not dumpable, which leaves /proc/self's files to root.
    libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
    super::write_id_maps(uid_map, gid_map)?;
    write_limits(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_a_free_aligned_range() {
        let top = (1u64 << 31) - 65536;
        assert_eq!(u64::from(free_start(&[])), top);
        assert_eq!(u64::from(free_start(&[(top + 5, top + 6)])), top - 65536);
        assert_eq!(sub_entry("shade:100000:65536\n", "shade"), Some(100000));
        assert_eq!(sub_entry("shade:100000:10\n", "shade"), None);
        assert_eq!(sub_entry("other:1:65536\n", "shade"), None);
    }
}

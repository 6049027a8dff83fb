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

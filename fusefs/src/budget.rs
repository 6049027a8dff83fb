//! What one branch may hold: a budget for its file contents (memory and disk together)
//! and one for the metadata shade keeps in its own memory for it (new entries, symlink
//! targets, extended attributes), so that whatever a command writes, the branch's disk use
//! and the FUSE daemon's memory stay bounded. A write past a budget fails with ENOSPC and
//! the hit is remembered, to be reported in one line ([`LimitHit`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::units::format_size;

/// The largest extended attribute value a branch stores (the kernel's `XATTR_SIZE_MAX`).
pub const XATTR_VALUE_MAX: usize = 64 << 10;
/// The longest extended attribute name a branch stores (the kernel's `XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// What the daemon's memory holds for one entry of the override layer besides its path:
/// the slot, its place in the parent's child set, the inode record, the node.
const SLOT_COST: u64 = 320;
/// The metadata budget when nobody sets one: the daemon stays bounded anyway.
pub const DEFAULT_METADATA: u64 = 1 << 30;

/// Limits of one branch; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchLimits {
    /// Bytes of file contents the branch may hold (copied-up and new files, in memory or
    /// spilled to its disk store), counted at their size.
    pub size: Option<u64>,
    /// Bytes of metadata in shade's memory: new entries (with their paths), symlink
    /// targets and extended attributes.
    pub metadata: Option<u64>,
}

impl Default for BranchLimits {
    fn default() -> Self {
        BranchLimits {
            size: None,
            metadata: Some(DEFAULT_METADATA),
        }
    }
}

/// A limit a command ran into, said in one line by its `Display`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    /// The branch's contents budget (bytes).
    BranchSize(u64),
    /// The branch's metadata budget (bytes).
    BranchMetadata(u64),
    /// The process limit (count).
    Processes(u32),
    /// The private /tmp's size (bytes).
    Tmp(u64),
    /// The private /dev/shm's size (bytes).
    Shm(u64),
    /// The time limit.
    Time(Duration),
    /// The branch's outside layer's size (bytes).
    Outside(u64),
    /// The command's memory limit (bytes): the OOM killer ended one of its processes.
    Memory(u64),
}

impl std::fmt::Display for LimitHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitHit::BranchSize(b) => write!(
                f,
                "the command reached the branch's {} limit",
                format_size(*b)
            ),
            LimitHit::BranchMetadata(b) => write!(
                f,
                "the command reached the branch's {} limit on metadata (new entries, links, \
                 symlinks, extended attributes)",
                format_size(*b)
            ),
            LimitHit::Processes(n) => write!(f, "the command reached its {n}-process limit"),
            LimitHit::Tmp(b) => write!(f, "the command reached /tmp's {} limit", format_size(*b)),
            LimitHit::Outside(b) => write!(
                f,
                "the command reached the branch's {} limit on writes outside the project",
                format_size(*b)
            ),
            LimitHit::Memory(b) => write!(
                f,
                "the command reached its {} memory limit",
                format_size(*b)
            ),
            LimitHit::Shm(b) => write!(
                f,
                "the command reached /dev/shm's {} limit",
                format_size(*b)
            ),
            LimitHit::Time(d) => write!(f, "the command reached its {} s time limit", {
                let s = d.as_secs_f64();
                if s.fract() == 0.0 {
                    format!("{s:.0}")
                } else {
                    format!("{s:.1}")
                }
            }),
        }
    }
}

/// One branch's budgets and what is used of them.
#[derive(Debug)]
pub(crate) struct Budget {
    limits: BranchLimits,
    /// Bytes of file contents held (reserved at each content's largest size).
    size_used: AtomicU64,
    /// Bytes of extended attributes the branch set (entries are counted by the tree).
    xattr_used: AtomicU64,
    size_hit: AtomicBool,
    metadata_hit: AtomicBool,
}

fn no_space() -> i32 {
    libc::ENOSPC
}

impl Budget {
    pub fn new(limits: BranchLimits) -> Budget {
        Budget {
            limits,
            size_used: AtomicU64::new(0),
            xattr_used: AtomicU64::new(0),
            size_hit: AtomicBool::new(false),
            metadata_hit: AtomicBool::new(false),
        }
    }

    /// Take `bytes` of the contents budget, or ENOSPC (remembered as a hit).
    pub fn charge_size(&self, bytes: u64) -> Result<(), i32> {
        if charge(&self.size_used, bytes, self.limits.size) {
            Ok(())
        } else {
            self.size_hit.store(true, Ordering::Relaxed);
            Err(no_space())
        }
    }

    /// Give `bytes` of the contents budget back.
    pub fn release_size(&self, bytes: u64) {
        release(&self.size_used, bytes);
    }

    /// Bytes of file contents held now.
    pub fn size_used(&self) -> u64 {
        self.size_used.load(Ordering::Relaxed)
    }

    /// Whether an entry at `rel` fits besides the tree's `slot_bytes`; ENOSPC otherwise.
    pub fn room_for_entry(&self, slot_bytes: u64, rel: &Path, extra: u64) -> Result<(), i32> {
        let Some(limit) = self.limits.metadata else {
            return Ok(());
        };
        let want = slot_bytes
            .saturating_add(self.xattr_used.load(Ordering::Relaxed))
            .saturating_add(slot_cost(rel, extra));
        if want > limit {
            self.metadata_hit.store(true, Ordering::Relaxed);
            return Err(no_space());
        }
        Ok(())
    }

    /// An extended attribute `name` set to `value` where it had `old` bytes of value
    /// (`None`: it is new): the kernel's size rules first (E2BIG, ERANGE), then the
    /// metadata budget besides the tree's `slot_bytes` (ENOSPC). Charges on success.
    pub fn set_xattr(
        &self,
        slot_bytes: u64,
        name: &[u8],
        value: &[u8],
        old: Option<usize>,
    ) -> Result<(), i32> {
        if value.len() > XATTR_VALUE_MAX {
            return Err(libc::E2BIG);
        }
        if name.len() > XATTR_NAME_MAX || name.is_empty() {
            return Err(libc::ERANGE);
        }
        let new = (name.len() + value.len()) as u64;
        let old = old.map_or(0, |v| (name.len() + v) as u64);
        if new <= old {
            release(&self.xattr_used, old - new);
            return Ok(());
        }
        let limit = self
            .limits
            .metadata
            .map(|l| l.saturating_sub(slot_bytes.min(l)));
        if charge(&self.xattr_used, new - old, limit) {
            Ok(())
        } else {
            self.metadata_hit.store(true, Ordering::Relaxed);
            Err(no_space())
        }
    }

    /// An extended attribute of `name` with `value_len` bytes of value was removed.
    pub fn removed_xattr(&self, name: &[u8], value_len: usize) {
        release(&self.xattr_used, (name.len() + value_len) as u64);
    }

    /// The limits reached since the last call, forgotten once said.
    pub fn take_hits(&self) -> Vec<LimitHit> {
        let mut hits = Vec::new();
        if self.size_hit.swap(false, Ordering::Relaxed) {
            if let Some(b) = self.limits.size {
                hits.push(LimitHit::BranchSize(b));
            }
        }
        if self.metadata_hit.swap(false, Ordering::Relaxed) {
            if let Some(b) = self.limits.metadata {
                hits.push(LimitHit::BranchMetadata(b));
            }
        }
        hits
    }

    /// The limits this budget enforces.
    pub fn limits(&self) -> BranchLimits {
        self.limits
    }
}

/// What an entry of the override layer at `rel` costs the daemon's memory (its path is
/// kept in the slot map, the inode map and the inode's target), plus `extra` bytes (a
/// symlink's target).
pub(crate) fn slot_cost(rel: &Path, extra: u64) -> u64 {
    SLOT_COST + 3 * rel.as_os_str().len() as u64 + extra
}

/// Add `bytes` to `used` unless that passes `limit`.
fn charge(used: &AtomicU64, bytes: u64, limit: Option<u64>) -> bool {
    let mut cur = used.load(Ordering::Relaxed);
    loop {
        let next = cur.saturating_add(bytes);
        if limit.is_some_and(|l| next > l) {
            return false;
        }
        match used.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

fn release(used: &AtomicU64, bytes: u64) {
    let _ = used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
        Some(c.saturating_sub(bytes))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contents_budget_refuses_past_its_limit_and_says_so_once() {
        let b = Budget::new(BranchLimits {
            size: Some(1000),
            metadata: None,
        });
        assert_eq!(b.charge_size(600), Ok(()));
        assert_eq!(b.charge_size(500), Err(libc::ENOSPC));
        b.release_size(600);
        assert_eq!(b.charge_size(1000), Ok(()));
        assert_eq!(b.take_hits(), [LimitHit::BranchSize(1000)]);
        assert!(b.take_hits().is_empty());
    }

    #[test]
    fn xattrs_follow_the_kernel_rules_then_the_metadata_budget() {
        let b = Budget::new(BranchLimits {
            size: None,
            metadata: Some(200 << 10),
        });
        assert_eq!(
            b.set_xattr(0, b"user.a", &vec![0; XATTR_VALUE_MAX + 1], None),
            Err(libc::E2BIG)
        );
        assert_eq!(b.set_xattr(0, &[b'a'; 256], b"v", None), Err(libc::ERANGE));
        let v = vec![0; XATTR_VALUE_MAX];
        assert_eq!(b.set_xattr(0, b"user.1", &v, None), Ok(()));
        assert_eq!(b.set_xattr(0, b"user.2", &v, None), Ok(()));
        // Replacing a value costs only the difference.
        assert_eq!(b.set_xattr(0, b"user.2", &v, Some(v.len())), Ok(()));
        assert_eq!(b.set_xattr(0, b"user.3", &v, None), Ok(()));
        assert_eq!(b.set_xattr(0, b"user.4", &v, None), Err(libc::ENOSPC));
        b.removed_xattr(b"user.3", v.len());
        assert_eq!(b.set_xattr(0, b"user.4", &v, None), Ok(()));
        assert_eq!(b.take_hits(), [LimitHit::BranchMetadata(200 << 10)]);
    }

    #[test]
    fn hits_are_said_in_one_line() {
        assert_eq!(
            LimitHit::BranchSize(1 << 30).to_string(),
            "the command reached the branch's 1 GiB limit"
        );
        assert_eq!(
            LimitHit::Processes(512).to_string(),
            "the command reached its 512-process limit"
        );
        assert_eq!(
            LimitHit::Tmp(512 << 20).to_string(),
            "the command reached /tmp's 512 MiB limit"
        );
        assert_eq!(
            LimitHit::Time(Duration::from_secs(300)).to_string(),
            "the command reached its 300 s time limit"
        );
    }
}

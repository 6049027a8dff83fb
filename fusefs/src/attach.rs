//! A branch that holds no FUSE connection while idle (issue 31, scale): [`crate::Branch::detach`]
//! parks its connection (`reset.rs`: the kernel drops what the branch changed, the
//! connection serves the unchanged project) and keeps only the branch's own state — its
//! slots, store, reads; no inode table, no descriptor, no thread. [`crate::Branch::attach`]
//! takes a connection again (a pooled one, or a new mount) and makes the kernel's view of
//! it this branch's.
//!
//! The crux is the inode numbers. The kernel keys what it cached by node id, and the
//! connection's numbers were given by other branches. The branch therefore adopts the
//! connection's table ([`Tree::adopt`]), never the other way round:
//! - a number the kernel holds for a lower object at a path this branch shows unchanged
//!   (no slot at it or above it that redirects it) keeps standing for that object: the
//!   kernel's dentry, attributes and pages of it are right for this branch too;
//! - every other number the kernel holds — the previous branches' objects, lower objects
//!   at paths this branch changed, lower numbers this branch's objects took (copy-up) —
//!   is invalidated (attributes and pages) and its entries dropped; it answers as an
//!   unlinked object, unless it is one of this branch's own objects (the branch was on
//!   this connection before and the kernel never forgot the number), which it becomes
//!   again;
//! - every path this branch has a slot at has its entry dropped (a negative entry the
//!   kernel cached for a name the branch created, a positive one for a name it deleted),
//!   and its parent's attributes and listing too.
//!
//! Branch-range numbers are unique in the process (`tree.rs`), so a number this branch
//! gave its own objects was never any other branch's object; lower numbers mean the same
//! lower object in every tree of the project (the device table is shared).

use crate::lower::Lower;
use crate::overlay::{attr, empty_dir_attr};
use crate::reset::Reset;
use crate::tree::{split, Entry, InodeTarget, Obj, Tree, BRANCH_INOS};
use rustc_hash::FxHashSet;
use std::path::{Path, PathBuf};

impl Tree {
    /// Forget what a connection's kernel held of this branch (its table went to the
    /// connection's parked overlay, `Overlay::successor`): lower files kept open for
    /// unlinked inodes go with it.
    pub(crate) fn forget_kernel(&mut self) {
        // Replaced, not cleared: a cleared table keeps its capacity.
        self.orphans = Default::default();
        self.inodes = Default::default();
        self.path_ino = Default::default();
    }

    /// Take `kernel` (the inode table a connection's kernel holds now: a parked overlay's,
    /// or a new mount's) as this branch's, and say what the kernel must drop so that it
    /// shows exactly this branch (see the module doc).
    pub(crate) fn adopt(&mut self, kernel: Tree, lower: &Lower) -> Reset {
        let Tree {
            mut inodes,
            mut path_ino,
            orphans,
            ..
        } = kernel;
        let mut reset = Reset::default();
        let redirects: FxHashSet<PathBuf> = self
            .slots
            .iter()
            .filter(|(p, slot)| match &slot.entry {
                Entry::Dir(d) => d.lower.as_deref() != Some(p.as_path()),
                _ => true,
            })
            .map(|(p, _)| p.clone())
            .collect();
        let slots = &self.slots;
        let pristine = |p: &Path| {
            !slots.contains_key(p) && !p.ancestors().skip(1).any(|a| redirects.contains(a))
        };
        let mut stale: Vec<PathBuf> = slots.keys().cloned().collect();
        for (&ino, inode) in inodes.iter_mut() {
            if ino == 1 {
                continue;
            }
            let keep = match &inode.target {
                InodeTarget::Path(p) => {
                    ino & BRANCH_INOS == 0 && !self.is_claimed(ino) && pristine(p)
                }
                _ => false,
            };
            if keep {
                continue;
            }
            reset.inodes.push(ino);
            if let InodeTarget::Path(p) = &inode.target {
                stale.push(p.clone());
                inode.target = InodeTarget::Gone(Box::new(unlinked(lower, ino, p)));
            }
        }
        for p in &stale {
            if p.as_os_str().is_empty() {
                reset.inodes.push(1);
                continue;
            }
            let (parent, name) = split(p);
            if let Some(&pi) = path_ino.get(parent) {
                reset.entries.push((pi, name.to_os_string()));
                reset.inodes.push(pi);
            }
            if let Some(&ino) = path_ino.get(p) {
                reset.inodes.push(ino);
            }
        }
        path_ino.retain(|p, ino| {
            *ino == 1
                || (matches!(
                    inodes.get(ino).map(|i| &i.target),
                    Some(InodeTarget::Path(_))
                ) && pristine(p))
        });
        // This branch's own objects whose numbers the kernel still holds (it served them
        // before, or they took a lower number): they are those objects again.
        for (p, slot) in &self.slots {
            match &slot.entry {
                Entry::Node(n) => {
                    if let Some(i) = inodes.get_mut(&n.ino) {
                        i.target = InodeTarget::Node(n.clone());
                        reset.inodes.push(n.ino);
                    }
                }
                Entry::Dir(d) if !p.as_os_str().is_empty() => {
                    if let Some(i) = inodes.get_mut(&d.ino) {
                        i.target = InodeTarget::Path(p.clone());
                        path_ino.insert(p.clone(), d.ino);
                        reset.inodes.push(d.ino);
                    }
                }
                _ => {}
            }
        }
        self.inodes = inodes;
        self.path_ino = path_ino;
        self.orphans = orphans;
        reset.entries.sort();
        reset.entries.dedup();
        reset.inodes.sort_unstable();
        reset.inodes.dedup();
        reset
    }
}

/// What a number that no longer stands for its path answers with: the lower object's
/// attributes there (or an empty directory's), unlinked.
fn unlinked(lower: &Lower, ino: u64, p: &Path) -> fuser::FileAttr {
    let mut a = match lower.stat(p) {
        Ok(Some(st)) => attr(ino, &Obj::Lower(p.to_path_buf(), st)),
        _ => empty_dir_attr(ino),
    };
    a.nlink = 0;
    a
}

//! Passing a FUSE connection from one branch to the next (issue 31, `pool.rs`): the kernel
//! keeps what it cached of the connection — dentries, attributes, page cache, all keyed by
//! node id — so the next branch starts warm. What the last branch changed must go: its
//! entries (made, removed, renamed, negative ones it turned into files), the attributes and
//! data of every object it wrote, and the inodes that stood for its own objects. Everything
//! else shows the unchanged project, which the lower watch keeps current (`watch.rs`).
//!
//! The next branch's inode table starts with the numbers the kernel still holds:
//! - a lower object at its own path, under its own number, that the branch left alone
//!   stays what it is (the kernel's cache of it is still right);
//! - a number a branch object took from a lower one (a copied-up file, a directory with
//!   changed metadata) is given back to the lower object at that path when the project still
//!   has it there, so unchanged `st_ino`s stay what git's index recorded;
//! - anything else the kernel holds (the branch's own files, renamed or deleted objects)
//!   answers as an unlinked object until the kernel forgets it, and its entry is dropped.

use crate::overlay::{attr, empty_dir_attr, Overlay};
use crate::tree::{split, Entry, InodeTarget, Obj, Tree, BRANCH_INOS};
use rustc_hash::FxHashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What the kernel must drop when a connection passes to its next branch.
#[derive(Default, Debug, Clone)]
pub(crate) struct Reset {
    /// Entries (parent node id, name) the last branch made, removed or changed.
    pub entries: Vec<(u64, OsString)>,
    /// Inodes whose attributes or cached data the last branch changed.
    pub inodes: Vec<u64>,
}

impl Reset {
    /// Tell the kernel (entries first: a dropped entry lets the kernel forget its inode).
    pub fn send(&self, notifier: &fuser::Notifier) {
        for (parent, name) in &self.entries {
            // ENOENT: the kernel no longer has the parent, so nothing below it either.
            let _ = notifier.inval_entry(fuser::INodeNo(*parent), name);
        }
        for ino in &self.inodes {
            let _ = notifier.inval_inode(fuser::INodeNo(*ino), 0, 0);
        }
    }

    /// How many notifications [`Reset::send`] makes.
    pub fn len(&self) -> usize {
        self.entries.len() + self.inodes.len()
    }
}

impl Overlay {
    /// The inode table the next branch of this connection starts from, and what the
    /// kernel must drop of this branch (see the module doc). The table is moved out of this
    /// overlay's tree (nothing serves it any more; accept reads only its slots and reads),
    /// so a reset costs what the branch changed, not what the kernel holds.
    pub(crate) fn successor(&self) -> (Tree, Reset) {
        let mut guard = self.tree();
        let t = &mut *guard;
        let mut next = t.carried();
        let mut reset = Reset::default();
        // Slots that change where paths below them resolve: anything but a directory that
        // still reads its own lower path (renamed, re-created, deleted, replaced).
        let redirects: FxHashSet<PathBuf> = t
            .slots
            .iter()
            .filter(|(p, slot)| match &slot.entry {
                Entry::Dir(d) => d.lower.as_deref() != Some(p.as_path()),
                _ => true,
            })
            .map(|(p, _)| p.clone())
            .collect();
        let few: Vec<&PathBuf> = redirects.iter().take(16).collect();
        let slots = &t.slots;
        let pristine = |p: &Path| {
            if slots.contains_key(p) {
                return false;
            }
            // A few redirects (the usual branch): prefix checks; else a lookup per ancestor.
            if redirects.len() <= few.len() {
                !few.iter().any(|r| p.starts_with(r) && p != r.as_path())
            } else {
                !p.ancestors().skip(1).any(|a| redirects.contains(a))
            }
        };
        // Paths whose entries the kernel may hold and that do not show the same in the
        // next branch: every slot, and every path of an inode that is not kept.
        let mut stale: Vec<PathBuf> = slots.keys().cloned().collect();
        let mut inodes = std::mem::take(&mut t.inodes);
        for (&ino, inode) in inodes.iter_mut() {
            if ino == 1 {
                continue;
            }
            let keep = match &inode.target {
                InodeTarget::Path(p) => ino & BRANCH_INOS == 0 && !t.is_claimed(ino) && pristine(p),
                _ => false,
            };
            if keep {
                continue;
            }
            if let InodeTarget::Path(p) = &inode.target {
                stale.push(p.clone());
            }
            reset.inodes.push(ino);
            let gone = gone_attr(self, t, ino, &inode.target);
            inode.target = InodeTarget::Gone(Box::new(gone));
        }
        // The root's entry is the carried one.
        inodes.remove(&1);
        if let Some(root) = next.inodes.remove(&1) {
            inodes.insert(1, root);
        }
        next.inodes = inodes;
        for p in &stale {
            if p.as_os_str().is_empty() {
                reset.inodes.push(1);
                continue;
            }
            let (parent, name) = split(p);
            if let Some(&pi) = t.path_ino.get(parent) {
                reset.entries.push((pi, name.to_os_string()));
                // The directory's own attributes (times, link count) and listing changed.
                reset.inodes.push(pi);
            }
            if let Some(&ino) = t.path_ino.get(p) {
                reset.inodes.push(ino);
            }
        }
        let mut path_ino = std::mem::take(&mut t.path_ino);
        path_ino.retain(|p, ino| {
            *ino == 1
                || (matches!(
                    next.inodes.get(ino).map(|i| &i.target),
                    Some(InodeTarget::Path(_))
                ) && pristine(p))
        });
        next.path_ino = path_ino;
        // Numbers branch objects took from lower ones go back to the lower object where the
        // project still has it at that path, of the same kind.
        for (p, slot) in slots {
            let ino = match &slot.entry {
                Entry::Node(n) => n.ino,
                Entry::Dir(d) => d.ino,
                Entry::Whiteout => continue,
            };
            if ino & BRANCH_INOS != 0 || p.as_os_str().is_empty() {
                continue;
            }
            let Some(InodeTarget::Gone(a)) = next.inodes.get(&ino).map(|i| &i.target) else {
                continue;
            };
            let kind = a.kind;
            if let Ok(Some(st)) = self.lower.stat(p) {
                let same_kind = attr(ino, &Obj::Lower(p.clone(), st)).kind == kind;
                if same_kind && next.own_number(&st) == Some(ino) {
                    if let Some(i) = next.inodes.get_mut(&ino) {
                        i.target = InodeTarget::Path(p.clone());
                    }
                    next.path_ino.insert(p.clone(), ino);
                }
            }
        }
        reset.entries.sort();
        reset.entries.dedup();
        reset.inodes.sort_unstable();
        reset.inodes.dedup();
        (next, reset)
    }
}

/// The attributes an inode that no longer stands for anything answers with: its last ones,
/// unlinked.
fn gone_attr(o: &Overlay, t: &Tree, ino: u64, target: &InodeTarget) -> fuser::FileAttr {
    let mut a = match target {
        InodeTarget::Gone(a) => **a,
        InodeTarget::Node(n) => attr(ino, &Obj::Node(n.clone())),
        InodeTarget::Path(p) => match t.resolve(&o.lower, p) {
            Ok(obj) => attr(ino, &obj),
            Err(_) => empty_dir_attr(ino),
        },
    };
    a.nlink = 0;
    a
}

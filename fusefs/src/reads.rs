//! What a branch read of lower, so accept can refuse a lost update.
//!
//! A command that reads `file`, works, then writes it must not overwrite an edit the user
//! made in between, although the copy-up (the write's own base) happened after that edit.
//! So the branch remembers, per lower path, the fingerprint of the object the first time it
//! served its data (a file's first READ, a symlink's readlink, a directory's listing), and
//! when. The fingerprint is taken with `fstat` on the very descriptor the data is then read
//! from, before any byte of it is served: a change during or after the read changes `ctime`
//! (or the inode), so the record never matches a version the branch did not see entirely.
//! The version last served counts: a file re-read after the user changed it (the kernel's
//! cache of it is dropped when lower changes, so the re-read reaches shade) is recorded anew,
//! at the time of that read — the branch has seen the user's change. Recording costs one
//! `fstat` and one map lookup per pass over a file (its READ at offset 0, which reaches
//! shade only when the kernel's page cache does not have it), nothing for the other READs.
//!
//! Which reads accept checks (the rule, also in the README): data flow inside a command is
//! unknowable, so every read that *precedes* a change the accept writes counts — the written
//! file may derive from it — and reads after the branch's last accepted change do not (a
//! `cargo test` run after the edits read the whole tree, but wrote nothing accepted after).
//! A directory listing counts only when the branch, after listing it, removed or renamed an
//! accepted entry of that same directory (`rm *.o`, `for f in *; do mv …`: what it removed may
//! have been chosen from the listing; a created entry is guarded by its own absent base), and
//! it conflicts only if lower's entries changed (its mtime), not for edits of files inside. Reads of ignored paths (build
//! output such as `target/`) are not checked unless ignored paths are accepted too.

use crate::changeset::{ChangeKind, Changeset};
use crate::fingerprint::{Base, Fingerprint};
use crate::overlay::Overlay;
use crate::plan::ReadBase;
use crate::tree::{split, Entry, Tree};
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

struct Seen {
    when: SystemTime,
    fp: Fingerprint,
}

pub(crate) struct Listed {
    lower: PathBuf,
    when: SystemTime,
    fp: Fingerprint,
}

/// The first read of every lower path (files, symlinks) and listing (directories).
#[derive(Default)]
pub(crate) struct Reads {
    /// By lower path.
    files: FxHashMap<PathBuf, Seen>,
    /// By the directory's path in the branch.
    pub(crate) listings: FxHashMap<PathBuf, Listed>,
    /// Lower objects (files, links, directories) the branch removed one by one inside a
    /// directory it then removed as a whole, by lower path, as they were when removed
    /// (`Tree::remove` drops their slots): accept checks each exactly, so a user's edit in,
    /// or addition to, the tree after the branch removed its part is never deleted with it
    /// (`changed_below`'s time comes from the system clock and missed a change an instant
    /// later, whose coarse ctime can be earlier).
    pub(crate) removed: FxHashMap<PathBuf, Fingerprint>,
}

impl Reads {
    /// The branch is about to serve data of the lower object at `lower`, which `st` (taken
    /// from the descriptor the data comes from) describes. A file read again in the same
    /// version keeps its first record; in another version, the new one replaces it.
    pub fn file(&mut self, lower: &Path, st: &libc::stat) {
        let fp = Fingerprint::from_stat(st);
        if let Some(seen) = self.files.get_mut(lower) {
            // Read again in another version (the user changed it and the branch read the
            // change): that version is what it saw last, from now.
            if seen.fp != fp {
                *seen = Seen {
                    when: SystemTime::now(),
                    fp,
                };
            }
            return;
        }
        self.files.insert(
            lower.to_path_buf(),
            Seen {
                when: SystemTime::now(),
                fp: Fingerprint::from_stat(st),
            },
        );
    }

    /// The branch is about to list directory `dir` (its lower source `lower`, as `st`).
    pub fn listing(&mut self, dir: &Path, lower: &Path, st: &libc::stat) {
        if self.listings.contains_key(dir) {
            return;
        }
        self.listings.insert(
            dir.to_path_buf(),
            Listed {
                lower: lower.to_path_buf(),
                when: SystemTime::now(),
                fp: Fingerprint::from_stat(st),
            },
        );
    }

    /// How many lower paths were read (files and listings).
    pub fn len(&self) -> usize {
        self.files.len() + self.listings.len()
    }
}

/// When the branch last changed what it shows at `path` (a changed path of the changeset).
fn changed_at(t: &Tree, path: &Path) -> SystemTime {
    let own = |p: &Path| match t.slots.get(p).map(|s| &s.entry) {
        Some(Entry::Node(n)) => Some(n.state().meta.ctime),
        Some(Entry::Dir(d)) => Some(d.meta.ctime),
        _ => None,
    };
    // A deletion has no object left: its directory changed when the entry went.
    own(path)
        .or_else(|| own(split(path).0))
        .unwrap_or_else(SystemTime::now)
}

impl Overlay {
    /// Whether the branch removed a lower directory (whose tree accept checks).
    pub(crate) fn deletes_a_directory(&self) -> bool {
        self.tree().slots.values().any(|s| {
            let gone = match &s.entry {
                Entry::Whiteout => true,
                Entry::Dir(d) => d.lower.is_none(), // removed and made again
                Entry::Node(_) => true,             // replaced by a file
            };
            gone && matches!(s.base, Base::Present(fp) if fp.is_dir())
        })
    }

    /// The reads accept must check for `changes` (see the module doc for the rule).
    pub(crate) fn read_bases(&self, changes: &Changeset, include_ignored: bool) -> Vec<ReadBase> {
        let t = self.tree();
        let mut last: Option<SystemTime> = None;
        let mut dirs: FxHashMap<&Path, SystemTime> = FxHashMap::default();
        for c in &changes.changes {
            let when = changed_at(&t, &c.path);
            last = Some(last.map_or(when, |l| l.max(when)));
            // Entries removed or moved away may have been chosen from a listing; a new
            // entry is guarded by its own (absent) base already.
            if !matches!(c.kind, ChangeKind::Deleted | ChangeKind::Renamed) {
                continue;
            }
            for p in std::iter::once(&c.path).chain(c.old_path.as_ref()) {
                let d = dirs.entry(split(p).0).or_insert(when);
                *d = (*d).max(when);
            }
        }
        let Some(last) = last else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (lower, seen) in &t.reads.files {
            if seen.when > last || (!include_ignored && self.ignore.is_ignored(lower, false)) {
                continue;
            }
            out.push(ReadBase {
                path: lower.clone(),
                seen: seen.fp,
                listing: false,
                subtree_since: None,
            });
        }
        for (dir, listed) in &t.reads.listings {
            if dirs.get(dir.as_path()).is_some_and(|w| *w >= listed.when) {
                out.push(ReadBase {
                    path: listed.lower.clone(),
                    seen: listed.fp,
                    listing: true,
                    subtree_since: None,
                });
            }
        }
        // A directory deleted as a whole: its files were removed in the branch one by one,
        // but accept removes the tree as it is then; anything added, removed or changed in
        // it after the branch saw it would be lost with it.
        // Moved directories keep what is in them: only trees that go are checked.
        let moved: Vec<&PathBuf> = changes
            .changes
            .iter()
            .filter_map(|c| c.old_path.as_ref())
            .collect();
        for (path, slot) in &t.slots {
            if moved.contains(&path) {
                continue;
            }
            let gone = match &slot.entry {
                Entry::Whiteout | Entry::Node(_) => true,
                Entry::Dir(d) => d.lower.is_none(), // removed and made again
            };
            let (Base::Present(base), Some(lower)) = (slot.base, slot.base_at.clone()) else {
                continue;
            };
            if !gone
                || !base.is_dir()
                || path.as_os_str().is_empty()
                || (!include_ignored && self.ignore.is_ignored(path, true))
            {
                continue;
            }
            let (seen, since) = match t.reads.listings.get(path) {
                Some(l) => (l.fp, ns(l.when)),
                None => (base, base.ctime_ns.max(base.mtime_ns)),
            };
            for (removed, fp) in &t.reads.removed {
                if removed.starts_with(&lower) && removed != &lower {
                    out.push(ReadBase {
                        path: removed.clone(),
                        seen: *fp,
                        listing: false,
                        subtree_since: None,
                    });
                }
            }
            out.push(ReadBase {
                path: lower,
                seen,
                listing: true,
                subtree_since: Some(since),
            });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }
}

fn ns(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

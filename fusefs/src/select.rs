//! Accepting part of a changeset (`shade run --review` lets a person pick files).
//!
//! A picked subset must still be a state the real tree can be in, so some changes come only
//! together. The rule, "what a change needs":
//!
//! - **A change inside a directory the branch placed** — created (`A`, or a file turned into a
//!   directory, `M dir/`) or moved (`R old/ -> new/`) — needs that directory's change: a file
//!   cannot land in a directory that is not there. (A new directory holding files is not
//!   listed on its own; it comes with any file picked inside it.)
//! - **A rename is one change**: accepting `R a -> b` writes `b` and removes `a`; dropping it
//!   does neither.
//! - **Removing a lower directory** (`D dir/`, or replacing it by a file or by a moved
//!   directory) removes everything in it, so it needs every change listed below it that
//!   takes something out of it (a rename from inside; for a plain removal, any entry listed
//!   under it). Usually there is none: a deleted directory is one `D dir/` entry.
//! - **A directory removed and made again** (its old entries hidden: listed as `D`) is
//!   accepted or dropped as a whole, together with everything listed inside it: accept
//!   replaces the whole directory.
//! - **Hard links** need nothing: a name picked without the others is written as a file of
//!   its own (with the content they share), the others stay as they were.
//!
//! Picking a change picks what it needs (transitively); unpicking one unpicks what needs it.
//! [`crate::Branch::accept_selected`] then plans only the picked paths, the directories
//! above them, and the sources of picked renames, and accepts that plan as any other: all or
//! nothing, conflict-checked against the picked paths only.

use crate::changeset::{Change, Changeset};
use crate::fingerprint::Base;
use crate::overlay::Overlay;
use crate::tree::Entry;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A changeset with a consistent choice of changes to accept (see the module doc).
#[derive(Clone, Debug)]
pub struct Selection {
    changes: Vec<Change>,
    /// For each change, the changes it cannot be accepted without.
    needs: Vec<Vec<usize>>,
    /// The reverse of `needs`.
    needed_by: Vec<Vec<usize>>,
    picked: Vec<bool>,
}

impl Selection {
    fn new(changes: Changeset, needs: Vec<Vec<usize>>) -> Selection {
        let n = changes.changes.len();
        let mut needed_by = vec![Vec::new(); n];
        for (i, ns) in needs.iter().enumerate() {
            for &j in ns {
                needed_by[j].push(i);
            }
        }
        Selection {
            changes: changes.changes,
            needs,
            needed_by,
            picked: vec![true; n],
        }
    }

    /// The changes, in changeset (path) order; indexes below refer to this list.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// Whether change `i` is picked.
    pub fn is_picked(&self, i: usize) -> bool {
        self.picked.get(i).copied().unwrap_or(false)
    }

    /// How many changes are picked.
    pub fn picked_count(&self) -> usize {
        self.picked.iter().filter(|p| **p).count()
    }

    /// The picked changes, as a changeset.
    pub fn picked(&self) -> Changeset {
        Changeset {
            changes: self
                .changes
                .iter()
                .zip(&self.picked)
                .filter(|(_, p)| **p)
                .map(|(c, _)| c.clone())
                .collect(),
        }
    }

    /// Whether every change is picked (accept is then the plain, whole-branch accept).
    pub fn all_picked(&self) -> bool {
        self.picked.iter().all(|p| *p)
    }

    /// The changes `i` cannot be accepted without (directly).
    pub fn needs(&self, i: usize) -> &[usize] {
        self.needs.get(i).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Pick (`on`) or unpick change `i`, keeping the choice consistent: picking also picks
    /// what it needs, unpicking also unpicks what needs it. Returns the other changes whose
    /// state changed with it, so a UI can say so.
    pub fn set(&mut self, i: usize, on: bool) -> Vec<usize> {
        if i >= self.changes.len() {
            return Vec::new();
        }
        let edges = if on { &self.needs } else { &self.needed_by };
        let mut stack = vec![i];
        let mut changed = Vec::new();
        while let Some(k) = stack.pop() {
            if self.picked[k] == on {
                continue;
            }
            self.picked[k] = on;
            if k != i {
                changed.push(k);
            }
            stack.extend(edges[k].iter().copied());
        }
        changed.sort_unstable();
        changed
    }

    /// Flip change `i` (see [`Selection::set`]).
    pub fn toggle(&mut self, i: usize) -> Vec<usize> {
        let on = !self.is_picked(i);
        self.set(i, on)
    }

    /// Pick or unpick everything.
    pub fn set_all(&mut self, on: bool) {
        self.picked.iter_mut().for_each(|p| *p = on);
    }
}

/// Which slots a partial accept plans: the picked paths, the sources of picked renames, and
/// every directory slot above one of them (created, moved, replaced or only re-timed).
pub(crate) struct Keep {
    paths: BTreeSet<PathBuf>,
}

impl Keep {
    pub(crate) fn of(sel: &Selection) -> Keep {
        let mut paths = BTreeSet::new();
        for (c, _) in sel.changes.iter().zip(&sel.picked).filter(|(_, p)| **p) {
            paths.insert(c.path.clone());
            if let Some(old) = &c.old_path {
                paths.insert(old.clone());
            }
        }
        Keep { paths }
    }

    /// Whether the slot at `path` belongs to the partial plan.
    pub(crate) fn keeps(&self, path: &Path, entry: &Entry) -> bool {
        if self.paths.contains(path) {
            return true;
        }
        // Descendants sort right after `path` (paths compare component by component).
        matches!(entry, Entry::Dir(_))
            && self
                .paths
                .range::<Path, _>((std::ops::Bound::Excluded(path), std::ops::Bound::Unbounded))
                .next()
                .is_some_and(|q| q.starts_with(path))
    }
}

/// How a slot over a lower directory takes that directory away in an accept.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// Deleted (`D dir/`), or replaced by a file: nothing of it stays.
    Deleted,
    /// Replaced by a moved directory, whose own entries show there now.
    Replaced,
    /// Removed and made again: accept deletes the old tree and creates the new one.
    Remade,
}

impl Overlay {
    /// What each change of `changes` needs (see the module doc), as indexes into it.
    pub(crate) fn needs(&self, changes: &Changeset) -> Vec<Vec<usize>> {
        let t = self.tree();
        let list = &changes.changes;
        let at: HashMap<&Path, usize> = list
            .iter()
            .enumerate()
            .map(|(i, c)| (c.path.as_path(), i))
            .collect();
        let mut removals: HashMap<&Path, Removal> = HashMap::new();
        let mut placed: BTreeSet<&Path> = BTreeSet::new();
        for (path, slot) in &t.slots {
            let was_dir = matches!(slot.base, Base::Present(fp) if fp.is_dir());
            let moved = |lower: &Option<PathBuf>| {
                lower.is_some() && t.natural_lower(path).as_ref() != lower.as_ref()
            };
            match &slot.entry {
                Entry::Dir(d) if d.lower.is_none() => {
                    placed.insert(path);
                    if was_dir {
                        removals.insert(path, Removal::Remade);
                    }
                }
                Entry::Dir(d) if moved(&d.lower) => {
                    placed.insert(path);
                    if was_dir {
                        removals.insert(path, Removal::Replaced);
                    }
                }
                Entry::Dir(_) => {}
                Entry::Whiteout if was_dir => {
                    removals.insert(path, Removal::Deleted);
                }
                Entry::Whiteout => {}
                Entry::Node(_) if was_dir => {
                    removals.insert(path, Removal::Deleted);
                }
                Entry::Node(_) => {}
            }
        }
        let mut needs: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); list.len()];
        // Members of each re-made directory, chained into a cycle below.
        let mut remade: HashMap<&Path, Vec<usize>> = HashMap::new();
        for (i, c) in list.iter().enumerate() {
            for a in c.path.ancestors().skip(1) {
                if a.as_os_str().is_empty() {
                    break;
                }
                if placed.contains(a) {
                    if let Some(&j) = at.get(a) {
                        needs[i].insert(j);
                    }
                }
            }
            let sides =
                std::iter::once((&c.path, false)).chain(c.old_path.iter().map(|o| (o, true)));
            for (p, is_source) in sides {
                for a in p.ancestors().skip(1) {
                    if a.as_os_str().is_empty() {
                        break;
                    }
                    let Some(&how) = removals.get(a) else {
                        continue;
                    };
                    match how {
                        Removal::Remade => {
                            let members = remade.entry(a).or_default();
                            if members.last() != Some(&i) {
                                members.push(i);
                            }
                        }
                        Removal::Deleted | Removal::Replaced
                            if is_source || how == Removal::Deleted =>
                        {
                            if let Some(&o) = at.get(a) {
                                needs[o].insert(i);
                            }
                        }
                        // Inside what replaced it (a moved directory's entries).
                        _ => {}
                    }
                }
            }
        }
        for (dir, mut members) in remade {
            if let Some(&o) = at.get(dir) {
                members.push(o);
            }
            members.sort_unstable();
            members.dedup();
            for w in 0..members.len() {
                let next = members[(w + 1) % members.len()];
                if next != members[w] {
                    needs[members[w]].insert(next);
                }
            }
        }
        for (i, ns) in needs.iter_mut().enumerate() {
            ns.remove(&i);
        }
        needs.into_iter().map(|s| s.into_iter().collect()).collect()
    }

    /// `changes` as a [`Selection`] with everything picked.
    pub(crate) fn selection(&self, changes: Changeset) -> Selection {
        let needs = self.needs(&changes);
        Selection::new(changes, needs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changeset::ChangeKind;

    fn change(kind: ChangeKind, path: &str) -> Change {
        Change::new(kind, PathBuf::from(path), None, false)
    }

    #[test]
    fn picking_brings_needs_and_unpicking_drops_dependants() {
        let changes = Changeset {
            changes: vec![
                change(ChangeKind::Renamed, "new"),
                change(ChangeKind::Modified, "new/f"),
                change(ChangeKind::Added, "other"),
            ],
        };
        let mut s = Selection::new(changes, vec![vec![], vec![0], vec![]]);
        assert!(s.all_picked());
        assert_eq!(
            s.set(0, false),
            vec![1],
            "the file inside goes with its directory"
        );
        assert_eq!(s.picked_count(), 1);
        assert_eq!(s.set(1, true), vec![0], "and brings it back");
        assert_eq!(s.toggle(2), Vec::<usize>::new());
        assert!(!s.is_picked(2) && s.is_picked(0) && s.is_picked(1));
        let keep = Keep::of(&s);
        assert!(keep.keeps(Path::new("new/f"), &Entry::Whiteout));
        assert!(!keep.keeps(Path::new("other"), &Entry::Whiteout));
        assert!(
            !keep.keeps(Path::new("ne"), &Entry::Whiteout),
            "only directories come with what is below them"
        );
    }
}

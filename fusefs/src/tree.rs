//! The branch's view: override slots keyed by path, merged with lower on every lookup,
//! plus the inode table the kernel refers to.
//!
//! Invariants:
//! - a slot at `p` records `base`, what lower had at `p`'s natural lower path when the slot
//!   was first made; it travels with its path, not with the object;
//! - `children[d]` names every slot directly under `d` (whiteouts included);
//! - a directory's lower children come from `lower_of(d)`, which follows renamed and
//!   re-created (opaque) directories.

use crate::fingerprint::{Base, Fingerprint};
use crate::lower::Lower;
use crate::node::{DirOver, Meta, Node};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a path holds in the branch.
pub(crate) enum Entry {
    Node(Arc<Node>),
    Dir(DirOver),
    /// Deleted in this branch; hides the lower object.
    Whiteout,
}

pub(crate) struct Slot {
    pub entry: Entry,
    pub base: Base,
    /// The lower path `base` was observed at (the natural lower path when the slot was
    /// made); `None` when the path had no lower counterpart (inside a new directory).
    pub base_at: Option<PathBuf>,
}

/// What the kernel's inode number stands for.
pub(crate) enum InodeTarget {
    /// A path in the merged view (directories, and lower objects not copied up).
    Path(PathBuf),
    /// A branch-owned non-directory object (survives renames and unlinks).
    Node(Arc<Node>),
    /// A lower object unlinked in the branch while the kernel still held it.
    Gone(Box<fuser::FileAttr>),
}

pub(crate) struct Inode {
    pub target: InodeTarget,
    pub lookups: u64,
}

/// A resolved object of the merged view.
pub(crate) enum Obj {
    Node(Arc<Node>),
    /// A directory with branch metadata.
    Dir(DirOver),
    /// An untouched lower object at this lower path.
    Lower(PathBuf, libc::stat),
}

impl Obj {
    pub fn is_dir(&self) -> bool {
        match self {
            Obj::Dir(_) => true,
            Obj::Node(_) => false,
            Obj::Lower(_, st) => st.st_mode & libc::S_IFMT == libc::S_IFDIR,
        }
    }
}

pub(crate) struct Tree {
    pub slots: BTreeMap<PathBuf, Slot>,
    pub children: FxHashMap<PathBuf, BTreeSet<OsString>>,
    pub inodes: FxHashMap<u64, Inode>,
    pub path_ino: FxHashMap<PathBuf, u64>,
    /// Lower files unlinked in the branch while the kernel still references them.
    pub orphans: FxHashMap<u64, Arc<std::fs::File>>,
    /// What the branch read of lower, for accept's read-conflict check (`reads.rs`).
    pub reads: crate::reads::Reads,
    /// Lower devices seen, by index: index 0 is the project's own file system; the index
    /// goes above a lower inode number's bits (`LOWER_INO_BITS`), like overlayfs' `xino`.
    /// Shared by every tree of the same root device (`shared_devs`): a branch that moves
    /// to another connection (`attach.rs`) must mean the same object by the same number
    /// as the trees whose numbers that connection's kernel holds.
    devs: Arc<std::sync::Mutex<Vec<u64>>>,
    /// `devs[0]`, read without the lock (nearly every lower object is on it).
    root_dev: u64,
    /// Lower numbers that branch objects took (a copied-up file, a directory with branch
    /// metadata): the branch's object and lower's are two objects from then on, so lower's
    /// object, wherever else it shows, gets a number of its own.
    claimed: FxHashSet<u64>,
    /// Numbers given to lower objects whose own was unusable (too large, claimed, or still
    /// held for an unlinked object), by path, with the lower `(dev, ino)` they stand for:
    /// the same object at the same path keeps its number after the kernel forgets it.
    fallbacks: FxHashMap<PathBuf, ((u64, u64), u64)>,
    /// What the slots cost the daemon's memory (`budget::slot_cost`), for the branch's
    /// metadata budget.
    pub slot_bytes: u64,
}

/// Numbers of objects the branch creates have this bit set; lower objects' numbers never
/// do, so the two cannot collide. The kernel's node id is the shown `st_ino` (fuser sends
/// one number for both), so these numbers are also the objects' identities.
pub(crate) const BRANCH_INOS: u64 = 1 << 63;
/// A lower inode number below `1 << LOWER_INO_BITS` is shown as it is (on the project's
/// own file system; on others, with the device's index in the bits above). Others get a
/// number from the branch's range.
const LOWER_INO_BITS: u32 = 56;
/// Devices that fit in the bits between `LOWER_INO_BITS` and `BRANCH_INOS`.
const MAX_DEVS: usize = 1 << (63 - LOWER_INO_BITS);

/// The next branch-range number, for the whole process: a number is never given twice,
/// so a branch that leaves a connection and later takes another (`attach.rs`) can never
/// meet a number the kernel holds there for another branch's object.
static NEXT_BRANCH_INO: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(BRANCH_INOS | 2);

/// A device table shared by trees (see `Tree::devs`).
type Devs = Arc<std::sync::Mutex<Vec<u64>>>;

/// The device table of every tree whose root is on `root_dev` (index 0 is that device).
fn shared_devs(root_dev: u64) -> Devs {
    static ALL: std::sync::Mutex<Option<FxHashMap<u64, Devs>>> = std::sync::Mutex::new(None);
    let mut all = ALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.get_or_insert_with(FxHashMap::default)
        .entry(root_dev)
        .or_insert_with(|| Arc::new(std::sync::Mutex::new(vec![root_dev])))
        .clone()
}

/// What an entry costs beyond its slot: a symlink's target.
fn entry_extra(entry: &Entry) -> u64 {
    match entry {
        Entry::Node(n) => n.target.len() as u64,
        _ => 0,
    }
}

/// Parent and name of a non-root relative path.
pub(crate) fn split(rel: &Path) -> (&Path, &OsStr) {
    (
        rel.parent().unwrap_or(Path::new("")),
        rel.file_name().unwrap_or(OsStr::new("")),
    )
}

impl Tree {
    /// An empty view of a lower tree on device `root_dev`.
    pub fn new(root_dev: u64) -> Tree {
        let mut inodes = FxHashMap::default();
        inodes.insert(
            1,
            Inode {
                target: InodeTarget::Path(PathBuf::new()),
                lookups: 1,
            },
        );
        let mut path_ino = FxHashMap::default();
        path_ino.insert(PathBuf::new(), 1);
        Tree {
            slots: BTreeMap::new(),
            children: FxHashMap::default(),
            inodes,
            path_ino,
            orphans: FxHashMap::default(),
            reads: crate::reads::Reads::default(),
            devs: shared_devs(root_dev),
            root_dev,
            claimed: FxHashSet::default(),
            fallbacks: FxHashMap::default(),
            slot_bytes: 0,
        }
    }

    /// An empty view that a pooled connection's next branch starts from: the root and the
    /// device indexes (they are in the numbers the kernel holds; branch-range numbers are
    /// never given twice in a process).
    pub fn carried(&self) -> Tree {
        let mut t = Tree::new(0);
        t.devs = self.devs.clone();
        t.root_dev = self.root_dev;
        if let Some(root) = self.inodes.get(&1) {
            if let Some(r) = t.inodes.get_mut(&1) {
                r.lookups = root.lookups;
            }
        }
        t
    }

    /// Whether a branch object took lower number `ino` (see `claimed`).
    pub fn is_claimed(&self, ino: u64) -> bool {
        self.claimed.contains(&ino)
    }

    /// The number lower object `st` shows when nothing holds or took it (`None`: it has
    /// none of its own).
    pub fn own_number(&mut self, st: &libc::stat) -> Option<u64> {
        self.lower_key((st.st_dev, st.st_ino))
    }

    pub fn alloc_ino(&mut self) -> u64 {
        NEXT_BRANCH_INO.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The lower directory whose entries show through directory `dir` of the branch.
    pub fn lower_of(&self, dir: &Path) -> Option<PathBuf> {
        if let Some(slot) = self.slots.get(dir) {
            return match &slot.entry {
                Entry::Dir(d) => d.lower.clone(),
                _ => None,
            };
        }
        if dir.as_os_str().is_empty() {
            return Some(PathBuf::new());
        }
        let (parent, name) = split(dir);
        self.lower_of(parent).map(|l| l.join(name))
    }

    /// The lower path that shows at `rel` when the branch has no slot there.
    pub fn natural_lower(&self, rel: &Path) -> Option<PathBuf> {
        if rel.as_os_str().is_empty() {
            return Some(PathBuf::new());
        }
        let (parent, name) = split(rel);
        self.lower_of(parent).map(|l| l.join(name))
    }

    /// Look `rel` up in the merged view.
    pub fn resolve(&self, lower: &Lower, rel: &Path) -> Result<Obj, i32> {
        if let Some(slot) = self.slots.get(rel) {
            return match &slot.entry {
                Entry::Node(n) => Ok(Obj::Node(n.clone())),
                Entry::Dir(d) => Ok(Obj::Dir(d.clone())),
                Entry::Whiteout => Err(libc::ENOENT),
            };
        }
        let lp = self.natural_lower(rel).ok_or(libc::ENOENT)?;
        match lower.stat(&lp) {
            Ok(Some(st)) => Ok(Obj::Lower(lp, st)),
            Ok(None) => Err(libc::ENOENT),
            Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    /// `resolve` for an entry `name` of a directory whose lower source is already known
    /// (listings resolve many children of one directory).
    pub fn resolve_child(
        &self,
        lower: &Lower,
        rel: &Path,
        dir_lower: Option<&Path>,
        name: &OsStr,
    ) -> Result<Obj, i32> {
        if self.slots.contains_key(rel) {
            return self.resolve(lower, rel);
        }
        let lp = dir_lower.ok_or(libc::ENOENT)?.join(name);
        match lower.stat(&lp) {
            Ok(Some(st)) => Ok(Obj::Lower(lp, st)),
            Ok(None) => Err(libc::ENOENT),
            Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    /// What lower has at `rel`'s natural lower path now, and that path (the base of a
    /// new slot).
    pub fn observe_base(&self, lower: &Lower, rel: &Path) -> (Base, Option<PathBuf>) {
        let Some(lp) = self.natural_lower(rel) else {
            return (Base::Absent, None);
        };
        match lower.stat(&lp) {
            Ok(Some(st)) => (Base::Present(Fingerprint::from_stat(&st)), Some(lp)),
            _ => (Base::Absent, Some(lp)),
        }
    }

    /// Put `entry` at `rel`, keeping the base of an existing slot.
    pub fn set(&mut self, lower: &Lower, rel: &Path, entry: Entry) {
        if let Some(slot) = self.slots.get_mut(rel) {
            let (old, new) = (entry_extra(&slot.entry), entry_extra(&entry));
            slot.entry = entry;
            self.slot_bytes = (self.slot_bytes + new).saturating_sub(old);
            return;
        }
        let (base, base_at) = self.observe_base(lower, rel);
        self.insert_slot(
            rel.to_path_buf(),
            Slot {
                entry,
                base,
                base_at,
            },
        );
    }

    fn insert_slot(&mut self, rel: PathBuf, slot: Slot) {
        if !rel.as_os_str().is_empty() {
            let (parent, name) = split(&rel);
            self.children
                .entry(parent.to_path_buf())
                .or_default()
                .insert(name.to_os_string());
        }
        let base = crate::budget::slot_cost(&rel, 0);
        self.slot_bytes += base + entry_extra(&slot.entry);
        if let Some(old) = self.slots.insert(rel, slot) {
            self.slot_bytes = self
                .slot_bytes
                .saturating_sub(base + entry_extra(&old.entry));
        }
    }

    /// Remove the slot at `rel` only (its parent's child set is the caller's business).
    pub fn forget_slot(&mut self, rel: &Path) {
        if let Some(slot) = self.slots.remove(rel) {
            let cost = crate::budget::slot_cost(rel, entry_extra(&slot.entry));
            self.slot_bytes = self.slot_bytes.saturating_sub(cost);
        }
    }

    fn drop_slot(&mut self, rel: &Path) -> Option<Slot> {
        let slot = self.slots.remove(rel)?;
        let cost = crate::budget::slot_cost(rel, entry_extra(&slot.entry));
        self.slot_bytes = self.slot_bytes.saturating_sub(cost);
        let (parent, name) = split(rel);
        if let Some(set) = self.children.get_mut(parent) {
            set.remove(name);
            if set.is_empty() {
                self.children.remove(parent);
            }
        }
        Some(slot)
    }

    /// All slots strictly below `dir`, in path order.
    pub fn descendants(&self, dir: &Path) -> Vec<PathBuf> {
        self.slots
            .range::<Path, _>((std::ops::Bound::Excluded(dir), std::ops::Bound::Unbounded))
            .map(|(p, _)| p)
            .take_while(|p| p.starts_with(dir))
            .filter(|p| dir.as_os_str().is_empty() || p.as_path() != dir)
            .cloned()
            .collect()
    }

    /// What moving everything at and below `from` to `to` adds to the daemon's memory: the
    /// path of each slot and of each inode the kernel knows grows by the difference. A
    /// directory of 25,000 files renamed under a chain of 64 names of 255 bytes grew the
    /// branch server by 493 MiB against a 16 MiB budget (red team round 9), since only the
    /// renamed entry was charged. Counting the known inodes scans their index, as the
    /// move itself does.
    pub fn moved_growth(&self, from: &Path, to: &Path) -> u64 {
        let delta = to.as_os_str().len().saturating_sub(from.as_os_str().len()) as u64;
        if delta == 0 {
            return 0;
        }
        let slots = self
            .slots
            .range::<Path, _>((std::ops::Bound::Excluded(from), std::ops::Bound::Unbounded))
            .take_while(|(p, _)| p.starts_with(from))
            .count();
        let inodes = self.path_ino.keys().filter(|p| p.starts_with(from)).count();
        // A path is kept twice per slot (its key and its parent's child set) at most.
        delta.saturating_mul(2 * slots as u64 + inodes as u64)
    }

    /// Remove what `rel` shows (and, for a directory, every slot below it): a whiteout
    /// stays where lower has something, so it keeps hiding it.
    pub fn remove(&mut self, lower: &Lower, rel: &Path) {
        for d in self.descendants(rel) {
            if let Some(Slot {
                base: Base::Present(fp),
                base_at: Some(at),
                ..
            }) = self.slots.get(&d)
            {
                self.reads.removed.entry(at.clone()).or_insert(*fp);
            }
            self.drop_slot(&d);
        }
        let lower_has = match self.slots.get(rel) {
            Some(slot) => slot.base != Base::Absent || self.natural_exists(lower, rel),
            None => self.natural_exists(lower, rel),
        };
        if lower_has {
            self.set(lower, rel, Entry::Whiteout);
        } else {
            self.drop_slot(rel);
        }
    }

    fn natural_exists(&self, lower: &Lower, rel: &Path) -> bool {
        matches!(
            self.natural_lower(rel).map(|lp| lower.stat(&lp)),
            Some(Ok(Some(_)))
        )
    }

    /// Move every slot below `from` to the same place below `to` (slots below `to` are
    /// dropped first: `to` was an empty directory). Inode paths follow.
    pub fn move_descendants(&mut self, from: &Path, to: &Path) {
        for d in self.descendants(to) {
            self.drop_slot(&d);
        }
        for d in self.descendants(from) {
            if let Some(slot) = self.drop_slot(&d) {
                if let Ok(rest) = d.strip_prefix(from) {
                    self.insert_slot(to.join(rest), slot);
                }
            }
        }
        self.move_inode_paths(from, to);
    }

    /// Re-key inodes (and the path index) under `from` to `to`, `from` itself included.
    pub fn move_inode_paths(&mut self, from: &Path, to: &Path) {
        let moved: Vec<(PathBuf, u64)> = self
            .path_ino
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        // Anything already known under `to` is replaced.
        let stale: Vec<PathBuf> = self
            .path_ino
            .keys()
            .filter(|p| p.starts_with(to))
            .cloned()
            .collect();
        for p in stale {
            self.path_ino.remove(&p);
        }
        for (p, ino) in moved {
            self.path_ino.remove(&p);
            let Ok(rest) = p.strip_prefix(from) else {
                continue;
            };
            let np = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            if let Some(inode) = self.inodes.get_mut(&ino) {
                if let InodeTarget::Path(ip) = &mut inode.target {
                    *ip = np.clone();
                }
            }
            self.path_ino.insert(np, ino);
        }
    }

    /// Exchange everything below `a` with everything below `b` (RENAME_EXCHANGE of dirs).
    pub fn swap_subtrees(&mut self, a: &Path, b: &Path) {
        let take = |t: &mut Tree, root: &Path| -> Vec<(PathBuf, Slot)> {
            t.descendants(root)
                .into_iter()
                .filter_map(|p| {
                    let slot = t.drop_slot(&p)?;
                    Some((p.strip_prefix(root).ok()?.to_path_buf(), slot))
                })
                .collect()
        };
        let da = take(self, a);
        let db = take(self, b);
        for (rest, slot) in da {
            self.insert_slot(b.join(rest), slot);
        }
        for (rest, slot) in db {
            self.insert_slot(a.join(rest), slot);
        }
        let grab = |t: &mut Tree, root: &Path| -> Vec<(PathBuf, u64)> {
            let keys: Vec<PathBuf> = t
                .path_ino
                .keys()
                .filter(|p| p.starts_with(root))
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|p| {
                    let ino = t.path_ino.remove(&p)?;
                    Some((p.strip_prefix(root).ok()?.to_path_buf(), ino))
                })
                .collect()
        };
        let ia = grab(self, a);
        let ib = grab(self, b);
        for (root, items) in [(b, ia), (a, ib)] {
            for (rest, ino) in items {
                let np = if rest.as_os_str().is_empty() {
                    root.to_path_buf()
                } else {
                    root.join(rest)
                };
                if let Some(Inode {
                    target: InodeTarget::Path(p),
                    ..
                }) = self.inodes.get_mut(&ino)
                {
                    *p = np.clone();
                }
                self.path_ino.insert(np, ino);
            }
        }
    }

    /// Names of the slots directly under `dir`.
    pub fn slot_children(&self, dir: &Path) -> impl Iterator<Item = &OsString> {
        self.children.get(dir).into_iter().flatten()
    }

    /// The inode number `rel` shows, bound for the kernel: a branch object's own number,
    /// a lower object's `st_ino` (see [`Tree::lower_ino`]); the root is always 1.
    pub fn ino_for(&mut self, rel: &Path, obj: &Obj) -> u64 {
        if rel.as_os_str().is_empty() {
            return 1;
        }
        match obj {
            Obj::Node(n) => {
                self.inodes.entry(n.ino).or_insert_with(|| Inode {
                    target: InodeTarget::Node(n.clone()),
                    lookups: 0,
                });
                n.ino
            }
            Obj::Dir(d) => self.bind_path(rel, d.ino),
            Obj::Lower(_, st) => self.lower_ino(rel, st),
        }
    }

    /// The number of lower object `st` shown at `rel`: its own `st_ino` (folded with its
    /// device's index) unless a branch object took that number or another object still
    /// holds it; then a number from the branch's range, kept for this object at `rel`.
    pub fn lower_ino(&mut self, rel: &Path, st: &libc::stat) -> u64 {
        let id = (st.st_dev, st.st_ino);
        if let Some(key) = self.lower_key(id).filter(|k| !self.claimed.contains(k)) {
            match self.inodes.get(&key).map(|i| &i.target) {
                None => return self.bind_path(rel, key),
                Some(InodeTarget::Path(p)) if p == rel => return self.bind_path(rel, key),
                Some(InodeTarget::Path(_))
                    if st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1 =>
                {
                    // Another name of a hard-linked lower file: one inode, as natively.
                    if self.path_ino.get(rel) != Some(&key) {
                        self.path_ino.insert(rel.to_path_buf(), key);
                    }
                    return key;
                }
                // The kernel still holds the number for another object: one unlinked in
                // the branch, or what another path showed (the object moved in lower, or
                // lower reused the number of one it deleted). Sharing the inode would let
                // an open file of the old object read the new one: this path gets its own
                // number until the kernel forgets the old.
                Some(_) => {}
            }
        }
        let reuse = match self.fallbacks.get(rel) {
            Some(&(was, ino)) if was == id && !self.claimed.contains(&ino) => {
                match self.inodes.get(&ino).map(|i| &i.target) {
                    None => Some(ino),
                    Some(InodeTarget::Path(p)) if p == rel => Some(ino),
                    Some(_) => None,
                }
            }
            _ => None,
        };
        let ino = match reuse {
            Some(ino) => ino,
            None => {
                let ino = self.alloc_ino();
                self.fallbacks.insert(rel.to_path_buf(), (id, ino));
                ino
            }
        };
        self.bind_path(rel, ino)
    }

    /// A lower `(dev, ino)` as a number no branch-range number can equal (`None`: too
    /// large, or too many devices); 0 and 1 (the root's node id) are never used.
    fn lower_key(&mut self, (dev, ino): (u64, u64)) -> Option<u64> {
        if ino >> LOWER_INO_BITS != 0 {
            return None;
        }
        let idx = if dev == self.root_dev {
            0
        } else {
            let mut devs = self
                .devs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match devs.iter().position(|&d| d == dev) {
                Some(i) => i,
                None if devs.len() < MAX_DEVS => {
                    devs.push(dev);
                    devs.len() - 1
                }
                None => return None,
            }
        };
        let key = ((idx as u64) << LOWER_INO_BITS) | ino;
        (key > 1).then_some(key)
    }

    /// The number an unbound lower entry `ino` of a directory listing shows with
    /// (`d_ino` has no device: the project's own is assumed, as a mount point's `d_ino`
    /// is natively that of the directory under it).
    pub fn listed_ino(&self, ino: u64) -> u64 {
        if ino >> LOWER_INO_BITS == 0 && ino > 1 && !self.claimed.contains(&ino) {
            ino
        } else {
            BRANCH_INOS
        }
    }

    /// A branch object took number `ino` (see `claimed`).
    pub fn claim(&mut self, ino: u64) {
        self.claimed.insert(ino);
    }

    /// Make `ino` the kernel's inode for path `rel`.
    fn bind_path(&mut self, rel: &Path, ino: u64) -> u64 {
        match self.inodes.get(&ino).map(|i| &i.target) {
            None => {
                self.inodes.insert(
                    ino,
                    Inode {
                        target: InodeTarget::Path(rel.to_path_buf()),
                        lookups: 0,
                    },
                );
            }
            Some(InodeTarget::Path(p)) if p != rel => self.retarget(ino, rel),
            _ => {}
        }
        if self.path_ino.get(rel) != Some(&ino) {
            self.path_ino.insert(rel.to_path_buf(), ino);
        }
        ino
    }

    /// Path inode `ino` now stands for what `rel` shows; its old path no longer names it.
    fn retarget(&mut self, ino: u64, rel: &Path) {
        if let Some(Inode {
            target: InodeTarget::Path(p),
            ..
        }) = self.inodes.get_mut(&ino)
        {
            let old = std::mem::replace(p, rel.to_path_buf());
            if self.path_ino.get(&old) == Some(&ino) {
                self.path_ino.remove(&old);
            }
        }
    }

    /// The number a lower object at `rel` takes into the branch when it gets branch state
    /// (copy-up, directory metadata): the one the kernel knows it by, else its own. The
    /// number is claimed: lower's object, wherever else it shows, gets another.
    pub fn take_lower_ino(&mut self, rel: &Path, st: &libc::stat) -> u64 {
        let ino = match self.path_ino.get(rel) {
            Some(&ino) => ino,
            None => self.lower_ino(rel, st),
        };
        self.claim(ino);
        ino
    }

    /// Forget a path's inode binding (its object became a node or went away).
    pub fn unbind_path(&mut self, rel: &Path) -> Option<u64> {
        self.path_ino.remove(rel)
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        let Some(inode) = self.inodes.get_mut(&ino) else {
            return;
        };
        inode.lookups = inode.lookups.saturating_sub(n);
        if inode.lookups > 0 {
            return;
        }
        self.orphans.remove(&ino);
        if let Some(Inode {
            target: InodeTarget::Path(p),
            ..
        }) = self.inodes.remove(&ino)
        {
            if self.path_ino.get(&p) == Some(&ino) {
                self.path_ino.remove(&p);
            }
        }
    }

    /// A directory override for the lower directory `st` at `rel`, keeping its number.
    pub fn dir_from_lower(&mut self, rel: &Path, st: &libc::stat) -> DirOver {
        DirOver {
            ino: self.take_lower_ino(rel, st),
            meta: Meta::from_stat(st),
            lower: self.natural_lower(rel),
            lower_fp: Some(Fingerprint::from_stat(st)),
            nlink: st.st_nlink as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(dev: u64, ino: u64, mode: u32, nlink: u64) -> libc::stat {
        // SAFETY: an all-zero stat is a valid value.
        let mut s: libc::stat = unsafe { std::mem::zeroed() };
        s.st_dev = dev;
        s.st_ino = ino;
        s.st_mode = mode;
        s.st_nlink = nlink;
        s
    }

    const F: u32 = libc::S_IFREG | 0o644;
    const D: u32 = libc::S_IFDIR | 0o755;

    #[test]
    fn lower_numbers_show_through_and_never_collide() {
        let mut t = Tree::new(7);
        let p = Path::new;
        // The project's own device: the number itself, stable for the path.
        assert_eq!(t.lower_ino(p("a"), &st(7, 100, F, 1)), 100);
        assert_eq!(t.lower_ino(p("a"), &st(7, 100, F, 1)), 100);
        assert_eq!(t.lower_ino(p("d"), &st(7, 101, D, 2)), 101);
        // Another device: its index above bit 56.
        assert_eq!(t.lower_ino(p("m/x"), &st(9, 100, F, 1)), (1 << 56) | 100);
        // Too large, or the root's node id: a number from the branch's range.
        let big = t.lower_ino(p("big"), &st(7, 1 << 60, F, 1));
        assert!(big & BRANCH_INOS != 0);
        assert!(t.lower_ino(p("one"), &st(7, 1, F, 1)) & BRANCH_INOS != 0);
        // A hard link shares the number; a different object with a held number does not.
        assert_eq!(t.lower_ino(p("h1"), &st(7, 200, F, 2)), 200);
        assert_eq!(t.lower_ino(p("h2"), &st(7, 200, F, 2)), 200);
        let moved = t.lower_ino(p("b"), &st(7, 100, F, 1));
        assert!(moved & BRANCH_INOS != 0, "a still holds 100");
        assert_eq!(t.lower_ino(p("b"), &st(7, 100, F, 1)), moved, "kept for b");
        // Once the kernel forgets a's inode, b shows lower's number again.
        t.forget(100, 0);
        assert_eq!(t.lower_ino(p("b"), &st(7, 100, F, 1)), 100);
        // A number a branch object took is not given to lower's object elsewhere.
        t.claim(101);
        let other = t.lower_ino(p("e"), &st(7, 101, D, 2));
        assert!(other & BRANCH_INOS != 0);
        // Branch-range numbers are never lower numbers.
        assert!(t.alloc_ino() & BRANCH_INOS != 0);
    }
}

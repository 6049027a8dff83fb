//! The overlay's operations on the branch view, independent of the FUSE wire types:
//! copy-up, materialising directory metadata, creating and removing entries, listing.
//! `fs.rs` maps each FUSE request onto these.

use crate::content::Store;
use crate::ignore_rules::IgnoreRules;
use crate::lower::Lower;
use crate::node::{DirOver, Meta, Node, NodeKind};
use crate::tree::{split, Entry, InodeTarget, Obj, Tree};
use crate::watch::{Change, Invalidation, Watched};
use fuser::{FileAttr, FileType, INodeNo};
use rustc_hash::FxHashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

/// Errors inside the overlay are plain errno values, replied as-is.
pub(crate) type Res<T> = Result<T, i32>;

pub(crate) fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// An open file or directory.
pub(crate) enum Handle {
    /// A lower file opened read-only; reads switch to the node if it is copied up later.
    Lower {
        ino: u64,
        file: File,
    },
    Node(Arc<Node>),
    /// Directory listing snapshot taken at opendir (offsets index into it).
    Dir(Arc<Vec<DirEntry>>),
}

/// One branch's live state.
pub(crate) struct Overlay {
    pub lower: Lower,
    pub store: Store,
    pub ignore: IgnoreRules,
    tree: Mutex<Tree>,
    handles: Mutex<FxHashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    /// Present when lower changes are watched; only then may the kernel cache lower objects.
    pub watch: Option<Arc<crate::watch::LowerWatch>>,
    /// Open lower files by inode, for reads that come without a handle (no-open mode).
    lower_fds: Mutex<lru::LruCache<u64, Arc<File>>>,
    /// Directory listings being read without a handle (no-opendir mode), by inode.
    listings: Mutex<FxHashMap<u64, Arc<Vec<DirEntry>>>>,
    /// Tells the kernel about changes it did not ask for (a write that dropped setuid).
    pub notifier: std::sync::OnceLock<fuser::Notifier>,
}

/// One entry of a directory listing: inode, type, name.
pub(crate) type DirEntry = (u64, FileType, OsString);

/// Lower files kept open for handle-less reads; the kernel's page cache absorbs most
/// reads, so a modest number suffices and stays well inside the default fd limit.
const LOWER_FD_CACHE: usize = 256;

/// Who is creating an object, for ownership of new entries.
#[derive(Clone, Copy)]
pub(crate) struct Creds {
    pub uid: u32,
    pub gid: u32,
}

impl Overlay {
    pub fn new(lower: Lower, store: Store, ignore: IgnoreRules) -> Overlay {
        // SHADE_KERNEL_CACHE=0 turns kernel caching of lower objects off (to measure it,
        // or to rule it out when chasing a bug).
        let cache = std::env::var_os("SHADE_KERNEL_CACHE").is_none_or(|v| v != "0");
        let root_dev = match lower.stat(Path::new("")) {
            Ok(Some(st)) => st.st_dev,
            _ => 0,
        };
        let watch = cache
            .then(|| crate::watch::LowerWatch::new(lower.root()))
            .flatten();
        Overlay::with_tree(lower, store, ignore, watch, Tree::new(root_dev))
    }

    /// An overlay over `tree` (a pooled connection's next branch starts from the inodes the
    /// kernel still holds, `reset.rs`) that reports lower changes through `watch`.
    pub fn with_tree(
        lower: Lower,
        store: Store,
        ignore: IgnoreRules,
        watch: Option<Arc<crate::watch::LowerWatch>>,
        tree: Tree,
    ) -> Overlay {
        Overlay {
            watch,
            lower,
            store,
            ignore,
            tree: Mutex::new(tree),
            handles: Mutex::new(FxHashMap::default()),
            next_fh: AtomicU64::new(1),
            // `sparse`: no table until used (a detached branch never uses it).
            lower_fds: Mutex::new(lru::LruCache::sparse(
                std::num::NonZeroUsize::new(LOWER_FD_CACHE).unwrap_or(std::num::NonZeroUsize::MIN),
            )),
            listings: Mutex::new(FxHashMap::default()),
            notifier: std::sync::OnceLock::new(),
        }
    }

    /// The branch's own state without what serving it on a connection added (handles,
    /// cached lower descriptors and listings, the watch, the notifier): a branch that lets
    /// its connection go keeps only this (`attach.rs`).
    pub fn into_parts(self) -> (Lower, Store, IgnoreRules, Tree) {
        let tree = self
            .tree
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        (self.lower, self.store, self.ignore, tree)
    }

    pub fn tree(&self) -> MutexGuard<'_, Tree> {
        self.tree.lock().unwrap_or_else(PoisonError::into_inner)
    }

    // ----- handles -------------------------------------------------------------------

    /// Handles the kernel holds (OPEN or OPENDIR without RELEASE yet): a connection that
    /// still has some is not reused (`pool.rs`).
    pub fn open_handles(&self) -> usize {
        self.handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    pub fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, Arc::new(h));
        fh
    }

    pub fn handle(&self, fh: u64) -> Res<Arc<Handle>> {
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fh)
            .cloned()
            .ok_or(libc::EBADF)
    }

    pub fn drop_handle(&self, fh: u64) {
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh);
    }

    // ----- handle-less I/O (no-open mode) ---------------------------------------------

    /// The node a write to `ino` goes to, copying a lower file up on its first write.
    pub fn write_target(&self, ino: u64) -> Res<Arc<Node>> {
        let mut t = self.tree();
        match self.obj_of(&t, ino)? {
            Obj::Node(n) => Ok(n),
            obj if obj.is_dir() => Err(libc::EISDIR),
            _ => {
                let rel = Self::path_of(&t, ino)?;
                self.copy_up(&mut t, &rel, u64::MAX)
            }
        }
    }

    /// Read from whatever `ino` is now: its node, or the lower file (fd cached).
    pub fn read_ino(&self, ino: u64, buf: &mut [u8], offset: u64) -> Res<usize> {
        let file = {
            let mut t = self.tree();
            match t.inodes.get(&ino).map(|i| &i.target) {
                Some(InodeTarget::Node(n)) => {
                    let n = n.clone();
                    drop(t);
                    return n.read_at(buf, offset).map_err(errno);
                }
                Some(InodeTarget::Gone(_)) => t.orphans.get(&ino).cloned().ok_or(libc::ENOENT)?,
                Some(InodeTarget::Path(p)) => {
                    let cached = self
                        .lower_fds
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get(&ino)
                        .cloned();
                    match cached {
                        Some(f) if offset > 0 => f,
                        Some(f) => {
                            // A read from the start: a new pass over the file, which may
                            // see a version changed since the descriptor was opened.
                            if let Some(lp) = t.natural_lower(p) {
                                t.reads.file(&lp, &fstat(&f).map_err(errno)?);
                            }
                            f
                        }
                        None => {
                            let Obj::Lower(lp, _) = t.resolve(&self.lower, p)? else {
                                return Err(libc::EIO);
                            };
                            let f = Arc::new(self.lower.open_file(&lp).map_err(errno)?);
                            // The first read of this file: note what is served (`reads.rs`).
                            t.reads.file(&lp, &fstat(&f).map_err(errno)?);
                            self.lower_fds
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .put(ino, f.clone());
                            f
                        }
                    }
                }
                None => return Err(libc::ENOENT),
            }
        };
        crate::content::read_full_at(&file, buf, offset).map_err(errno)
    }

    /// A lower file changed or went away: do not read it through a stale fd.
    pub fn forget_lower_fd(&self, ino: u64) {
        self.lower_fds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop(&ino);
    }

    /// The listing of directory inode `ino`, with `.` and `..`.
    pub fn listing(&self, ino: u64) -> Res<Vec<DirEntry>> {
        let t = self.tree();
        let rel = Self::path_of(&t, ino)?;
        if !t.resolve(&self.lower, &rel)?.is_dir() {
            return Err(libc::ENOTDIR);
        }
        let parent_ino = if rel.as_os_str().is_empty() {
            1
        } else {
            t.path_ino.get(split(&rel).0).copied().unwrap_or(1)
        };
        let mut entries = vec![
            (ino, FileType::Directory, ".".into()),
            (parent_ino, FileType::Directory, "..".into()),
        ];
        let mut t = t;
        if let Some(src) = t.lower_of(&rel) {
            if let Some(w) = &self.watch {
                w.watch_dir(&src);
            }
            // Taken before the entries are read: a change meanwhile moves its mtime.
            // A warm-up walk's listing is shade's, not the branch's read (`warm.rs`).
            if crate::warm::recording() {
                if let Ok(Some(st)) = self.lower.stat(&src) {
                    t.reads.listing(&rel, &src, &st);
                }
            }
        }
        entries.extend(self.list(&t, &rel)?);
        Ok(entries)
    }

    /// The listing a handle-less readdir at `offset` continues (taken afresh at 0).
    pub fn listing_at(&self, ino: u64, offset: u64) -> Res<Arc<Vec<DirEntry>>> {
        let mut cache = self.listings.lock().unwrap_or_else(PoisonError::into_inner);
        if offset > 0 {
            if let Some(l) = cache.get(&ino) {
                return Ok(l.clone());
            }
        }
        drop(cache);
        let l = Arc::new(self.listing(ino)?);
        cache = self.listings.lock().unwrap_or_else(PoisonError::into_inner);
        cache.insert(ino, l.clone());
        Ok(l)
    }

    /// A handle-less listing was read to its end.
    pub fn listing_done(&self, ino: u64) {
        self.listings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ino);
    }

    // ----- paths and inodes ----------------------------------------------------------

    /// The merged-view path a directory-like inode stands for.
    pub fn path_of(t: &Tree, ino: u64) -> Res<PathBuf> {
        match t.inodes.get(&ino).map(|i| &i.target) {
            Some(InodeTarget::Path(p)) => Ok(p.clone()),
            Some(InodeTarget::Node(_)) => Err(libc::ENOTDIR),
            Some(InodeTarget::Gone(_)) | None => Err(libc::ENOENT),
        }
    }

    /// The path of `name` inside directory inode `parent`, with the name checked.
    pub fn child_path(&self, t: &Tree, parent: u64, name: &OsStr) -> Res<PathBuf> {
        let path = Self::lookup_path(t, parent, name)?;
        // shade's own state directory (see `Lower::hide`) cannot be made in the branch
        // either: accept would write it into the real one.
        if self.lower.is_hidden(&path) {
            return Err(libc::EACCES);
        }
        // Changes need the parent to exist now: lower may have lost it meanwhile.
        match t.resolve(&self.lower, split(&path).0)? {
            o if o.is_dir() => Ok(path),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// The path of `name` in directory inode `parent`, for lookups: the kernel only looks
    /// names up in directories, and a parent lower lost makes the child missing anyway.
    pub fn lookup_path(t: &Tree, parent: u64, name: &OsStr) -> Res<PathBuf> {
        if name.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        if name.is_empty() || name == "." || name == ".." || name.as_encoded_bytes().contains(&b'/')
        {
            return Err(libc::EINVAL);
        }
        Ok(Self::path_of(t, parent)?.join(name))
    }

    /// Resolve what inode `ino` shows now.
    pub fn obj_of(&self, t: &Tree, ino: u64) -> Res<Obj> {
        match t.inodes.get(&ino).map(|i| &i.target) {
            Some(InodeTarget::Path(p)) => t.resolve(&self.lower, p),
            Some(InodeTarget::Node(n)) => Ok(Obj::Node(n.clone())),
            Some(InodeTarget::Gone(_)) | None => Err(libc::ENOENT),
        }
    }

    /// Attributes of inode `ino`.
    pub fn attr_of(&self, t: &Tree, ino: u64) -> Res<FileAttr> {
        if let Some(InodeTarget::Gone(a)) = t.inodes.get(&ino).map(|i| &i.target) {
            return Ok(**a);
        }
        Ok(attr(ino, &self.obj_of(t, ino)?))
    }

    /// Register one more kernel reference to `rel` and return its attributes.
    pub fn entry(&self, t: &mut Tree, rel: &Path, obj: &Obj) -> FileAttr {
        self.watch_obj(obj);
        let ino = t.ino_for(rel, obj);
        if let Some(i) = t.inodes.get_mut(&ino) {
            i.lookups += 1;
        }
        attr(ino, obj)
    }

    /// Watch the lower directory behind `obj`, if any, before the kernel caches it.
    pub fn watch_obj(&self, obj: &Obj) {
        let Some(w) = &self.watch else { return };
        match obj {
            Obj::Lower(lp, st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                w.watch_dir(lp);
            }
            Obj::Dir(DirOver {
                lower: Some(lp), ..
            }) => {
                w.watch_dir(lp);
            }
            _ => {}
        }
    }

    /// Whether the kernel may cache what this branch replies (see `watch.rs`).
    pub fn caching(&self) -> bool {
        self.watch.is_some()
    }

    /// The node inode `ino` currently stands for, if it is branch-owned.
    pub fn node_of(&self, ino: u64) -> Option<Arc<Node>> {
        match self.tree().inodes.get(&ino).map(|i| &i.target) {
            Some(InodeTarget::Node(n)) => Some(n.clone()),
            _ => None,
        }
    }

    /// The inode at `rel` no longer exists there: keep answering the kernel with its last
    /// attributes (link count 0) until it forgets it.
    pub fn detach(&self, t: &mut Tree, rel: &Path) {
        let Some(ino) = t.unbind_path(rel) else {
            return;
        };
        let gone = match t.resolve(&self.lower, rel) {
            Ok(obj) => {
                if let Obj::Lower(_, st) = &obj {
                    if st.st_nlink > 1 && st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                        // Another name of this hard-linked file leads to the same inode:
                        // it lives on there (writes to it must still find it).
                        let other = t
                            .path_ino
                            .iter()
                            .find(|(_, i)| **i == ino)
                            .map(|(p, _)| p.clone());
                        if let Some(other) = other {
                            if let Some(i) = t.inodes.get_mut(&ino) {
                                i.target = InodeTarget::Path(other);
                            }
                            return;
                        }
                    }
                }
                if let Obj::Lower(lp, st) = &obj {
                    // Handle-less reads of an open, unlinked lower file still need it.
                    if self.caching() && st.st_mode & libc::S_IFMT == libc::S_IFREG {
                        if let Ok(f) = self.lower.open_file(lp) {
                            t.orphans.insert(ino, Arc::new(f));
                        }
                    }
                }
                let mut a = attr(ino, &obj);
                a.nlink = 0;
                a
            }
            Err(_) => return,
        };
        if let Some(i) = t.inodes.get_mut(&ino) {
            i.target = InodeTarget::Gone(Box::new(gone));
        }
    }

    // ----- copy-up and materialisation ---------------------------------------------

    /// Make the non-directory at `rel` branch-owned, copying at most `keep` bytes of a
    /// lower file's content (`u64::MAX`: all of it; 0 for an open with `O_TRUNC`).
    pub fn copy_up(&self, t: &mut Tree, rel: &Path, keep: u64) -> Res<Arc<Node>> {
        let (lp, st) = match t.resolve(&self.lower, rel)? {
            Obj::Node(n) => return Ok(n),
            Obj::Dir(_) => return Err(libc::EISDIR),
            Obj::Lower(lp, st) => (lp, st),
        };
        let kind = NodeKind::from_mode(st.st_mode).ok_or(libc::EISDIR)?;
        let ignored = self.ignore.is_ignored(rel, false);
        let mut size = st.st_size as u64;
        let data = if kind == NodeKind::File {
            size = size.min(keep);
            let mut content = self.store.create(ignored, size).map_err(errno)?;
            if size > 0 {
                let src = self.lower.open_file(&lp).map_err(errno)?;
                content.fill_from(&src, size).map_err(errno)?;
            }
            Some(content)
        } else {
            None
        };
        let target = if kind == NodeKind::Symlink {
            self.lower.read_link(&lp).map_err(errno)?
        } else {
            OsString::new()
        };
        let mut meta = Meta::from_stat(&st);
        meta.xattrs = self
            .lower
            .xattrs(&lp, kind == NodeKind::Symlink)
            .into_iter()
            .collect();
        // The file keeps its number (and so its identity) through the copy-up.
        let ino = t.take_lower_ino(rel, &st);
        t.unbind_path(rel);
        let node = Arc::new(Node::new(ino, kind, meta, size, data, target, Some(lp)));
        if let Some(i) = t.inodes.get_mut(&ino) {
            i.target = InodeTarget::Node(node.clone());
        }
        t.set(&self.lower, rel, Entry::Node(node.clone()));
        if st.st_nlink > 1 {
            self.adopt_other_names(t, rel, &node, &st);
        }
        Ok(node)
    }

    /// Hard-linked lower file `st` became `node`. The kernel reaches every name of it it
    /// has looked up through one inode, and writes arrive by inode, not by name: those
    /// names become links of the node, as one file natively. A name not looked up yet
    /// stays lower's file (and gets a number of its own), as overlayfs breaks such links.
    fn adopt_other_names(&self, t: &mut Tree, rel: &Path, node: &Arc<Node>, st: &libc::stat) {
        let names: Vec<PathBuf> = t
            .path_ino
            .iter()
            .filter(|(p, i)| **i == node.ino && p.as_path() != rel)
            .map(|(p, _)| p.clone())
            .collect();
        for p in names {
            t.path_ino.remove(&p);
            let same = matches!(
                t.resolve(&self.lower, &p),
                Ok(Obj::Lower(_, s)) if s.st_dev == st.st_dev && s.st_ino == st.st_ino
            );
            if same {
                t.set(&self.lower, &p, Entry::Node(node.clone()));
                node.state().nlink += 1;
            }
        }
    }

    /// Give the directory at `rel` its own metadata record (copied from lower first).
    pub fn dir_over<'t>(&self, t: &'t mut Tree, rel: &Path) -> Res<&'t mut DirOver> {
        let needs = match t.slots.get(rel).map(|s| &s.entry) {
            Some(Entry::Dir(_)) => None,
            Some(_) => return Err(libc::ENOTDIR),
            None => match t.resolve(&self.lower, rel)? {
                Obj::Lower(_, st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let mut d = t.dir_from_lower(rel, &st);
                    d.meta.xattrs = t
                        .natural_lower(rel)
                        .map(|lp| self.lower.xattrs(&lp, false).into_iter().collect())
                        .unwrap_or_default();
                    Some(d)
                }
                _ => return Err(libc::ENOTDIR),
            },
        };
        if let Some(d) = needs {
            t.set(&self.lower, rel, Entry::Dir(d));
        }
        match t.slots.get_mut(rel).map(|s| &mut s.entry) {
            Some(Entry::Dir(d)) => Ok(d),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// Unlink/rmdir: `rel` is gone from the branch (the kernel may still hold its inode)
    /// and its parent lost an entry (`subdirs`: -1 for a directory).
    pub fn remove_entry(&self, t: &mut Tree, rel: &Path, subdirs: i32) -> Res<()> {
        self.detach(t, rel);
        t.remove(&self.lower, rel);
        self.touch_dir(t, crate::tree::split(rel).0, subdirs)
    }

    /// Directory `dir` gained or lost an entry: bump its times and subdirectory count.
    pub fn touch_dir(&self, t: &mut Tree, dir: &Path, subdirs: i32) -> Res<()> {
        let d = self.dir_over(t, dir)?;
        d.meta.modified();
        d.nlink = (d.nlink as i64 + subdirs as i64).max(2) as u32;
        Ok(())
    }

    /// Apply `f` to the metadata of whatever inode `ino` is, copying it up first.
    pub fn with_meta<R>(
        &self,
        ino: u64,
        f: impl FnOnce(&mut Meta, Option<&Node>) -> Res<R>,
    ) -> Res<R> {
        let mut t = self.tree();
        match self.obj_of(&t, ino)? {
            Obj::Node(n) => {
                let mut st = n.state();
                f(&mut st.meta, Some(&n))
            }
            obj if obj.is_dir() => {
                let rel = Self::path_of(&t, ino)?;
                let d = self.dir_over(&mut t, &rel)?;
                f(&mut d.meta, None)
            }
            _ => {
                let rel = Self::path_of(&t, ino)?;
                let n = self.copy_up(&mut t, &rel, u64::MAX)?;
                drop(t);
                let mut st = n.state();
                f(&mut st.meta, Some(&n))
            }
        }
    }

    /// Owner and group of a new entry in `parent` (BSD group semantics for setgid dirs),
    /// and whether it inherits setgid (directories do).
    pub fn owner_for(&self, t: &Tree, parent: &Path, creds: Creds) -> (u32, u32, bool) {
        let pattr = t.resolve(&self.lower, parent).map(|o| attr(0, &o));
        match pattr {
            Ok(a) if a.perm as u32 & libc::S_ISGID != 0 => (creds.uid, a.gid, true),
            _ => (creds.uid, creds.gid, false),
        }
    }

    /// A new branch-owned node.
    pub fn new_node(
        &self,
        t: &mut Tree,
        rel: &Path,
        kind: NodeKind,
        meta: Meta,
        target: OsString,
    ) -> Res<Arc<Node>> {
        let ignored = self.ignore.is_ignored(rel, false);
        let data = if kind == NodeKind::File {
            Some(self.store.create(ignored, 0).map_err(errno)?)
        } else {
            None
        };
        let size = if kind == NodeKind::Symlink {
            target.len() as u64
        } else {
            0
        };
        let ino = t.alloc_ino();
        Ok(Arc::new(Node::new(
            ino, kind, meta, size, data, target, None,
        )))
    }

    /// Put a freshly created object at `rel` and account for it in its parent.
    pub fn place(&self, t: &mut Tree, rel: &Path, entry: Entry, is_dir: bool) -> Res<()> {
        for d in t.descendants(rel) {
            // stale whiteouts under a re-created directory: an opaque dir hides lower anyway
            t.forget_slot(&d);
        }
        t.children.remove(rel);
        t.set(&self.lower, rel, entry);
        let (parent, _) = split(rel);
        self.touch_dir(t, parent, if is_dir { 1 } else { 0 })
    }

    /// The merged listing of directory `rel`: (name, kind, inode if known or lower ino).
    pub fn list(&self, t: &Tree, rel: &Path) -> Res<Vec<(u64, FileType, OsString)>> {
        let mut out = Vec::new();
        if let Some(src) = t.lower_of(rel) {
            for e in self.lower.read_dir(&src).map_err(errno)? {
                let child = rel.join(&e.name);
                if t.slots.contains_key(&child) {
                    continue;
                }
                let ino = match t.path_ino.get(&child) {
                    Some(&ino) => ino,
                    None => t.listed_ino(e.ino),
                };
                out.push((ino, mode_type(e.file_type), e.name));
            }
        }
        for name in t.slot_children(rel) {
            let child = rel.join(name);
            let (ino, kind) = match t.slots.get(&child).map(|s| &s.entry) {
                Some(Entry::Node(n)) => (n.ino, n.kind.file_type()),
                Some(Entry::Dir(d)) => (d.ino, FileType::Directory),
                _ => continue,
            };
            out.push((ino, kind, name.clone()));
        }
        Ok(out)
    }

    /// Whether a new entry at `rel` (with `extra` bytes, a symlink's target) fits the
    /// branch's metadata budget; ENOSPC when it does not.
    pub fn room_for(&self, t: &Tree, rel: &Path, extra: u64) -> Res<()> {
        self.store.limits().room_for_entry(t.slot_bytes, rel, extra)
    }

    /// Whether directory `rel` shows no entries.
    pub fn is_empty_dir(&self, t: &Tree, rel: &Path) -> Res<bool> {
        Ok(self.list(t, rel)?.is_empty())
    }
}

/// `fstat` of an open lower file: what its data is now (for `Reads`).
pub(crate) fn fstat(f: &File) -> std::io::Result<libc::stat> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and out buffer.
    if unsafe { libc::fstat(f.as_raw_fd(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn mode_type(m: u32) -> FileType {
    match m & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// `stat` attributes of a resolved object under inode number `ino`.
/// The attributes of an empty directory numbered `ino`: what a number answers with when
/// the object it stood for is gone and nothing else stands at its path.
pub(crate) fn empty_dir_attr(ino: u64) -> FileAttr {
    let empty = crate::node::DirOver {
        ino,
        meta: crate::node::Meta::new(0, 0, 0),
        lower: None,
        lower_fp: None,
        nlink: 0,
    };
    attr(ino, &Obj::Dir(empty))
}

pub(crate) fn attr(ino: u64, obj: &Obj) -> FileAttr {
    match obj {
        Obj::Lower(_, st) => FileAttr {
            ino: INodeNo(ino),
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: crate::node::time(st.st_atime, st.st_atime_nsec),
            mtime: crate::node::time(st.st_mtime, st.st_mtime_nsec),
            ctime: crate::node::time(st.st_ctime, st.st_ctime_nsec),
            crtime: SystemTime::UNIX_EPOCH,
            kind: mode_type(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
            flags: 0,
        },
        Obj::Dir(d) => meta_attr(ino, &d.meta, FileType::Directory, 4096, d.nlink),
        Obj::Node(n) => {
            let st = n.state();
            meta_attr(ino, &st.meta, n.kind.file_type(), st.size, st.nlink)
        }
    }
}

fn meta_attr(ino: u64, m: &Meta, kind: FileType, size: u64, nlink: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: m.atime,
        mtime: m.mtime,
        ctime: m.ctime,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: m.perm as u16,
        nlink,
        uid: m.uid,
        gid: m.gid,
        rdev: m.rdev,
        blksize: 4096,
        flags: 0,
    }
}

/// Which kernel objects to invalidate for lower changes `(dir, name)`, skipping paths
/// the branch overrides (its own view does not change). Lower paths are shown at the
/// same branch path unless a directory was renamed in the branch; entries under renamed
/// directories are re-validated when their attribute timeout expires.
impl Watched for Overlay {
    fn invalidations(&self, changed: &[Change]) -> Vec<Invalidation> {
        let t = self.tree();
        let mut out = Vec::new();
        for (lower_dir, name) in changed {
            for dir in shown_at(&t, lower_dir) {
                let dir_ino = t.path_ino.get(&dir).copied();
                match name {
                    Some(n) => {
                        let child = dir.join(n);
                        if matches!(
                            t.slots.get(&child).map(|s| &s.entry),
                            Some(Entry::Node(_) | Entry::Whiteout)
                        ) {
                            continue;
                        }
                        out.push((dir_ino, Some(n.clone()), t.path_ino.get(&child).copied()));
                        out.push((None, None, dir_ino));
                    }
                    None => out.push((None, None, dir_ino)),
                }
            }
        }
        out
    }

    fn forget_lower_fd(&self, ino: u64) {
        Overlay::forget_lower_fd(self, ino);
    }
}

/// The branch directories whose entries come from lower directory `lower_dir`: itself
/// where the branch left it in place, or its place under a directory the branch renamed
/// (a moved directory keeps reading its children from its old lower path).
fn shown_at(t: &Tree, lower_dir: &Path) -> Vec<PathBuf> {
    if t.lower_of(lower_dir).as_deref() == Some(lower_dir) {
        return vec![lower_dir.to_path_buf()];
    }
    let mut dirs: Vec<PathBuf> = t
        .slots
        .iter()
        .filter_map(|(path, slot)| {
            let Entry::Dir(d) = &slot.entry else {
                return None;
            };
            let rest = lower_dir.strip_prefix(d.lower.as_ref()?).ok()?;
            let dir = if rest.as_os_str().is_empty() {
                path.clone()
            } else {
                path.join(rest)
            };
            (t.lower_of(&dir).as_deref() == Some(lower_dir)).then_some(dir)
        })
        .collect();
    // A moved directory and a slot below it can name the same place.
    dirs.sort();
    dirs.dedup();
    dirs
}

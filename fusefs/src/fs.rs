//! The FUSE face of a branch: one method per request, explicit replies.

use crate::idmap;
use crate::node::{DirOver, Meta, NodeKind};
use crate::overlay::{attr, errno, Creds, Handle, Overlay, Res};
use crate::passthrough::{Answer, Passthrough, FH_BIT};
use crate::tree::{split, Entry, InodeTarget, Obj};
use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the kernel may cache what we reply. Lower objects can change under the
/// branch at any time: they are cached only while the lower watcher invalidates them
/// (`watch.rs`); branch-owned objects change only through us.
const TTL_UNCACHED: Duration = Duration::ZERO;
const TTL_OWNED: Duration = Duration::from_secs(1);
const TTL_WATCHED: Duration = Duration::from_secs(30);

impl ShadeFs {
    /// The listing a readdir continues: by handle, or by inode in no-opendir mode.
    fn listing_for(
        o: &Overlay,
        ino: u64,
        fh: u64,
        offset: u64,
    ) -> Res<Arc<Vec<crate::overlay::DirEntry>>> {
        if fh == 0 {
            return o.listing_at(ino, offset);
        }
        match &*o.handle(fh)? {
            Handle::Dir(entries) => Ok(entries.clone()),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn ttl(o: &Overlay, owned: bool) -> Duration {
        if o.caching() {
            TTL_WATCHED
        } else if owned {
            TTL_OWNED
        } else {
            TTL_UNCACHED
        }
    }

    /// An open in passthrough mode: unchanged lower files opened read-only pass through to
    /// the lower file; everything else is served by inode, as in no-open mode.
    fn open_passthrough(
        o: &Overlay,
        p: &Passthrough,
        ino: INodeNo,
        flags: OpenFlags,
        reply: ReplyOpen,
    ) {
        let read_only = flags.0 & libc::O_ACCMODE == libc::O_RDONLY && flags.0 & libc::O_TRUNC == 0;
        let mut lower = None;
        if read_only {
            let mut t = o.tree();
            if let Ok(Obj::Lower(lp, _)) = o.obj_of(&t, ino.0) {
                let file = match o.lower.open_file(&lp) {
                    Ok(f) => f,
                    Err(e) => return reply.error(err(errno(e))),
                };
                // Its data is read through this descriptor only: note what it is now.
                if let Ok(st) = crate::overlay::fstat(&file) {
                    t.reads.file(&lp, &st);
                    lower = Some(file);
                }
            }
        }
        match p.open(ino.0, lower.as_ref(), |f| reply.open_backing(f)) {
            Answer::Through(fh) => p.with_backing(ino.0, |b| match b {
                Some(b) => reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), b),
                None => reply.error(Errno::EIO),
            }),
            Answer::Cached => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Answer::Busy => reply.error(Errno::ETXTBSY),
        }
    }

    fn open_flags(o: &Overlay) -> FopenFlags {
        if o.caching() {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }
}

thread_local! {
    /// Each FUSE thread's READ buffer, kept between requests: a fresh 1 MiB `Vec` per
    /// READ is an mmap, 256 page faults and a munmap (allocations that size bypass the
    /// heap), which halved first-read throughput.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` on this thread's read buffer, at least `size` bytes long.
fn with_read_buf<R>(size: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    READ_BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < size {
            b.resize(size, 0);
        }
        f(&mut b[..size])
    })
}

/// Answer an op that returns nothing but success or an errno.
fn reply_empty(reply: ReplyEmpty, res: Res<()>) {
    match res {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e)),
    }
}

/// Whether `name` is a `system.*` attribute, refused in a branch as on a file system that
/// has none: POSIX ACLs stored as plain attributes would never change the mode bits they
/// stand for (`cp -p` sets the mode through one, and falls back to chmod), and other
/// `system.*` names are the kernel's to interpret (writing one back made accept fail).
fn system_xattr(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b"system.")
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl ShadeFs {
    /// Attributes as the kernel must see them: ids shifted (`idmap.rs`).
    fn shown(&self, mut a: FileAttr) -> FileAttr {
        a.uid = idmap::show(self.shift, a.uid);
        a.gid = idmap::show(self.shift, a.gid);
        a
    }

    /// The stored ids of who asks, to own what it creates. shade itself (the agent's file
    /// tools write through the mount, outside the command's namespace) creates as the
    /// command's root would. Any other caller whose ids the shift does not map creates
    /// nothing: the kernel's EOVERFLOW for an fsuid without a mapping.
    fn creds(&self, req: &Request) -> Res<Creds> {
        // SAFETY: geteuid/getegid cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let take = |id: u32, own: u32| match idmap::take(self.shift, id) {
            Some(real) => Ok(real),
            None if id == own => Ok(0),
            None => Err(libc::EOVERFLOW),
        };
        Ok(Creds {
            uid: take(req.uid(), euid)?,
            gid: take(req.gid(), egid)?,
        })
    }

    /// Who changes a file, in stored ids (unmapped ones as the overflow id, which owns
    /// nothing a setuid judgement could favour).
    fn caller(&self, req: &Request) -> crate::privs::Caller {
        let take = |id| idmap::take(self.shift, id).unwrap_or(idmap::OVERFLOW);
        crate::privs::Caller {
            pid: req.pid(),
            uid: take(req.uid()),
            gid: take(req.gid()),
            shift: self.shift,
        }
    }

    /// A chown's new id in stored ids; one the shift does not map is invalid, as the
    /// kernel says of an id without a mapping.
    fn take_owner(&self, id: Option<u32>) -> Res<Option<u32>> {
        id.map(|id| idmap::take(self.shift, id).ok_or(libc::EINVAL))
            .transpose()
    }
}

fn to_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// What a new non-directory object is made of.
struct NewNode<'a> {
    kind: NodeKind,
    perm: u32,
    rdev: u32,
    target: &'a OsStr,
}

impl NewNode<'_> {
    fn plain(kind: NodeKind, perm: u32) -> NewNode<'static> {
        NewNode {
            kind,
            perm,
            rdev: 0,
            target: OsStr::new(""),
        }
    }
}

/// The attribute changes of one `setattr`.
struct AttrChange {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    ctime: Option<SystemTime>,
    /// Who asks: a truncate by a process without CAP_FSETID drops setuid.
    caller: crate::privs::Caller,
}

/// The filesystem served for one branch.
pub(crate) struct ShadeFs {
    /// The branch this connection serves now: one connection serves one branch at a time,
    /// and a pooled one passes to the next branch by a swap (`pool.rs`).
    pub current: Arc<Current>,
    /// Open tracking of the opt-in passthrough mode (`passthrough.rs`); `None`: no-open mode.
    pub passthrough: Option<Passthrough>,
    /// Ids shown shifted and taken back at this boundary (`idmap.rs`); `None`: as stored.
    pub shift: Option<idmap::IdShift>,
}

/// The overlay a connection serves, swapped when the connection passes from one branch to
/// the next (`pool.rs`). A request loads it once ([`ShadeFs::ov`]) and works on that
/// overlay throughout: a swap in the middle of a request does not change what it sees.
/// An `ArcSwap`: a load touches no shared counter or lock (a `RwLock<Arc>` was a lock and
/// an `Arc` count bounced between the FUSE threads on every request).
pub(crate) struct Current(arc_swap::ArcSwap<Overlay>);

impl Current {
    pub fn new(overlay: Arc<Overlay>) -> Current {
        Current(arc_swap::ArcSwap::new(overlay))
    }

    /// The overlay served now, to keep.
    pub fn get(&self) -> Arc<Overlay> {
        self.0.load_full()
    }

    /// Serve `next` from now on; returns what was served.
    pub fn swap(&self, next: Arc<Overlay>) -> Arc<Overlay> {
        self.0.swap(next)
    }
}

impl ShadeFs {
    /// The overlay to serve this request with: called once per request, whose every step
    /// then uses what it returned (helpers take it as `o: &Overlay`).
    fn ov(&self) -> arc_swap::Guard<Arc<Overlay>> {
        // Every request passes here, on one of the session's threads: they work for the
        // commands, at the commands' priority.
        crate::priority::serve_at_commands_priority();
        self.current.0.load()
    }

    fn create_node(
        &self,
        o: &Overlay,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        new: NewNode<'_>,
    ) -> Res<(FileAttr, Arc<crate::node::Node>)> {
        let NewNode {
            kind,
            perm,
            rdev,
            target,
        } = new;
        let mut t = o.tree();
        let rel = o.child_path(&t, parent.0, name)?;
        if t.resolve(&o.lower, &rel).is_ok() {
            return Err(libc::EEXIST);
        }
        o.room_for(&t, &rel, target.len() as u64)?;
        let (parent_rel, _) = split(&rel);
        let (uid, gid, _) = o.owner_for(&t, parent_rel, self.creds(req)?);
        let mut meta = Meta::new(perm, uid, gid);
        meta.rdev = rdev;
        let node = o.new_node(&mut t, &rel, kind, meta, target.to_os_string())?;
        o.place(&mut t, &rel, Entry::Node(node.clone()), false)?;
        let a = o.entry(&mut t, &rel, &Obj::Node(node.clone()));
        Ok((a, node))
    }

    fn do_setattr(o: &Overlay, ino: u64, change: AttrChange) -> Res<FileAttr> {
        let AttrChange {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            caller,
        } = change;
        if let Some(size) = size {
            let node = {
                let mut t = o.tree();
                match o.obj_of(&t, ino)? {
                    Obj::Node(n) => n,
                    obj if obj.is_dir() => return Err(libc::EISDIR),
                    _ => {
                        let rel = Overlay::path_of(&t, ino)?;
                        o.copy_up(&mut t, &rel, size)?
                    }
                }
            };
            if node.kind != NodeKind::File {
                return Err(libc::EINVAL);
            }
            let mut data = node.data_mut();
            let content = data.as_mut().ok_or(libc::EINVAL)?;
            o.store.resize(content, size).map_err(errno)?;
            content.set_len(size).map_err(errno)?;
            let mut st = node.state();
            st.size = size;
            st.meta.modified();
            if crate::privs::has_privs(&st.meta) && !crate::privs::may_keep(caller) {
                crate::privs::kill(&mut st.meta, caller);
            }
        }
        if mode.is_some()
            || uid.is_some()
            || gid.is_some()
            || atime.is_some()
            || mtime.is_some()
            || ctime.is_some()
        {
            o.with_meta(ino, |m, node| {
                if let Some(mode) = mode {
                    m.perm = mode & 0o7777;
                }
                // A chown of a non-directory drops setuid/setgid, whoever does it (the
                // kernel leaves that to us under FUSE_HANDLE_KILLPRIV_V2); judged on the
                // group the file had.
                if (uid.is_some() || gid.is_some()) && mode.is_none() && node.is_some() {
                    crate::privs::kill(m, caller);
                }
                if let Some(uid) = uid {
                    m.uid = uid;
                }
                if let Some(gid) = gid {
                    m.gid = gid;
                }
                if let Some(a) = atime {
                    m.atime = to_time(a);
                }
                if let Some(mt) = mtime {
                    m.mtime = to_time(mt);
                }
                m.ctime = ctime.unwrap_or_else(SystemTime::now);
                Ok(())
            })?;
        }
        let t = o.tree();
        o.attr_of(&t, ino)
    }

    fn do_rename(
        o: &Overlay,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        let mut t = o.tree();
        let from = o.child_path(&t, parent, name)?;
        let to = o.child_path(&t, newparent, newname)?;
        // A parent of shade's hidden state dir stays where it is (accept would refuse it).
        if o.lower.holds_hidden(&from) || o.lower.holds_hidden(&to) {
            return Err(libc::EBUSY);
        }
        let src = t.resolve(&o.lower, &from)?;
        let dst = t.resolve(&o.lower, &to).ok();
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let dst = dst.ok_or(libc::ENOENT)?;
            if from.starts_with(&to) || to.starts_with(&from) {
                return Err(libc::EINVAL);
            }
            let growth = t
                .moved_growth(&from, &to)
                .saturating_add(t.moved_growth(&to, &from));
            o.room_for(&t, &to, growth)?;
            return Self::exchange(o, &mut t, (&from, src), (&to, dst));
        }
        if from == to {
            return Ok(());
        }
        if dst.is_some() && flags.contains(RenameFlags::RENAME_NOREPLACE) {
            return Err(libc::EEXIST);
        }
        if to.starts_with(&from) {
            return Err(libc::EINVAL);
        }
        let src_dir = src.is_dir();
        // Everything below a directory moves with it, its paths longer by the difference.
        let growth = if src_dir {
            t.moved_growth(&from, &to)
        } else {
            0
        };
        o.room_for(&t, &to, growth)?;
        if let Some(dst) = &dst {
            match (src_dir, dst.is_dir()) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !o.is_empty_dir(&t, &to)? => return Err(libc::ENOTEMPTY),
                _ => {}
            }
            if from.starts_with(&to) {
                return Err(libc::ENOTEMPTY);
            }
            if let Obj::Node(n) = dst {
                let mut st = n.state();
                st.nlink = st.nlink.saturating_sub(1);
                st.meta.changed();
            }
            o.detach(&mut t, &to);
        }
        if src_dir {
            let Entry::Dir(mut d) = o.materialize(&mut t, &from, src)? else {
                return Err(libc::EIO);
            };
            d.meta.changed();
            t.move_descendants(&from, &to);
            t.remove(&o.lower, &from);
            t.set(&o.lower, &to, Entry::Dir(d));
        } else {
            let node = o.copy_up(&mut t, &from, u64::MAX)?;
            node.state().meta.changed();
            t.set(&o.lower, &to, Entry::Node(node));
            t.remove(&o.lower, &from);
        }
        // Subdirectory counts: a moved directory leaves one parent and joins the other
        // (unless it replaced an empty directory there).
        let (left, joined) = match (src_dir, dst.is_some()) {
            (true, false) => (-1, 1),
            (true, true) => (-1, 0),
            (false, _) => (0, 0),
        };
        o.touch_dir(&mut t, split(&from).0, left)?;
        o.touch_dir(&mut t, split(&to).0, joined)
    }

    fn exchange(
        o: &Overlay,
        t: &mut crate::tree::Tree,
        (a, oa): (&Path, Obj),
        (b, ob): (&Path, Obj),
    ) -> Res<()> {
        let ea = o.materialize(t, a, oa)?;
        let eb = o.materialize(t, b, ob)?;
        t.swap_subtrees(a, b);
        t.set(&o.lower, a, eb);
        t.set(&o.lower, b, ea);
        o.touch_dir(t, split(a).0, 0)?;
        o.touch_dir(t, split(b).0, 0)
    }
}

impl Overlay {
    /// The object at `rel` as a branch entry (copy-up for files, metadata for dirs).
    pub(crate) fn materialize(
        &self,
        t: &mut crate::tree::Tree,
        rel: &Path,
        obj: Obj,
    ) -> Res<Entry> {
        Ok(match obj {
            Obj::Node(n) => Entry::Node(n),
            Obj::Dir(d) => Entry::Dir(d),
            Obj::Lower(lp, st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                let mut d = t.dir_from_lower(rel, &st);
                d.lower = Some(lp.clone());
                d.meta.xattrs = self.lower.xattrs(&lp, false).into_iter().collect();
                Entry::Dir(d)
            }
            Obj::Lower(..) => Entry::Node(self.copy_up(t, rel, u64::MAX)?),
        })
    }
}

impl Filesystem for ShadeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // In no-open mode (see `open`) O_TRUNC must arrive as setattr(size=0): the kernel
        // would otherwise assume we truncated in an open we never see.
        if !self.ov().caching() {
            let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        }
        // Listings carry attributes: a first `ls -l`, `tar` or build scan needs no lookups.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // We drop setuid/setgid on writes, truncates and chowns ourselves (`privs.rs`), so
        // the kernel stops asking for `security.capability` before every write.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        if self.passthrough.is_some()
            && (config
                .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
                .is_err()
                || config.set_max_stack_depth(1).is_err())
        {
            self.passthrough = None;
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let o = &self.ov();
        let mut t = o.tree();
        let res = Overlay::lookup_path(&t, parent.0, name).and_then(|rel| {
            let obj = t.resolve(&o.lower, &rel)?;
            let a = o.entry(&mut t, &rel, &obj);
            Ok((a, Self::ttl(o, matches!(obj, Obj::Node(_)))))
        });
        match res {
            Ok((a, ttl)) => reply.entry(&ttl, &self.shown(a), Generation(0)),
            Err(libc::ENOENT) if o.caching() => {
                // A cached negative entry; lower creations invalidate it (watch.rs).
                let mut a = attr(
                    0,
                    &Obj::Dir(crate::node::DirOver {
                        ino: 0,
                        meta: Meta::new(0, 0, 0),
                        lower: None,
                        lower_fp: None,
                        nlink: 0,
                    }),
                );
                a.ino = INodeNo(0);
                reply.entry(&TTL_WATCHED, &a, Generation(0))
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.ov().tree().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let o = &self.ov();
        let t = o.tree();
        match o.attr_of(&t, ino.0) {
            Ok(a) => {
                let owned = matches!(
                    t.inodes.get(&ino.0).map(|i| &i.target),
                    Some(InodeTarget::Node(_))
                );
                reply.attr(&Self::ttl(o, owned), &self.shown(a))
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let (uid, gid) = match (self.take_owner(uid), self.take_owner(gid)) {
            (Ok(u), Ok(g)) => (u, g),
            (Err(e), _) | (_, Err(e)) => return reply.error(err(e)),
        };
        let change = AttrChange {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            caller: self.caller(req),
        };
        let o = &self.ov();
        match Self::do_setattr(o, ino.0, change) {
            Ok(a) => reply.attr(&Self::ttl(o, false), &self.shown(a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let o = &self.ov();
        let mut t = o.tree();
        match o.obj_of(&t, ino.0) {
            Ok(Obj::Node(n)) if n.kind == NodeKind::Symlink => reply.data(n.target.as_bytes()),
            Ok(Obj::Lower(lp, st)) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                t.reads.file(&lp, &st);
                match o.lower.read_link(&lp) {
                    Ok(target) => reply.data(target.as_bytes()),
                    Err(e) => reply.error(err(errno(e))),
                }
            }
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = NodeKind::from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let perm = mode & !umask & 0o7777;
        let o = &self.ov();
        match self.create_node(
            o,
            req,
            parent,
            name,
            NewNode {
                kind,
                perm,
                rdev,
                target: OsStr::new(""),
            },
        ) {
            Ok((a, _)) => reply.entry(&Self::ttl(o, true), &self.shown(a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let o = &self.ov();
        let mut t = o.tree();
        let res = o.child_path(&t, parent.0, name).and_then(|rel| {
            if t.resolve(&o.lower, &rel).is_ok() {
                return Err(libc::EEXIST);
            }
            o.room_for(&t, &rel, 0)?;
            let (parent_rel, _) = split(&rel);
            let (uid, gid, inherit) = o.owner_for(&t, parent_rel, self.creds(req)?);
            let mut perm = mode & !umask & 0o7777;
            if inherit {
                perm |= libc::S_ISGID;
            }
            let d = DirOver {
                ino: t.alloc_ino(),
                meta: Meta::new(perm, uid, gid),
                lower: None,
                lower_fp: None,
                nlink: 2,
            };
            o.place(&mut t, &rel, Entry::Dir(d.clone()), true)?;
            Ok(o.entry(&mut t, &rel, &Obj::Dir(d)))
        });
        match res {
            Ok(a) => reply.entry(&Self::ttl(o, false), &self.shown(a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let o = &self.ov();
        let mut t = o.tree();
        let res = o.child_path(&t, parent.0, name).and_then(|rel| {
            let obj = t.resolve(&o.lower, &rel)?;
            if obj.is_dir() {
                return Err(libc::EISDIR);
            }
            if let Obj::Node(n) = &obj {
                let mut st = n.state();
                st.nlink = st.nlink.saturating_sub(1);
                st.meta.changed();
            }
            o.remove_entry(&mut t, &rel, 0)
        });
        reply_empty(reply, res)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let o = &self.ov();
        let mut t = o.tree();
        let res = o.child_path(&t, parent.0, name).and_then(|rel| {
            if o.lower.holds_hidden(&rel) {
                return Err(libc::EBUSY);
            }
            let obj = t.resolve(&o.lower, &rel)?;
            if !obj.is_dir() {
                return Err(libc::ENOTDIR);
            }
            if !o.is_empty_dir(&t, &rel)? {
                return Err(libc::ENOTEMPTY);
            }
            o.remove_entry(&mut t, &rel, -1)
        });
        reply_empty(reply, res)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let new = NewNode {
            kind: NodeKind::Symlink,
            perm: 0o777,
            rdev: 0,
            target: target.as_os_str(),
        };
        let o = &self.ov();
        match self.create_node(o, req, parent, link_name, new) {
            Ok((a, _)) => reply.entry(&Self::ttl(o, true), &self.shown(a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            reply,
            Self::do_rename(&self.ov(), parent.0, name, newparent.0, newname, flags),
        )
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let o = &self.ov();
        let mut t = o.tree();
        let res = o.child_path(&t, newparent.0, newname).and_then(|rel| {
            if t.resolve(&o.lower, &rel).is_ok() {
                return Err(libc::EEXIST);
            }
            o.room_for(&t, &rel, 0)?;
            let node = match o.obj_of(&t, ino.0)? {
                Obj::Node(n) => n,
                obj if obj.is_dir() => return Err(libc::EPERM),
                _ => {
                    let src = Overlay::path_of(&t, ino.0)?;
                    o.copy_up(&mut t, &src, u64::MAX)?
                }
            };
            {
                let mut st = node.state();
                st.nlink += 1;
                st.meta.changed();
            }
            t.set(&o.lower, &rel, Entry::Node(node.clone()));
            o.touch_dir(&mut t, split(&rel).0, 0)?;
            Ok(o.entry(&mut t, &rel, &Obj::Node(node)))
        });
        match res {
            Ok(a) => reply.entry(&Self::ttl(o, true), &self.shown(a), Generation(0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let o = &self.ov();
        if o.caching() {
            if let Some(p) = &self.passthrough {
                return Self::open_passthrough(o, p, ino, flags, reply);
            }
            // No-open mode: the kernel stops sending open/release, keeps the page cache
            // across opens, and reads/writes arrive by inode (`fh` 0). A lower file is
            // copied up on its first write instead of at open.
            return reply.error(Errno::ENOSYS);
        }
        let acc = flags.0 & libc::O_ACCMODE;
        let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        let trunc = flags.0 & libc::O_TRUNC != 0;
        // An O_TRUNC open truncates here (FUSE_ATOMIC_O_TRUNC): setuid goes as on truncate.
        let kill = |st: &mut crate::node::NodeState| {
            if crate::privs::has_privs(&st.meta) && !crate::privs::may_keep(self.caller(req)) {
                crate::privs::kill(&mut st.meta, self.caller(req));
            }
        };
        let res = (|| -> Res<Handle> {
            let mut t = o.tree();
            match o.obj_of(&t, ino.0)? {
                Obj::Node(n) => {
                    drop(t);
                    if trunc && writes && n.kind == NodeKind::File {
                        let mut data = n.data_mut();
                        if let Some(c) = data.as_mut() {
                            c.set_len(0).map_err(errno)?;
                        }
                        let mut st = n.state();
                        st.size = 0;
                        st.meta.modified();
                        kill(&mut st);
                    }
                    Ok(Handle::Node(n))
                }
                obj if obj.is_dir() => Err(libc::EISDIR),
                Obj::Lower(lp, _) if !writes && !trunc => {
                    let file = o.lower.open_file(&lp).map_err(errno)?;
                    // Data is read through this descriptor only: note what it is now.
                    let st = crate::overlay::fstat(&file).map_err(errno)?;
                    t.reads.file(&lp, &st);
                    Ok(Handle::Lower { ino: ino.0, file })
                }
                _ => {
                    let rel = Overlay::path_of(&t, ino.0)?;
                    let keep = if trunc { 0 } else { u64::MAX };
                    let n = o.copy_up(&mut t, &rel, keep)?;
                    if trunc {
                        let mut st = n.state();
                        st.meta.modified();
                        kill(&mut st);
                    }
                    Ok(Handle::Node(n))
                }
            }
        })();
        match res {
            Ok(h) => reply.opened(FileHandle(o.add_handle(h)), Self::open_flags(o)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let o = &self.ov();
        with_read_buf(size as usize, |buf| {
            let res = if fh.0 == 0 || fh.0 & FH_BIT != 0 {
                o.read_ino(ino.0, buf, offset)
            } else {
                o.handle(fh.0).and_then(|h| match &*h {
                    Handle::Node(n) => n.read_at(buf, offset).map_err(errno),
                    Handle::Lower { ino, file } => match o.node_of(*ino) {
                        Some(n) => n.read_at(buf, offset).map_err(errno),
                        None => crate::content::read_full_at(file, buf, offset).map_err(errno),
                    },
                    Handle::Dir(_) => Err(libc::EISDIR),
                })
            };
            match res {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(err(e)),
            }
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let o = &self.ov();
        let res = o.node_for_io(ino.0, fh.0, true).and_then(|n| {
            let end = offset + data.len() as u64;
            let mut guard = n.data_mut();
            let content = guard.as_mut().ok_or(libc::EINVAL)?;
            o.store.grow(content, end).map_err(errno)?;
            content.write_at(data, offset).map_err(errno)?;
            let mut st = n.state();
            st.size = st.size.max(end);
            st.meta.modified();
            let mode = st.meta.perm;
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
                crate::privs::kill(&mut st.meta, self.caller(req));
            }
            Ok((data.len() as u32, mode != st.meta.perm))
        });
        // A write reply carries no attributes, and the kernel keeps the mode it cached:
        // say the bits went, before the writer can stat.
        let res = res.map(|(n, killed)| {
            if killed {
                if let Some(notifier) = o.notifier.get() {
                    let _ = notifier.inval_inode(ino, -1, 0);
                }
            }
            n
        });
        match res {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(err(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do at close (writes reach us synchronously, locks are kernel-local);
        // ENOSYS makes the kernel stop sending FLUSH, one round trip less per close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(p) = &self.passthrough {
            p.release(ino.0, fh.0);
        }
        if fh.0 != 0 && fh.0 & FH_BIT == 0 {
            self.ov().drop_handle(fh.0);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let res = self.ov().node_for_io(ino.0, fh.0, false).and_then(|n| {
            {
                if let Some(c) = n.data().as_ref() {
                    c.sync(datasync).map_err(errno)?;
                }
            }
            Ok(())
        });
        reply_empty(reply, res)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let o = &self.ov();
        if o.caching() {
            // No-opendir mode: listings are cached by the kernel (invalidated by our own
            // changes and by the lower watcher) and read by inode.
            return reply.error(Errno::ENOSYS);
        }
        match o.listing(ino.0) {
            Ok(entries) => reply.opened(
                FileHandle(o.add_handle(Handle::Dir(Arc::new(entries)))),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let o = &self.ov();
        let listing = || Self::listing_for(o, ino.0, fh.0, offset);
        let entries = match crate::warm::serve(req.pid(), listing) {
            Ok(l) => l,
            Err(e) => return reply.error(err(e)),
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        // Handle-less listings stay cached until the reader's end-of-directory call (an
        // offset past the last entry): dropped earlier, that call would list the lower
        // directory again only to answer nothing, for every directory read.
        if fh.0 == 0 && entries.len() <= offset as usize {
            o.listing_done(ino.0);
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectoryPlus,
    ) {
        let o = &self.ov();
        let listing = || Self::listing_for(o, ino.0, fh.0, offset);
        let entries = match crate::warm::serve(req.pid(), listing) {
            Ok(l) => l,
            Err(e) => return reply.error(err(e)),
        };
        let mut t = o.tree();
        let dir = match Overlay::path_of(&t, ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(err(e)),
        };
        let dir_attr = o.attr_of(&t, ino.0).map(|a| self.shown(a));
        let dir_lower = t.lower_of(&dir);
        for (i, (_, _, name)) in entries.iter().enumerate().skip(offset as usize) {
            let off = (i + 1) as u64;
            if name == "." || name == ".." {
                // The kernel takes no reference for these; any attributes do.
                let Ok(a) = dir_attr else { continue };
                if reply.add(a.ino, off, name, &Duration::ZERO, &a, Generation(0)) {
                    break;
                }
                continue;
            }
            let rel = dir.join(name);
            // An entry removed since the listing was taken is left out.
            let Ok(obj) = t.resolve_child(&o.lower, &rel, dir_lower.as_deref(), name) else {
                continue;
            };
            let child = t.ino_for(&rel, &obj);
            let a = self.shown(attr(child, &obj));
            if reply.add(
                INodeNo(child),
                off,
                name,
                &Self::ttl(o, matches!(obj, Obj::Node(_))),
                &a,
                Generation(0),
            ) {
                break;
            }
            o.watch_obj(&obj);
            if let Some(i) = t.inodes.get_mut(&child) {
                i.lookups += 1;
            }
        }
        drop(t);
        // Kept for the end-of-directory call, as in `readdir`.
        if fh.0 == 0 && entries.len() <= offset as usize {
            o.listing_done(ino.0);
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.ov().drop_handle(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.ov().lower.statvfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                255,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(err(errno(e))),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if system_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let o = &self.ov();
        let slot_bytes = o.tree().slot_bytes;
        let res = o.with_meta(ino.0, |m, _| {
            let old = m.xattrs.get(name).map(Vec::len);
            if flags & libc::XATTR_CREATE != 0 && old.is_some() {
                return Err(libc::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && old.is_none() {
                return Err(libc::ENODATA);
            }
            // Values and names past the kernel's sizes, and the branch's metadata budget,
            // keep the daemon's memory bounded whatever the command sets.
            o.store
                .limits()
                .set_xattr(slot_bytes, name.as_bytes(), value, old)?;
            m.xattrs.insert(name.to_os_string(), value.to_vec());
            m.changed();
            Ok(())
        });
        reply_empty(reply, res)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if system_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        match self.ov().xattr_of(ino.0, name) {
            Ok(Some(v)) => xattr_reply(reply, &v, size),
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(err(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.ov().xattrs_of(ino.0) {
            Ok(x) => {
                let mut buf = Vec::new();
                for (n, _) in x.iter().filter(|(n, _)| !system_xattr(n)) {
                    buf.extend_from_slice(n.as_bytes());
                    buf.push(0);
                }
                xattr_reply(reply, &buf, size)
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if system_xattr(name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let o = &self.ov();
        let res = o.with_meta(ino.0, |m, _| {
            let old = m.xattrs.remove(name).ok_or(libc::ENODATA)?;
            o.store.limits().removed_xattr(name.as_bytes(), old.len());
            m.changed();
            Ok(())
        });
        reply_empty(reply, res)
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let o = &self.ov();
        let perm = mode & !umask & 0o7777;
        let new = NewNode::plain(NodeKind::File, perm);
        let res = match self.create_node(o, req, parent, name, new) {
            Ok((a, n)) => Ok((a, n)),
            Err(libc::EEXIST) if flags & libc::O_EXCL == 0 => {
                // Raced with another creator: open the existing file instead.
                let mut t = o.tree();
                o.child_path(&t, parent.0, name).and_then(|rel| {
                    let keep = if flags & libc::O_TRUNC != 0 {
                        0
                    } else {
                        u64::MAX
                    };
                    let n = o.copy_up(&mut t, &rel, keep)?;
                    let a = o.entry(&mut t, &rel, &Obj::Node(n.clone()));
                    Ok((a, n))
                })
            }
            Err(e) => Err(e),
        };
        match res {
            Ok((a, n)) => {
                // In no-open mode the kernel never sends RELEASE (not even for handles
                // from create), so a handle here would pin the node and its content fd
                // forever: answer handle-less like open does; I/O arrives by inode.
                let fh = if o.caching() {
                    0
                } else {
                    o.add_handle(Handle::Node(n))
                };
                reply.created(
                    &Self::ttl(o, true),
                    &self.shown(a),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                )
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Files here are not terminals or devices (isatty() asks with TCGETS).
        reply.error(Errno::ENOTTY);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let o = &self.ov();
        let res = o.node_for_io(ino.0, fh.0, true).and_then(|n| {
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            if mode != 0 && mode != libc::FALLOC_FL_KEEP_SIZE && mode != punch {
                return Err(libc::EOPNOTSUPP);
            }
            let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
            let mut guard = n.data_mut();
            let content = guard.as_mut().ok_or(libc::ENODEV)?;
            let mut st = n.state();
            if mode == punch {
                // The content file (memfd or tmpfile) frees the range and reads it as zeros.
                content.punch_hole(offset, length).map_err(errno)?;
                st.meta.modified();
            } else if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > st.size {
                o.store.grow(content, end).map_err(errno)?;
                content.set_len(end).map_err(errno)?;
                st.size = end;
                st.meta.modified();
            }
            Ok(())
        });
        reply_empty(reply, res)
    }
}

impl Overlay {
    /// The node that I/O on (`ino`, `fh`) goes to: the handle's node, or by inode in
    /// no-open mode (`fh` 0), copying a lower file up first when `for_write`.
    fn node_for_io(&self, ino: u64, fh: u64, for_write: bool) -> Res<Arc<crate::node::Node>> {
        if fh == 0 || fh & FH_BIT != 0 {
            return if for_write {
                self.write_target(ino)
            } else {
                self.node_of(ino).ok_or(libc::EINVAL)
            };
        }
        match &*self.handle(fh)? {
            Handle::Node(n) => Ok(n.clone()),
            Handle::Lower { ino, .. } => self.node_of(*ino).ok_or(libc::EBADF),
            Handle::Dir(_) => Err(libc::EISDIR),
        }
    }

    /// Extended attributes of whatever `ino` is, without copying anything up.
    /// One xattr of the object `ino` stands for (`None`: it has no such attribute).
    fn xattr_of(&self, ino: u64, name: &OsStr) -> Res<Option<Vec<u8>>> {
        let t = self.tree();
        match self.obj_of(&t, ino)? {
            Obj::Node(n) => Ok(n.state().meta.xattrs.get(name).cloned()),
            Obj::Dir(d) => Ok(d.meta.xattrs.get(name).cloned()),
            Obj::Lower(lp, st) => {
                drop(t);
                self.lower
                    .xattr(&lp, name, st.st_mode & libc::S_IFMT == libc::S_IFLNK)
                    .map_err(errno)
            }
        }
    }

    fn xattrs_of(&self, ino: u64) -> Res<Vec<(std::ffi::OsString, Vec<u8>)>> {
        let t = self.tree();
        Ok(match self.obj_of(&t, ino)? {
            Obj::Node(n) => n.state().meta.xattrs.clone().into_iter().collect(),
            Obj::Dir(d) => d.meta.xattrs.into_iter().collect(),
            Obj::Lower(lp, st) => self
                .lower
                .xattrs(&lp, st.st_mode & libc::S_IFMT == libc::S_IFLNK),
        })
    }
}

fn xattr_reply(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

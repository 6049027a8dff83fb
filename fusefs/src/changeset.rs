//! What a branch changed, for people (the changeset, a unified diff) and for accept
//! (an ordered plan of file system steps).

use crate::content::read_full_at;
use crate::fingerprint::Base;
use crate::node::{DirOver, Node, NodeKind};
use crate::overlay::Overlay;
use crate::plan::{Perms, PlanOp};
use crate::tree::{Entry, Tree};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Kind of one change, as `git status --short` letters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
    Renamed,
}

impl ChangeKind {
    pub fn letter(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Modified => 'M',
            ChangeKind::Deleted => 'D',
            ChangeKind::Renamed => 'R',
        }
    }
}

/// One changed path. Directory renames are one entry; paths are relative to the project.
/// In JSON a name that is not UTF-8 also comes as its exact bytes (`path_bytes`,
/// `old_path_bytes`: arrays of numbers), since `path` can only show it with U+FFFD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    pub path: PathBuf,
    pub old_path: Option<PathBuf>,
    pub is_dir: bool,
    /// Under a gitignored path (build output); accept skips these unless asked.
    pub ignored: bool,
    /// `st_mode` (type and permission bits) before and after, when the branch changed it:
    /// a chmod is a change to see like any other.
    pub mode: Option<(u32, u32)>,
    /// Owner `(uid, gid)` before and after, when the branch changed it (a chown, as root).
    pub owner: Option<(Owner, Owner)>,
}

/// Who owns a file: `(uid, gid)`.
pub type Owner = (u32, u32);

/// A change's mode and owner, each as (before, after) when it changed.
type MetaChange = (Option<(u32, u32)>, Option<(Owner, Owner)>);

/// An owner in JSON: `{"uid": 0, "gid": 0}`.
#[derive(Serialize)]
struct OwnerJson {
    uid: u32,
    gid: u32,
}

impl Change {
    /// A change of `path` with no mode or owner change recorded.
    pub fn new(kind: ChangeKind, path: PathBuf, old_path: Option<PathBuf>, is_dir: bool) -> Change {
        Change {
            kind,
            path,
            old_path,
            is_dir,
            ignored: false,
            mode: None,
            owner: None,
        }
    }

    /// `mode 100644 -> 100600, owner 0:0 -> 4242:0`, or `None` when neither changed.
    pub fn meta_note(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some((a, b)) = self.mode {
            parts.push(format!("mode {a:06o} -> {b:06o}"));
        }
        if let Some(((ou, og), (nu, ng))) = self.owner {
            parts.push(format!("owner {ou}:{og} -> {nu}:{ng}"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// JSON strings are UTF-8: a name with invalid bytes is shown with U+FFFD instead of
/// failing the whole report (serde's PathBuf impl errors on it).
pub fn lossy_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

/// The exact bytes of a name that is not valid UTF-8 (`None` for one that is): JSON reports
/// give them beside the lossy string, so a consumer can name the file exactly.
pub fn non_utf8_bytes(p: &Path) -> Option<&[u8]> {
    p.to_str().is_none().then(|| p.as_os_str().as_bytes())
}

impl Serialize for Change {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("Change", 11)?;
        m.serialize_field("kind", &self.kind)?;
        m.serialize_field("path", &self.path.to_string_lossy())?;
        match non_utf8_bytes(&self.path) {
            Some(b) => m.serialize_field("path_bytes", b)?,
            None => m.skip_field("path_bytes")?,
        }
        match &self.old_path {
            Some(old) => {
                m.serialize_field("old_path", &old.to_string_lossy())?;
                match non_utf8_bytes(old) {
                    Some(b) => m.serialize_field("old_path_bytes", b)?,
                    None => m.skip_field("old_path_bytes")?,
                }
            }
            None => {
                m.skip_field("old_path")?;
                m.skip_field("old_path_bytes")?;
            }
        }
        m.serialize_field("is_dir", &self.is_dir)?;
        m.serialize_field("ignored", &self.ignored)?;
        match self.mode {
            Some((a, b)) => {
                m.serialize_field("mode_old", &format!("{a:06o}"))?;
                m.serialize_field("mode_new", &format!("{b:06o}"))?;
            }
            None => {
                m.skip_field("mode_old")?;
                m.skip_field("mode_new")?;
            }
        }
        match self.owner {
            Some(((ou, og), (nu, ng))) => {
                m.serialize_field("owner_old", &OwnerJson { uid: ou, gid: og })?;
                m.serialize_field("owner_new", &OwnerJson { uid: nu, gid: ng })?;
            }
            None => {
                m.skip_field("owner_old")?;
                m.skip_field("owner_new")?;
            }
        }
        m.end()
    }
}

/// One line like `git status --short`, names quoted for a terminal (see [`crate::quote`]).
impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::quote::quote_path;
        let slash = if self.is_dir { "/" } else { "" };
        match &self.old_path {
            Some(old) => write!(
                f,
                "{} {}{slash} -> {}{slash}",
                self.kind.letter(),
                quote_path(old),
                quote_path(&self.path)
            ),
            None => write!(
                f,
                "{} {}{slash}",
                self.kind.letter(),
                quote_path(&self.path)
            ),
        }?;
        match self.meta_note() {
            Some(note) => write!(f, " ({note})"),
            None => Ok(()),
        }
    }
}

/// Everything a branch changed relative to lower, in path order.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Changeset {
    pub changes: Vec<Change>,
}

impl Changeset {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// Whether a node's content and mode equal the lower file it was copied from.
fn same_as_lower(o: &Overlay, n: &Node, lower: &Path) -> io::Result<bool> {
    let Some(st) = o.lower.stat(lower)? else {
        return Ok(false);
    };
    let (perm, size, mtime, xattrs, owner) = {
        let s = n.state();
        let m = &s.meta;
        (m.perm, s.size, m.mtime, m.xattrs.clone(), (m.uid, m.gid))
    };
    if NodeKind::from_mode(st.st_mode) != Some(n.kind)
        || (st.st_mode & 0o7777) != perm
        || (st.st_uid, st.st_gid) != owner
    {
        return Ok(false);
    }
    // Times and attributes the branch set are changes too (`touch -d`, `setfattr`).
    if n.kind != NodeKind::Symlink
        && (mtime != crate::node::time(st.st_mtime, st.st_mtime_nsec)
            || !same_xattrs(&xattrs, &o.lower.xattrs(lower, false)))
    {
        return Ok(false);
    }
    match n.kind {
        NodeKind::File => {
            if st.st_size as u64 != size {
                return Ok(false);
            }
            let data = n.data();
            let Some(c) = data.as_ref() else {
                return Ok(false);
            };
            same_bytes(
                |buf, off| c.read_at(buf, off),
                &o.lower.open_file(lower)?,
                size,
            )
        }
        NodeKind::Symlink => Ok(o.lower.read_link(lower)? == n.target),
        _ => Ok(st.st_rdev as u32 == n.state().meta.rdev),
    }
}

fn same_xattrs(ours: &BTreeMap<OsString, Vec<u8>>, lower: &[(OsString, Vec<u8>)]) -> bool {
    ours.len() == lower.len() && lower.iter().all(|(k, v)| ours.get(k) == Some(v))
}

/// A directory's metadata as accept should leave it: mode, owner, times, and its
/// attributes when they differ from `lower_xattrs` (`None`: a new directory, set all).
fn dir_perms(d: &DirOver, lower_xattrs: Option<&[(OsString, Vec<u8>)]>) -> Perms {
    let changed = lower_xattrs.is_none_or(|l| !same_xattrs(&d.meta.xattrs, l));
    Perms {
        mode: d.meta.perm,
        uid: Some(d.meta.uid),
        gid: Some(d.meta.gid),
        times: Some((stamp(d.meta.atime), stamp(d.meta.mtime))),
        xattrs: changed.then(|| xattr_list(&d.meta.xattrs)),
        origin: d.lower.clone(),
    }
}

fn xattr_list(x: &BTreeMap<OsString, Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    x.iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.clone()))
        .collect()
}

fn stamp(t: std::time::SystemTime) -> crate::plan::Timestamp {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
        Err(e) => {
            let d = e.duration();
            let (mut s, mut ns) = (-(d.as_secs() as i64), -i64::from(d.subsec_nanos()));
            if ns < 0 {
                s -= 1;
                ns += 1_000_000_000;
            }
            (s, ns)
        }
    }
}

fn same_bytes(
    read_a: impl Fn(&mut [u8], u64) -> io::Result<usize>,
    b: &File,
    size: u64,
) -> io::Result<bool> {
    let mut ba = vec![0u8; 1 << 16];
    let mut bb = vec![0u8; 1 << 16];
    let mut off = 0u64;
    while off < size {
        let want = ((size - off) as usize).min(ba.len());
        let na = read_a(&mut ba[..want], off)?;
        let nb = read_full_at(b, &mut bb[..want], off)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            break;
        }
        off += na as u64;
    }
    Ok(true)
}

/// Whether this slot is skipped given `include_ignored`, and whether it is ignored.
/// Judged by the path now, not when the object was made: build tools create output in
/// temporary directories and rename them into an ignored place (cargo's `target/`).
fn skipped(o: &Overlay, path: &Path, entry: &Entry, include_ignored: bool) -> (bool, bool) {
    let is_dir = matches!(entry, Entry::Dir(_));
    let ignored = o.ignore.is_ignored(path, is_dir);
    (ignored && !include_ignored, ignored)
}

/// The lower path a directory rename moved from (None when not a moved directory).
fn moved_from(t: &Tree, path: &Path, entry: &Entry) -> Option<PathBuf> {
    let Entry::Dir(d) = entry else { return None };
    let src = d.lower.as_ref()?;
    (t.natural_lower(path).as_ref() != Some(src)).then(|| src.clone())
}

/// The lower path a file node was renamed from (its origin, where that now shows nothing).
fn renamed_from(t: &Tree, path: &Path, n: &Node) -> Option<PathBuf> {
    let origin = n.origin.as_ref()?;
    if t.natural_lower(path).as_ref() == Some(origin) {
        return None;
    }
    match t.slots.get(origin).map(|s| &s.entry) {
        Some(Entry::Whiteout) => Some(origin.clone()),
        _ => None,
    }
}

/// Whether the node at `path` is a copy-up that left its lower original as it was (the
/// same content and mode at the same place): no change to report or accept.
fn unchanged_copy(o: &Overlay, t: &Tree, path: &Path, n: &Node) -> io::Result<bool> {
    match (&n.origin, t.natural_lower(path)) {
        (Some(origin), Some(nat)) if *origin == nat => same_as_lower(o, n, origin),
        _ => Ok(false),
    }
}

fn base_is_dir(b: &Base) -> bool {
    matches!(b, Base::Present(fp) if fp.is_dir())
}

impl Overlay {
    /// How `entry`'s mode and owner differ from the lower object at `lower` (what each
    /// was and is), for a changed or renamed path.
    fn meta_change(&self, lower: &Path, entry: &Entry) -> MetaChange {
        let Ok(Some(st)) = self.lower.stat(lower) else {
            return (None, None);
        };
        let (mode, owner) = match entry {
            Entry::Dir(d) => (libc::S_IFDIR | d.meta.perm, (d.meta.uid, d.meta.gid)),
            Entry::Node(n) => {
                let s = n.state();
                (n.kind.type_bits() | s.meta.perm, (s.meta.uid, s.meta.gid))
            }
            Entry::Whiteout => return (None, None),
        };
        let was_owner = (st.st_uid, st.st_gid);
        // A path that changed type was replaced, not chmod'ed: its mode says nothing new.
        let same_type = st.st_mode & libc::S_IFMT == mode & libc::S_IFMT;
        (
            (same_type && st.st_mode != mode).then_some((st.st_mode, mode)),
            (was_owner != owner).then_some((was_owner, owner)),
        )
    }

    /// The branch's changes, one entry per path (directory renames as one entry).
    pub(crate) fn changeset(&self, include_ignored: bool) -> Changeset {
        let t = self.tree();
        let mut out = Vec::new();
        let mut rename_sources: HashSet<PathBuf> = HashSet::new();
        for (path, slot) in &t.slots {
            if path.as_os_str().is_empty() {
                continue;
            }
            let (skip, ignored) = skipped(self, path, &slot.entry, include_ignored);
            if skip {
                continue;
            }
            let mk = |kind, old_path: Option<PathBuf>, is_dir| {
                let was = match kind {
                    ChangeKind::Modified => t.natural_lower(path),
                    ChangeKind::Renamed => old_path.clone(),
                    _ => None,
                };
                let (mode, owner) = match (&slot.entry, was) {
                    (Entry::Whiteout, _) | (_, None) => (None, None),
                    (entry, Some(lp)) => self.meta_change(&lp, entry),
                };
                Change {
                    kind,
                    path: path.clone(),
                    old_path,
                    is_dir,
                    ignored,
                    mode,
                    owner,
                }
            };
            match &slot.entry {
                Entry::Whiteout => {
                    if slot.base != Base::Absent {
                        out.push(mk(ChangeKind::Deleted, None, base_is_dir(&slot.base)));
                    }
                }
                Entry::Dir(d) => {
                    if let Some(src) = moved_from(&t, path, &slot.entry) {
                        rename_sources.insert(src.clone());
                        out.push(mk(ChangeKind::Renamed, Some(src), true));
                    } else if d.lower.is_none() {
                        // A lower directory removed and made again hides what it held;
                        // accept deletes those entries, so show them (slots report the rest).
                        if base_is_dir(&slot.base) {
                            let hidden = t
                                .natural_lower(path)
                                .and_then(|lp| self.lower.read_dir(&lp).ok())
                                .unwrap_or_default();
                            for e in hidden {
                                let child = path.join(&e.name);
                                if !t.slots.contains_key(&child) {
                                    let mut c = Change::new(
                                        ChangeKind::Deleted,
                                        child,
                                        None,
                                        e.file_type == libc::S_IFDIR,
                                    );
                                    c.ignored = ignored;
                                    out.push(c);
                                }
                            }
                        }
                        let has_children = t.slot_children(path).next().is_some();
                        if slot.base != Base::Absent && !base_is_dir(&slot.base) {
                            out.push(mk(ChangeKind::Modified, None, true));
                        } else if slot.base == Base::Absent && !has_children {
                            out.push(mk(ChangeKind::Added, None, true));
                        }
                    } else if let Base::Present(fp) = slot.base {
                        let xattrs_changed = d.lower.as_ref().is_some_and(|lp| {
                            !same_xattrs(&d.meta.xattrs, &self.lower.xattrs(lp, false))
                        });
                        let owner_changed = d.lower.as_ref().is_some_and(|lp| {
                            matches!(self.lower.stat(lp), Ok(Some(st))
                                if (st.st_uid, st.st_gid) != (d.meta.uid, d.meta.gid))
                        });
                        if fp.mode & 0o7777 != d.meta.perm || xattrs_changed || owner_changed {
                            out.push(mk(ChangeKind::Modified, None, true));
                        }
                    }
                }
                Entry::Node(n) => {
                    if let Some(src) = renamed_from(&t, path, n) {
                        rename_sources.insert(src.clone());
                        out.push(mk(ChangeKind::Renamed, Some(src), false));
                    } else if slot.base == Base::Absent {
                        out.push(mk(ChangeKind::Added, None, false));
                    } else {
                        if !unchanged_copy(self, &t, path, n).unwrap_or(false) {
                            out.push(mk(ChangeKind::Modified, None, false));
                        }
                    }
                }
            }
        }
        out.retain(|c| !(c.kind == ChangeKind::Deleted && rename_sources.contains(&c.path)));
        // Hidden lower entries are pushed at their directory's slot: keep path order.
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Changeset { changes: out }
    }

    /// The ordered accept plan (see `plan.rs` for the order the accept engine expects).
    pub(crate) fn plan(&self, include_ignored: bool) -> io::Result<Vec<PlanOp>> {
        self.plan_only(include_ignored, None)
    }

    /// The accept plan of the slots `only` keeps (all with `None`): part of a changeset,
    /// see `select.rs`.
    pub(crate) fn plan_only(
        &self,
        include_ignored: bool,
        only: Option<&crate::select::Keep>,
    ) -> io::Result<Vec<PlanOp>> {
        let t = self.tree();
        let dropped = |path: &Path, entry: &Entry| only.is_some_and(|k| !k.keeps(path, entry));
        // Moved lower directories: (lower source, destination, base of the source).
        let mut moves: Vec<(PathBuf, PathBuf, Base)> = Vec::new();
        let mut deletes: Vec<PlanOp> = Vec::new();
        // Directories to create or move into place, parent first (slot order).
        let mut structure: Vec<Placement> = Vec::new();
        let mut writes = Vec::new();
        let mut links = Vec::new();
        let mut setperms = Vec::new();
        let primaries = self.link_primaries(&t, include_ignored, &dropped)?;
        let mut rename_sources: HashSet<PathBuf> = HashSet::new();
        // Where a lower path is in the real tree once earlier directory renames are done.
        let mut moved: Vec<(PathBuf, PathBuf)> = Vec::new();
        let locate = |moved: &Vec<(PathBuf, PathBuf)>, lower: &Path| -> PathBuf {
            for (src, dst) in moved.iter().rev() {
                if let Ok(rest) = lower.strip_prefix(src) {
                    return if rest.as_os_str().is_empty() {
                        dst.clone()
                    } else {
                        dst.join(rest)
                    };
                }
            }
            lower.to_path_buf()
        };
        for (path, slot) in &t.slots {
            if path.as_os_str().is_empty()
                || skipped(self, path, &slot.entry, include_ignored).0
                || dropped(path, &slot.entry)
            {
                continue;
            }
            match &slot.entry {
                Entry::Whiteout => {
                    if slot.base != Base::Absent {
                        deletes.push(PlanOp::Delete {
                            path: path.clone(),
                            base: slot.base,
                            base_at: slot.base_at.clone(),
                        });
                    }
                }
                Entry::Dir(d) => {
                    let lower_xattrs = d.lower.as_ref().map(|lp| self.lower.xattrs(lp, false));
                    let perms = dir_perms(d, lower_xattrs.as_deref());
                    if let Some(src) = moved_from(&t, path, &slot.entry) {
                        if slot.base != Base::Absent {
                            deletes.push(PlanOp::Delete {
                                path: path.clone(),
                                base: slot.base,
                                base_at: slot.base_at.clone(),
                            });
                        }
                        let base_from = d.lower_fp.map(Base::Present).unwrap_or(Base::Absent);
                        structure.push(Placement::Move(moves.len()));
                        rename_sources.insert(src.clone());
                        moves.push((src, path.clone(), base_from));
                        // Mode, attributes and times as the branch shows them.
                        setperms.push(PlanOp::SetPerms {
                            path: path.clone(),
                            perms,
                            base: Base::Absent,
                            base_at: None,
                        });
                    } else if d.lower.is_none() {
                        if slot.base != Base::Absent {
                            deletes.push(PlanOp::Delete {
                                path: path.clone(),
                                base: slot.base,
                                base_at: slot.base_at.clone(),
                            });
                        }
                        structure.push(Placement::Mkdir(Box::new(PlanOp::Mkdir {
                            path: path.clone(),
                            perms,
                            base: Base::Absent,
                            base_at: None,
                        })));
                    } else if let Base::Present(_) = slot.base {
                        // The branch touched it: at least its times changed with its entries.
                        setperms.push(PlanOp::SetPerms {
                            path: path.clone(),
                            perms,
                            base: slot.base,
                            base_at: slot.base_at.clone(),
                        });
                    }
                }
                Entry::Node(n) => {
                    // A renamed file is written afresh at its new path (there is no file
                    // move op), so its source's whiteout must still become a Delete: only
                    // RenameDir sources vanish by themselves.
                    // A second name of a file the plan writes (or leaves) elsewhere: a link.
                    let primary = primaries.get(&n.ino).filter(|p| *p != path);
                    if primary.is_none()
                        && slot.base != Base::Absent
                        && unchanged_copy(self, &t, path, n)?
                    {
                        continue;
                    }
                    let replaces_other_type = match slot.base {
                        Base::Present(fp) => {
                            NodeKind::from_mode(fp.mode) != Some(n.kind) || fp.is_dir()
                        }
                        Base::Absent => false,
                    };
                    let mut base = slot.base;
                    let mut base_at = slot.base_at.clone();
                    if replaces_other_type {
                        deletes.push(PlanOp::Delete {
                            path: path.clone(),
                            base: slot.base,
                            base_at: slot.base_at.clone(),
                        });
                        // Written where the delete has just made room.
                        base = Base::Absent;
                        base_at = None;
                    }
                    if let Some(target) = primary {
                        links.push(PlanOp::Link {
                            path: path.clone(),
                            target: target.clone(),
                            base,
                            base_at,
                        });
                        continue;
                    }
                    let st = n.state();
                    let perms = Perms {
                        mode: st.meta.perm,
                        uid: Some(st.meta.uid),
                        gid: Some(st.meta.gid),
                        times: Some((stamp(st.meta.atime), stamp(st.meta.mtime))),
                        xattrs: Some(xattr_list(&st.meta.xattrs)),
                        origin: n.origin.clone(),
                    };
                    match n.kind {
                        NodeKind::File => {
                            let data = n.data();
                            let content = data
                                .as_ref()
                                .ok_or_else(|| io::Error::other("file node without content"))?
                                .reopen()?;
                            writes.push(PlanOp::WriteFile {
                                path: path.clone(),
                                content,
                                perms,
                                base,
                                base_at,
                            });
                        }
                        NodeKind::Symlink => writes.push(PlanOp::Symlink {
                            path: path.clone(),
                            target: PathBuf::from(&n.target),
                            base,
                            base_at,
                        }),
                        kind => writes.push(PlanOp::Special {
                            path: path.clone(),
                            mode: match kind {
                                NodeKind::Fifo => libc::S_IFIFO,
                                NodeKind::Socket => libc::S_IFSOCK,
                                NodeKind::CharDevice => libc::S_IFCHR,
                                _ => libc::S_IFBLK,
                            } | st.meta.perm,
                            rdev: u64::from(st.meta.rdev),
                            perms,
                            base,
                            base_at,
                        }),
                    }
                }
            }
        }
        setperms.reverse();
        // Moves go in two steps — every source to a temporary name at the root, then each
        // from there to its destination, parent first — so swaps, cycles and a directory
        // moved beneath a new directory of its old name all apply.
        let tag = format!(
            "{:x}{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        );
        let temp = |i: usize| PathBuf::from(format!(".shade-move-{tag}-{i}"));
        let mut plan = Vec::new();
        for (i, (src, _, base_from)) in moves.iter().enumerate() {
            plan.push(PlanOp::RenameDir {
                from: locate(&moved, src),
                to: temp(i),
                base_from: *base_from,
                base_to: Base::Absent,
            });
            moved.push((src.clone(), temp(i)));
        }
        // A delete removes the lower object its base was observed on, wherever the moves
        // above have put it (deletes run while moved directories sit at their temporary
        // names). An object that is itself moved is not deleted: it lives on elsewhere.
        let deletes = deletes.into_iter().filter_map(|op| match op {
            PlanOp::Delete {
                path: _,
                base,
                base_at: Some(at),
            } => {
                if rename_sources.contains(&at) {
                    return None;
                }
                Some(PlanOp::Delete {
                    path: locate(&moved, &at),
                    base,
                    base_at: Some(at),
                })
            }
            other => Some(other),
        });
        let mut deletes: Vec<PlanOp> = deletes.collect();
        // Deepest first, so a directory is removed after what was inside it.
        deletes.sort_by_key(|op| std::cmp::Reverse(op.path().components().count()));
        plan.extend(deletes);
        for place in structure {
            plan.push(match place {
                Placement::Mkdir(op) => *op,
                Placement::Move(i) => PlanOp::RenameDir {
                    from: temp(i),
                    to: moves[i].1.clone(),
                    base_from: moves[i].2,
                    base_to: Base::Absent,
                },
            });
        }
        plan.extend(writes);
        plan.extend(links);
        plan.extend(setperms);
        Ok(plan)
    }

    /// For every file the branch shows under more than one accepted name (hard links), the
    /// name accept writes it at, by node inode; the other names become links to it. A name
    /// that is still the unchanged lower file is preferred: nothing needs writing there.
    fn link_primaries(
        &self,
        t: &Tree,
        include_ignored: bool,
        dropped: &dyn Fn(&Path, &Entry) -> bool,
    ) -> io::Result<HashMap<u64, PathBuf>> {
        let mut names: HashMap<u64, Vec<&PathBuf>> = HashMap::new();
        for (path, slot) in &t.slots {
            if let Entry::Node(n) = &slot.entry {
                if n.kind != NodeKind::Symlink
                    && !path.as_os_str().is_empty()
                    && !skipped(self, path, &slot.entry, include_ignored).0
                    && !dropped(path, &slot.entry)
                {
                    names.entry(n.ino).or_default().push(path);
                }
            }
        }
        let mut out = HashMap::new();
        for (ino, paths) in names {
            if paths.len() < 2 {
                continue;
            }
            let mut primary = paths[0];
            for p in &paths {
                let unchanged = match (t.slots.get(*p), p) {
                    (Some(slot), p) if slot.base != Base::Absent => match &slot.entry {
                        Entry::Node(n) => unchanged_copy(self, t, p, n)?,
                        _ => false,
                    },
                    _ => false,
                };
                if unchanged {
                    primary = p;
                    break;
                }
            }
            out.insert(ino, primary.clone());
        }
        Ok(out)
    }

    /// A unified diff of the changes (text files; binary files are named only).
    pub(crate) fn diff(&self, changes: &Changeset) -> String {
        let t = self.tree();
        let mut out = String::new();
        // Header names quoted as git quotes them (`--- "a/evil\033…"`), see crate::quote.
        let side = |prefix: &[u8], p: &Path| {
            crate::quote::quote_bytes(&[prefix, p.as_os_str().as_bytes()].concat()).into_owned()
        };
        for c in &changes.changes {
            let a = c.old_path.as_ref().unwrap_or(&c.path);
            let (qa, qb) = (side(b"a/", a), side(b"b/", &c.path));
            // Mode and owner changes as git shows a mode change, before any content.
            let meta = meta_lines(c);
            let header = format!("diff --shade {qa} {qb}\n{meta}");
            if c.is_dir {
                if !meta.is_empty() {
                    out.push_str(&header);
                }
                continue;
            }
            let old_lower = match c.kind {
                ChangeKind::Added => None,
                ChangeKind::Renamed => c.old_path.clone(),
                _ => t.natural_lower(&c.path),
            };
            let old = old_lower
                .and_then(|lp| read_lower(self, &lp))
                .unwrap_or_default();
            let new = match t.slots.get(&c.path).map(|s| &s.entry) {
                Some(Entry::Node(n)) => read_node(n),
                _ => Vec::new(),
            };
            if old.contains(&0) || new.contains(&0) {
                if !meta.is_empty() {
                    out.push_str(&header);
                }
                out.push_str(&format!("Binary files {qa} and {qb} differ\n"));
                continue;
            }
            let (old, new) = (String::from_utf8_lossy(&old), String::from_utf8_lossy(&new));
            let diff = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
            let text = diff.unified_diff().header(&qa, &qb).to_string();
            if !text.is_empty() || !meta.is_empty() {
                out.push_str(&header);
                out.push_str(&text);
            }
        }
        out
    }
}

/// `old mode`/`new mode` and `old owner`/`new owner` lines of a change, or nothing.
fn meta_lines(c: &Change) -> String {
    let mut s = String::new();
    if let Some((a, b)) = c.mode {
        s.push_str(&format!("old mode {a:06o}\nnew mode {b:06o}\n"));
    }
    if let Some(((ou, og), (nu, ng))) = c.owner {
        s.push_str(&format!("old owner {ou}:{og}\nnew owner {nu}:{ng}\n"));
    }
    s
}

/// A directory that accept creates or moves into place.
enum Placement {
    Mkdir(Box<PlanOp>),
    /// Index into the plan's moves.
    Move(usize),
}

const DIFF_LIMIT: u64 = 4 << 20;

fn read_lower(o: &Overlay, lp: &Path) -> Option<Vec<u8>> {
    let st = o.lower.stat(lp).ok()??;
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return o.lower.read_link(lp).ok().map(|t| t.into_encoded_bytes());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 > DIFF_LIMIT {
        return None;
    }
    let f = o.lower.open_file(lp).ok()?;
    let mut buf = vec![0u8; st.st_size as usize];
    let n = read_full_at(&f, &mut buf, 0).ok()?;
    buf.truncate(n);
    Some(buf)
}

fn read_node(n: &Node) -> Vec<u8> {
    if n.kind == NodeKind::Symlink {
        return n.target.clone().into_encoded_bytes();
    }
    let size = n.state().size.min(DIFF_LIMIT);
    let data = n.data();
    let Some(c) = data.as_ref() else {
        return Vec::new();
    };
    let mut buf = vec![0u8; size as usize];
    let got = c.read_at(&mut buf, 0).unwrap_or(0);
    buf.truncate(got);
    buf
}

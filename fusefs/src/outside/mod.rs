//! Writes a command made outside the project: read from the branch's outside layer (kernel
//! overlayfs upper directories kept in `<branch dir>/outside/`), listed apart from the
//! project's changes, diffed, and written to the host only for the paths the user keeps.
//!
//! The layer's on-disk format (written by the runner):
//! - `outside/layer.json`: `{"created_ns", "shift", "userxattr", "units": [{"path", "dir"}]}`;
//!   no file means no outside changes.
//! - each unit's upper is `outside/<dir>/upper/`, mirroring the host path `path`. Standard
//!   overlayfs upper format: a character device 0:0 is a whiteout (deleted), a directory with
//!   `*.overlay.opaque = y` replaced the host's, any other directory is merged; `*.overlay.*`
//!   attributes are overlay metadata. Owners are host ids + `shift` (root sandboxes).
//!
//! Everything in the upper was written by a hostile command: it is read without following
//! symlinks, file contents are read with bounds, and keeping goes through the accept engine
//! (conflict check, journal, privileges stripped) after an owner check.

mod keep;
mod show;

pub use keep::{
    git_data, git_dir_shape, git_head_valid, git_index_hidden, git_loose_object_valid,
    git_path_runs_code, home_code_within, home_listed, home_path_runs_code, set_standing_rules,
    system_code_dirs, KeepError, KeepReport, OutsideConflict, GIT_DIR_COMMONDIR, GIT_DIR_HEAD,
    GIT_DIR_STORES,
};
pub use show::{display_path, home_dir};

use serde::{Deserialize, Serialize};
use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One unit of the layer: a host directory tree and where its upper lives.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Unit {
    /// The host path the unit covers (absolute).
    pub path: PathBuf,
    /// Its directory under `outside/` (`upper/` inside it).
    pub dir: String,
}

/// `outside/layer.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Layer {
    /// When the layer was created (ns since the epoch): a host path changed after this
    /// changed under the branch, and keeping over it is a conflict.
    pub created_ns: u64,
    /// Added to host ids on disk in the upper (0 when the sandbox maps the user itself).
    pub shift: u32,
    /// Overlay attributes are `user.overlay.*` instead of `trusted.overlay.*`.
    pub userxattr: bool,
    /// The host trees the layer covers.
    pub units: Vec<Unit>,
}

/// `outside/masked.json`: the host paths the sandbox hid from the branch's commands or
/// showed them sanitized (credentials: see the sandbox's masks), a JSON list of byte
/// strings. A diff never shows their host side, which the command must not read through
/// it (`shade mcp`'s `diff`).
pub const MASKED_FILE: &str = "masked.json";

/// `outside/hidden.json`: the directories the sandbox covered with an empty tmpfs (shade's
/// state directories) for the branch's commands. bwrap makes a mount point that is missing
/// — one deleted on the host after the command's start looked for it — in the layer's
/// upper; those directories are not the command's doing and are not listed.
pub const HIDDEN_FILE: &str = "hidden.json";

/// Adds `paths` to the layer's masked paths ([`MASKED_FILE`]).
pub fn record_masked(outside_dir: &Path, paths: &[PathBuf]) -> io::Result<()> {
    record_paths(outside_dir, MASKED_FILE, paths)
}

/// Adds `paths` to the layer's hidden directories ([`HIDDEN_FILE`]).
pub fn record_hidden(outside_dir: &Path, paths: &[PathBuf]) -> io::Result<()> {
    record_paths(outside_dir, HIDDEN_FILE, paths)
}

/// Adds `paths` to the JSON list of byte strings `name` in `outside_dir` (atomically).
fn record_paths(outside_dir: &Path, name: &str, paths: &[PathBuf]) -> io::Result<()> {
    let file = outside_dir.join(name);
    let mut all = read_paths(outside_dir, name);
    let before = all.len();
    for p in paths {
        if !all.contains(p) {
            all.push(p.clone());
        }
    }
    if all.len() == before && (before > 0 || paths.is_empty()) {
        return Ok(());
    }
    let bytes: Vec<&[u8]> = all.iter().map(|p| p.as_os_str().as_bytes()).collect();
    let json = serde_json::to_vec(&bytes).map_err(io::Error::other)?;
    // A name of its own per write: two commands of one process may record at once.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = outside_dir.join(format!(".{name}.{}.{n}", std::process::id()));
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, &file)
}

/// The layer's masked paths ([`MASKED_FILE`]); none when there is no file.
fn read_masked(outside_dir: &Path) -> Vec<PathBuf> {
    read_paths(outside_dir, MASKED_FILE)
}

/// The JSON list of paths `name` in `outside_dir`; none when there is no file.
fn read_paths(outside_dir: &Path, name: &str) -> Vec<PathBuf> {
    std::fs::read(outside_dir.join(name))
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<Vec<u8>>>(&b).ok())
        .unwrap_or_default()
        .into_iter()
        .map(|b| PathBuf::from(OsString::from(std::ffi::OsStr::from_bytes(&b))))
        .collect()
}

/// Drop the directories bwrap made as mount points of `hidden` directories (see
/// [`HIDDEN_FILE`]): an added directory that is a hidden one or holds one, with nothing
/// else added below it.
fn drop_mount_points(changes: &mut Vec<OutsideChange>, hidden: &[PathBuf]) {
    if hidden.is_empty() {
        return;
    }
    let point = |c: &OutsideChange| {
        c.kind == OutsideKind::Added && c.is_dir && hidden.iter().any(|h| h.starts_with(&c.path))
    };
    let spurious: Vec<PathBuf> = changes
        .iter()
        .filter(|c| point(c))
        .filter(|c| {
            changes
                .iter()
                .filter(|o| o.path.starts_with(&c.path))
                .all(&point)
        })
        .map(|c| c.path.clone())
        .collect();
    changes.retain(|c| !spurious.contains(&c.path));
}

/// What happened to one outside path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutsideKind {
    Added,
    Modified,
    Deleted,
    /// Replaced by an object of another type (a file by a directory, a file by a symlink…).
    TypeChanged,
}

impl OutsideKind {
    /// One letter as `git status --short` shows it (`T` for a type change).
    pub fn letter(self) -> char {
        match self {
            OutsideKind::Added => 'A',
            OutsideKind::Modified => 'M',
            OutsideKind::Deleted => 'D',
            OutsideKind::TypeChanged => 'T',
        }
    }

    /// The word used in summaries ("added", "modified"…).
    pub fn word(self) -> &'static str {
        match self {
            OutsideKind::Added => "added",
            OutsideKind::Modified => "modified",
            OutsideKind::Deleted => "deleted",
            OutsideKind::TypeChanged => "replaced",
        }
    }
}

/// An owner as host ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// One changed path outside the project.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutsideChange {
    /// The host path (absolute).
    pub path: PathBuf,
    pub kind: OutsideKind,
    /// The branch's (or, deleted, the host's) object is a directory.
    pub is_dir: bool,
    /// Host side (None when absent).
    pub size_old: Option<u64>,
    pub mode_old: Option<u32>,
    pub owner_old: Option<Owner>,
    pub target_old: Option<PathBuf>,
    /// Branch side (None when deleted). `owner_new` is None when the upper's ids fall outside
    /// the sandbox's range (a foreign owner, see `foreign_owner`).
    pub size_new: Option<u64>,
    pub mode_new: Option<u32>,
    pub owner_new: Option<Owner>,
    pub target_new: Option<PathBuf>,
    /// The upper's ids could not be mapped back to host ids.
    pub foreign_owner: bool,
    /// Where the branch's version is (None for a deletion).
    pub upper: Option<PathBuf>,
    /// The directory's contents come from elsewhere (`*.overlay.redirect`): listed, not kept.
    pub redirected: bool,
    /// Only the metadata was copied up (`*.overlay.metacopy`): the content is the host's.
    pub metacopy: bool,
    /// Its user extended attributes differ from the host's (an xattr-only change is a
    /// change: a keep writes them).
    pub xattrs_changed: bool,
    /// Written to the host by a keep.
    pub kept: bool,
    /// The sandbox hid the host's file from the branch's commands or showed them a
    /// sanitized copy (a credential, see [`MASKED_FILE`]): its host side is never shown.
    pub host_hidden: bool,
}

impl Serialize for OutsideChange {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("OutsideChange", 15)?;
        m.serialize_field("path", &self.path.to_string_lossy())?;
        match crate::changeset::non_utf8_bytes(&self.path) {
            Some(b) => m.serialize_field("path_bytes", b)?,
            None => m.skip_field("path_bytes")?,
        }
        m.serialize_field("kind", &self.kind)?;
        m.serialize_field("is_dir", &self.is_dir)?;
        m.serialize_field("size_old", &self.size_old)?;
        m.serialize_field("size_new", &self.size_new)?;
        m.serialize_field("mode_old", &self.mode_old.map(|m| format!("{m:o}")))?;
        m.serialize_field("mode_new", &self.mode_new.map(|m| format!("{m:o}")))?;
        m.serialize_field("owner_old", &self.owner_old)?;
        m.serialize_field("owner_new", &self.owner_new)?;
        let lossy = |t: &Option<PathBuf>| t.as_ref().map(|t| t.to_string_lossy().into_owned());
        m.serialize_field("target_old", &lossy(&self.target_old))?;
        m.serialize_field("target_new", &lossy(&self.target_new))?;
        m.serialize_field("foreign_owner", &self.foreign_owner)?;
        m.serialize_field("xattrs_changed", &self.xattrs_changed)?;
        m.serialize_field("kept", &self.kept)?;
        m.end()
    }
}

/// Every outside change of a branch, in path order, with the layer they came from.
#[derive(Clone, Debug, Default)]
pub struct OutsideChanges {
    pub changes: Vec<OutsideChange>,
    /// None when the branch has no outside layer.
    pub layer: Option<Layer>,
}

impl OutsideChanges {
    /// Read the layer in `outside_dir` (`Branch::outside_dir`). No `layer.json` (or no
    /// directory) is no outside changes.
    pub fn read(outside_dir: &Path) -> io::Result<OutsideChanges> {
        let layer: Layer = match std::fs::read(outside_dir.join("layer.json")) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(OutsideChanges::default()),
            Err(e) => return Err(e),
        };
        let mut changes = Vec::new();
        for unit in &layer.units {
            if !unit.path.is_absolute()
                || unit.dir.is_empty()
                || unit.dir.contains('/')
                || unit.dir == ".."
                || unit.dir == "."
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("layer.json: bad unit {unit:?}"),
                ));
            }
            let upper = outside_dir.join(&unit.dir).join("upper");
            if std::fs::symlink_metadata(&upper).is_err() {
                continue;
            }
            // Paths of a deeper unit belong to it, not to this one's upper.
            let deeper: Vec<&Path> = layer
                .units
                .iter()
                .filter(|u| u.path != unit.path && u.path.starts_with(&unit.path))
                .map(|u| u.path.as_path())
                .collect();
            let w = Walker {
                layer: &layer,
                deeper,
            };
            w.walk(&upper, &unit.path, &mut changes)?;
        }
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        changes.dedup_by(|a, b| a.path == b.path);
        drop_mount_points(&mut changes, &read_paths(outside_dir, HIDDEN_FILE));
        let masked = read_masked(outside_dir);
        for c in &mut changes {
            c.host_hidden = masked.iter().any(|m| c.path.starts_with(m));
        }
        Ok(OutsideChanges {
            changes,
            layer: Some(layer),
        })
    }

    /// Whether nothing outside the project changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// The prefix of overlay metadata attributes.
fn overlay_prefix(layer: &Layer) -> &'static [u8] {
    if layer.userxattr {
        b"user.overlay."
    } else {
        b"trusted.overlay."
    }
}

fn xattr_name(layer: &Layer, what: &str) -> Vec<u8> {
    [overlay_prefix(layer), what.as_bytes()].concat()
}

/// The user extended attributes of `path` that are its own (not overlayfs's bookkeeping,
/// which the unprivileged layer keeps under `user.overlay.`), sorted: what a keep writes.
pub(crate) fn user_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut x: Vec<_> = lxattrs(path)
        .into_iter()
        .filter(|(n, _)| n.starts_with(b"user.") && !n.starts_with(b"user.overlay."))
        .collect();
    x.sort();
    x
}

/// `lgetxattr` (never follows a symlink); None when absent or unreadable.
pub(crate) fn lgetxattr(path: &Path, name: &[u8]) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).ok()?;
    let n = CString::new(name).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the given length.
    let got =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        return None;
    }
    buf.truncate(got as usize);
    Some(buf)
}

/// Every extended attribute of `path` itself (names and values), overlay ones included.
pub(crate) fn lxattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(p) = CString::new(path.as_os_str().as_bytes()) else {
        return Vec::new();
    };
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: a valid C string and a buffer of the given length.
    let got = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got <= 0 {
        return Vec::new();
    }
    buf.truncate(got as usize);
    buf.split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .filter_map(|n| lgetxattr(path, n).map(|v| (n.to_vec(), v)))
        .collect()
}

struct Walker<'a> {
    layer: &'a Layer,
    deeper: Vec<&'a Path>,
}

/// What the host has at a path.
struct HostSide {
    meta: Option<std::fs::Metadata>,
}

fn is_whiteout(m: &std::fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

fn same_type(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    a.mode() & libc::S_IFMT == b.mode() & libc::S_IFMT
}

/// Whether two regular files have the same bytes (streamed, memory bounded).
fn same_content(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let open = |p: &Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(p)
    };
    let (Ok(mut fa), Ok(mut fb)) = (open(a), open(b)) else {
        return false;
    };
    let mut ba = vec![0u8; 64 * 1024];
    let mut bb = vec![0u8; 64 * 1024];
    loop {
        let na = match read_full(&mut fa, &mut ba) {
            Ok(n) => n,
            Err(_) => return false,
        };
        let nb = match read_full(&mut fb, &mut bb) {
            Ok(n) => n,
            Err(_) => return false,
        };
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
    fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            match f.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}

impl Walker<'_> {
    /// Map ids on disk in the upper back to host ids (None: outside the sandbox's range).
    fn owner(&self, m: &std::fs::Metadata) -> Option<Owner> {
        let shift = self.layer.shift;
        let back = |id: u32| {
            if shift == 0 {
                Some(id)
            } else {
                id.checked_sub(shift).filter(|r| *r < 65536)
            }
        };
        Some(Owner {
            uid: back(m.uid())?,
            gid: back(m.gid())?,
        })
    }

    fn walk(&self, upper: &Path, host: &Path, out: &mut Vec<OutsideChange>) -> io::Result<()> {
        // The unit's root itself: its metadata may change, its entries are the changes.
        let root_meta = std::fs::symlink_metadata(upper)?;
        if !root_meta.is_dir() {
            return Ok(());
        }
        let mut stack: Vec<(PathBuf, PathBuf)> = vec![(upper.to_path_buf(), host.to_path_buf())];
        let opaque_name = xattr_name(self.layer, "opaque");
        while let Some((udir, hdir)) = stack.pop() {
            // A directory shade may not read (a mode the command gave it, as a plain user) or
            // an entry gone meanwhile (a session's command still running) is skipped, not the
            // whole listing.
            let mut names: Vec<OsString> = match std::fs::read_dir(&udir) {
                Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.file_name())).collect(),
                Err(e) => {
                    tracing::warn!("outside layer: cannot list {}: {e}", udir.display());
                    continue;
                }
            };
            names.sort();
            for name in &names {
                let up = udir.join(name);
                let hp = hdir.join(name);
                if self.deeper.iter().any(|d| hp.starts_with(d)) {
                    continue;
                }
                let Ok(um) = std::fs::symlink_metadata(&up) else {
                    continue;
                };
                let host = HostSide {
                    meta: std::fs::symlink_metadata(&hp).ok(),
                };
                if is_whiteout(&um) {
                    if let Some(hm) = &host.meta {
                        out.push(self.deleted(&hp, hm));
                    }
                    continue;
                }
                if um.is_dir() {
                    let opaque = lgetxattr(&up, &opaque_name).as_deref() == Some(b"y");
                    let redirected = lgetxattr(&up, &xattr_name(self.layer, "redirect")).is_some();
                    match &host.meta {
                        Some(hm) if hm.is_dir() => {
                            if opaque {
                                // The branch removed the host's directory and made a new one:
                                // every host entry it does not have again is deleted.
                                let mut hnames: Vec<OsString> = std::fs::read_dir(&hp)
                                    .map(|rd| {
                                        rd.filter_map(|e| e.ok().map(|e| e.file_name())).collect()
                                    })
                                    .unwrap_or_default();
                                hnames.sort();
                                for hn in hnames {
                                    let hc = hp.join(&hn);
                                    if std::fs::symlink_metadata(up.join(&hn)).is_err()
                                        && !self.deeper.iter().any(|d| hc.starts_with(d))
                                    {
                                        if let Ok(m) = std::fs::symlink_metadata(&hc) {
                                            out.push(self.deleted(&hc, &m));
                                        }
                                    }
                                }
                            }
                            let c = self.present(&hp, &up, &um, Some(hm), redirected);
                            if c.owner_new != c.owner_old
                                || c.mode_new != c.mode_old
                                || c.foreign_owner
                                || c.xattrs_changed
                                || redirected
                            {
                                out.push(c);
                            }
                        }
                        other => out.push(self.present(&hp, &up, &um, other.as_ref(), redirected)),
                    }
                    stack.push((up, hp));
                    continue;
                }
                let c = self.present(&hp, &up, &um, host.meta.as_ref(), false);
                if c.kind == OutsideKind::Modified && self.unchanged(&c, &up, &hp, &um) {
                    continue;
                }
                out.push(c);
            }
        }
        Ok(())
    }

    /// A copied-up object identical to the host's (content, mode, owner, target).
    fn unchanged(&self, c: &OutsideChange, up: &Path, hp: &Path, um: &std::fs::Metadata) -> bool {
        if c.mode_new != c.mode_old
            || c.owner_new != c.owner_old
            || c.foreign_owner
            || c.xattrs_changed
        {
            return false;
        }
        if um.file_type().is_symlink() {
            return c.target_new == c.target_old;
        }
        if um.is_file() {
            return c.metacopy || (c.size_new == c.size_old && same_content(up, hp));
        }
        // fifos, sockets, devices: same type, mode and owner (and device number).
        std::fs::symlink_metadata(hp).is_ok_and(|h| h.rdev() == um.rdev())
    }

    fn deleted(&self, hp: &Path, hm: &std::fs::Metadata) -> OutsideChange {
        OutsideChange {
            path: hp.to_path_buf(),
            kind: OutsideKind::Deleted,
            is_dir: hm.is_dir(),
            size_old: (!hm.is_dir()).then_some(hm.len()),
            mode_old: Some(hm.mode()),
            owner_old: Some(Owner {
                uid: hm.uid(),
                gid: hm.gid(),
            }),
            target_old: hm
                .file_type()
                .is_symlink()
                .then(|| std::fs::read_link(hp).ok())
                .flatten(),
            size_new: None,
            mode_new: None,
            owner_new: None,
            target_new: None,
            foreign_owner: false,
            upper: None,
            redirected: false,
            metacopy: false,
            xattrs_changed: false,
            kept: false,
            host_hidden: false,
        }
    }

    fn present(
        &self,
        hp: &Path,
        up: &Path,
        um: &std::fs::Metadata,
        hm: Option<&std::fs::Metadata>,
        redirected: bool,
    ) -> OutsideChange {
        let kind = match hm {
            None => OutsideKind::Added,
            Some(h) if same_type(h, um) => OutsideKind::Modified,
            Some(_) => OutsideKind::TypeChanged,
        };
        let owner_new = self.owner(um);
        let metacopy = um.is_file() && lgetxattr(up, &xattr_name(self.layer, "metacopy")).is_some();
        let size_new = if um.is_dir() {
            None
        } else if metacopy {
            hm.map(|h| h.len())
        } else {
            Some(um.len())
        };
        OutsideChange {
            path: hp.to_path_buf(),
            kind,
            is_dir: um.is_dir(),
            size_old: hm.filter(|h| !h.is_dir()).map(|h| h.len()),
            mode_old: hm.map(|h| h.mode()),
            owner_old: hm.map(|h| Owner {
                uid: h.uid(),
                gid: h.gid(),
            }),
            target_old: hm
                .filter(|h| h.file_type().is_symlink())
                .and_then(|_| std::fs::read_link(hp).ok()),
            size_new,
            mode_new: Some(um.mode()),
            owner_new,
            target_new: um
                .file_type()
                .is_symlink()
                .then(|| std::fs::read_link(up).ok())
                .flatten(),
            foreign_owner: owner_new.is_none(),
            upper: Some(up.to_path_buf()),
            redirected,
            metacopy,
            xattrs_changed: hm.is_some() && user_xattrs(up) != user_xattrs(hp),
            kept: false,
            host_hidden: false,
        }
    }
}

#[cfg(test)]
mod tests;

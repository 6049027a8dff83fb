//! The outside layer: every write a confined command makes outside the project lands in its
//! branch's outside directory (issue 29), through kernel overlays whose lower layers are the
//! host's own file systems, so reads stay at native speed.
//!
//! On disk (`Branch::outside_dir`, read by the lister): `layer.json` (when it was made, the
//! id shift, whether the overlays keep their attributes in `user.*` xattrs, and which host
//! path each unit covers) and per unit `uN/upper` (the written files) and `uN/work`
//! (overlayfs's scratch). `stage/` is where a plain user's command stage (a tmpfs in the
//! command's own mount namespace) holds the mask layers and assembles the rebuilt `/` at
//! `stage/root` for bwrap to bind (root's stage is elsewhere: see [`RootStage`]).
//!
//! - **Root**: one overlay per real file system mounted on the host (`/` and each other
//!   disk, tmpfs, … not under /proc, /sys or /dev), mounted in shade's own mount namespace
//!   under the hidden state directory for the branch's life ([`release_outside`] unmounts
//!   them). Not in a separate "stage" namespace: the host's mounts are private here (as in
//!   most containers), so such a namespace would never see the branches and cache branches
//!   mounted after it, and would pin every FUSE mount it copied until it ends (their daemons
//!   could not finish unmounting). Read-only mounts and mount points that are files are
//!   bound read-only as they are.
//! - **Plain user**: an unprivileged overlay needs a lower directory with no mounts below it
//!   (the kernel refuses to clone one with locked submounts), so the units are the
//!   directories the user may write — `$HOME`, `/tmp`, `/var/tmp`, `/run/user/UID` and
//!   top-level directories it can write — each split into its subdirectories where mounts
//!   lie below (a branch mounted under the state directory, say); a split directory itself
//!   stays read-only. The overlays are mounted for each command in a user and mount
//!   namespace of its own that bwrap starts in, so they see every mount of that moment,
//!   inside the rebuilt `/` assembled there (see [`RebuiltRoot`]), which bwrap binds whole.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::masks::Masked;
use super::{Result, SandboxError};

/// The layer's description, next to its units.
const LAYER_FILE: &str = "layer.json";

/// File systems that are no data of the machine: never a unit, never shown.
const PSEUDO: [&str; 15] = [
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "cgroup",
    "cgroup2",
    "mqueue",
    "bpf",
    "tracefs",
    "debugfs",
    "securityfs",
    "configfs",
    "fusectl",
    "hugetlbfs",
    "binfmt_misc",
];

#[derive(Debug, Serialize, Deserialize)]
struct LayerFile {
    created_ns: u64,
    shift: u32,
    userxattr: bool,
    units: Vec<UnitRec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct UnitRec {
    path: PathBuf,
    dir: String,
}

/// One path of the command's view of the machine outside the project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum View {
    /// The unit's overlay (mounted at `merged`) bound over `path`: writes land in the layer.
    Layer { path: PathBuf, merged: PathBuf },
    /// The host's `path` bound read-only (a read-only mount, a file, a unit that failed).
    ReadOnly(PathBuf),
    /// As root: the host's `path`, bound read-only into the command's stage at `source`.
    Staged { path: PathBuf, source: PathBuf },
}

/// What a command with an outside layer gets: its views in mount order, and for the plain
/// user the overlays the pre-exec hook mounts in the command's own namespaces.
#[derive(Debug)]
pub(crate) struct Outside {
    pub views: Vec<View>,
    /// A `--ro-bind / /` under the views (root without a `/` unit).
    pub ro_root: bool,
    /// The plain user's: `/` is the sandbox's own, assembled in the stage (the one view,
    /// bound over `/`) and made read-only once every mount is made (see `user_outside`).
    pub rebuilt: bool,
    pub stage: Option<UserStage>,
    /// Root: the units the command's stage mounts (see [`RootStage`]).
    pub root_units: Vec<RootUnit>,
    /// The host paths a mask layer hides or replaces (see masks.rs): nothing else need
    /// hide them.
    pub masked: Vec<PathBuf>,
}

/// The plain user's per-command stage, all built before the fork.
#[derive(Debug)]
pub(crate) struct UserStage {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// The user namespace to make the stage in, when the layer is sized (see sized.rs):
    /// else a new one.
    holder: Option<std::os::fd::RawFd>,
    /// The stage directory (`outside/stage`): a tmpfs in the command's namespace holds the
    /// mount points below, so a command costs no directory made or removed on disk (hundreds
    /// for a rebuilt `/`, a third of a second on a slow disk).
    stage: CString,
    /// Directories to make in it first: the empty lower, then each mount point.
    dirs: Vec<CString>,
    /// Sized tmpfs to mount in the stage (mount point, options): the private /tmp and
    /// /dev/shm, made here rather than by bubblewrap (whose `--size` cannot bound
    /// `nr_inodes`) so that their inodes and user extended attributes are bounded too.
    tmpfs: Vec<(CString, CString)>,
    /// The command's devpts (mount point, options), with the `max=` bubblewrap's own
    /// cannot have (see [`DevPts`]).
    devpts: Option<DevPts>,
    /// Allowed unix sockets (see sockets.rs), each bound on its (empty) file in the stage
    /// from the very socket checked.
    sockets: Vec<super::sockets::StagedSocket>,
    /// The units' mask layers (see masks.rs), made before the overlays.
    masks: Vec<MaskPlan>,
    /// The rebuilt `/` of a command with an outside layer, assembled last.
    root: Option<RebuiltRoot>,
}

/// The plain user's rebuilt `/` (see `user_outside`), assembled in the stage in the
/// pre-exec hook: a tmpfs at `at` holding every view at its path — the overlays mounted
/// there, the files bound read-only, the directories and symlinks made — which bwrap then
/// binds over `/` in one recursive bind (rather than one bind or `--dir` per view, each of
/// which reads the whole mount table again: quadratic in the host's mounts) and makes
/// read-only once its own mounts are made on it, as it did with its own root. Every mount
/// in it is nosuid and nodev already, which bwrap's bind keeps (it adds both to each
/// submount, and never takes a read-only flag away).
#[derive(Debug)]
struct RebuiltRoot {
    at: CString,
    /// In mount order: a directory before what lies in it.
    ops: Vec<RootOp>,
}

/// One path of a [`RebuiltRoot`], in the stage.
#[derive(Debug)]
enum RootOp {
    /// A directory made with this mode (given last, deepest first).
    Dir { at: CString, mode: u32 },
    /// An overlay (a unit, or read-only) mounted on a directory made for it; a failing one
    /// shows an empty read-only directory.
    Overlay {
        at: CString,
        options: CString,
        read_only: bool,
    },
    /// A host file bound read-only from `source`, if it is still a regular file (else
    /// nothing is there).
    File { at: CString, source: CString },
    /// A masked file's sanitized copy (see masks.rs), read-only with the root.
    Copy {
        at: CString,
        content: Vec<u8>,
        mode: u32,
    },
    /// A symlink to `target`.
    Symlink { at: CString, target: CString },
}

/// A mount of /proc/self/mountinfo.
#[derive(Debug, Clone)]
struct Mount {
    point: PathBuf,
    fstype: String,
    read_only: bool,
}

fn mounts() -> io::Result<Vec<Mount>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(opts), Some(fstype)) =
            (fields.get(4), fields.get(5), fields.get(sep + 1))
        else {
            continue;
        };
        out.push(Mount {
            point: PathBuf::from(
                <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(unescape(point)),
            ),
            fstype: (*fstype).to_string(),
            read_only: opts.split(',').any(|o| o == "ro"),
        });
    }
    Ok(out)
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn under_any(p: &Path, dirs: &[PathBuf]) -> bool {
    dirs.iter().any(|d| p.starts_with(d))
}

/// A path overlayfs can take in its options (they are split at `,` and `:`).
fn option_safe(p: &Path) -> bool {
    !p.as_os_str()
        .as_bytes()
        .iter()
        .any(|c| matches!(c, b',' | b':' | b'\\' | b'\n'))
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The layer's units as recorded, made if missing; `wanted` paths get a unit directory
/// (`uN`) each, reusing the recorded one. Returns path -> unit dir.
fn record_units(
    outside: &Path,
    userxattr: bool,
    shift: u32,
    wanted: &[PathBuf],
) -> Result<HashMap<PathBuf, PathBuf>> {
    let io_err = |what: &str| SandboxError::io(format!("{what} {}", outside.display()));
    std::fs::create_dir_all(outside).map_err(io_err("creating the outside layer"))?;
    let file = outside.join(LAYER_FILE);
    let mut layer = match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice::<LayerFile>(&bytes)
            .map_err(|e| SandboxError::Invalid(format!("{} is damaged: {e}", file.display())))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => LayerFile {
            created_ns: now_ns(),
            shift,
            userxattr,
            units: Vec::new(),
        },
        Err(e) => return Err(io_err("reading the outside layer")(e)),
    };
    let mut changed = !file.exists();
    let sized = super::sized::root_of(outside);
    let new = wanted
        .iter()
        .filter(|p| !layer.units.iter().any(|u| &u.path == *p))
        .count();
    if sized.is_some() && new > 0 {
        // Room for the new units' directories before they are made.
        super::sized::fit_units(outside, layer.units.len() + new);
    }
    for p in wanted {
        if !layer.units.iter().any(|u| &u.path == p) {
            let dir = format!("u{}", layer.units.len());
            if let Some(fd) = sized {
                // The unit lives on the layer's tmpfs (see sized.rs).
                let real = super::sized::unit_path(fd, &dir);
                std::fs::create_dir(&real)
                    .and_then(|()| std::os::unix::fs::symlink(&real, outside.join(&dir)))
                    .map_err(io_err("making a unit of the outside layer"))?;
            }
            layer.units.push(UnitRec {
                path: p.clone(),
                dir,
            });
            changed = true;
        }
    }
    if changed {
        let json = serde_json::to_vec_pretty(&layer)
            .map_err(|e| SandboxError::Invalid(format!("describing the layer: {e}")))?;
        let tmp = outside.join(".layer.json.tmp");
        std::fs::write(&tmp, json).map_err(io_err("writing the outside layer"))?;
        std::fs::rename(&tmp, &file).map_err(io_err("writing the outside layer"))?;
    }
    Ok(layer
        .units
        .into_iter()
        .filter(|u| wanted.contains(&u.path))
        .map(|u| (u.path, outside.join(u.dir)))
        .collect())
}

/// Makes `uN/upper` and `uN/work`; the upper's root takes the lower root's mode (and, as
/// root, its owner shifted by the sandbox's `base`, as the idmapped lower shows it):
/// overlayfs shows the upper's root attributes for the merged root.
fn unit_dirs(unit: &Path, lower: &Path, base: Option<u32>) -> io::Result<(PathBuf, PathBuf)> {
    let (upper, work) = (unit.join("upper"), unit.join("work"));
    let fresh = !upper.exists();
    std::fs::create_dir_all(&upper)?;
    std::fs::create_dir_all(&work)?;
    if fresh {
        let meta = std::fs::metadata(lower)?;
        std::fs::set_permissions(
            &upper,
            std::fs::Permissions::from_mode(meta.permissions().mode() & 0o7777),
        )?;
        if let Some(base) = base {
            std::os::unix::fs::chown(
                &upper,
                Some(shifted(base, meta.uid())),
                Some(shifted(base, meta.gid())),
            )?;
            // chown clears set-id bits; give the mode again.
            std::fs::set_permissions(
                &upper,
                std::fs::Permissions::from_mode(meta.permissions().mode() & 0o7777),
            )?;
        }
    }
    Ok((upper, work))
}

/// `MASK:` before a unit's lower, when it has a mask layer (the topmost lower).
fn mask_prefix(mask: Option<&Path>) -> String {
    mask.map(|m| format!("{}:", m.display()))
        .unwrap_or_default()
}

/// An id of the host as the sandbox's root sees it, shifted by `base` (see `unit_dirs`).
fn shifted(base: u32, id: u32) -> u32 {
    if id < crate::idmap::RANGE {
        base + id
    } else {
        base + crate::idmap::RANGE - 2
    }
}

/// One entry of a unit's mask layer, its path in the stage.
#[derive(Debug)]
pub(crate) enum MaskOp {
    /// A directory on the way to a masked path, with the host directory's mode and owner
    /// (overlayfs shows the topmost layer's), made first with 0700 and given them last.
    Dir {
        path: CString,
        mode: u32,
        owner: Option<(u32, u32)>,
    },
    /// A whiteout (a 0/0 character device): the host's file or directory is absent.
    Whiteout(CString),
    /// A sanitized copy over the host's file.
    File {
        path: CString,
        content: Vec<u8>,
        mode: u32,
        owner: Option<(u32, u32)>,
    },
}

/// A unit's mask layer (see masks.rs): made in the stage's tmpfs in the pre-exec hook,
/// before the unit's overlay takes it as its topmost lower layer.
#[derive(Debug, Default)]
pub(crate) struct MaskPlan {
    ops: Vec<MaskOp>,
}

/// The mask layer at `at` of the unit whose host directory is `lower`, for the masked paths
/// that lie in it and in no deeper unit (`deeper`); `base` the id shift as root. None when
/// nothing of `masks` lies there; the paths it covers are added to `covered`.
fn plan_mask(
    at: &Path,
    lower: &Path,
    deeper: &[PathBuf],
    masks: &[(PathBuf, Masked)],
    base: Option<u32>,
    covered: &mut Vec<PathBuf>,
) -> Result<Option<MaskPlan>> {
    let owner =
        |meta: &std::fs::Metadata| base.map(|b| (shifted(b, meta.uid()), shifted(b, meta.gid())));
    let mut plan = MaskPlan::default();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (path, how) in masks {
        let Ok(rel) = path.strip_prefix(lower) else {
            continue;
        };
        if rel.as_os_str().is_empty()
            || deeper
                .iter()
                .any(|d| d != lower && d.starts_with(lower) && path.starts_with(d))
        {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        let mut ops = Vec::new();
        let mut fine = true;
        let ancestors: Vec<&Path> = rel.ancestors().skip(1).collect();
        for anc in ancestors.into_iter().rev() {
            if dirs.iter().any(|d| d == anc) {
                continue;
            }
            match std::fs::symlink_metadata(lower.join(anc)) {
                Ok(m) if m.is_dir() => {
                    ops.push(MaskOp::Dir {
                        path: super::cstring(&at.join(anc))?,
                        mode: m.permissions().mode() & 0o7777,
                        owner: owner(&m),
                    });
                    dirs.push(anc.to_path_buf());
                }
                _ => fine = false,
            }
        }
        if !fine {
            continue;
        }
        let target = super::cstring(&at.join(rel))?;
        ops.push(match how {
            Masked::Hidden => MaskOp::Whiteout(target),
            Masked::Copy(content) => MaskOp::File {
                path: target,
                content: content.clone(),
                mode: meta.permissions().mode() & 0o7777,
                owner: owner(&meta),
            },
        });
        plan.ops.extend(ops);
        covered.push(path.clone());
    }
    Ok((!plan.ops.is_empty()).then_some(plan))
}

/// In the pre-exec hook (async-signal-safe): makes `plan` in the stage; 0 or -1.
unsafe fn build_mask(plan: &MaskPlan) -> libc::c_int {
    for op in &plan.ops {
        let ok = match op {
            MaskOp::Dir { path, .. } => libc::mkdir(path.as_ptr(), 0o700) == 0,
            MaskOp::Whiteout(path) => {
                libc::mknod(path.as_ptr(), libc::S_IFCHR, libc::makedev(0, 0)) == 0
            }
            MaskOp::File {
                path,
                content,
                mode,
                owner,
            } => write_file(path, content, *mode, *owner),
        };
        if !ok {
            return -1;
        }
    }
    // Directories get their mode and owner last, deepest first (a 0500 one would refuse
    // its entries).
    for op in plan.ops.iter().rev() {
        if let MaskOp::Dir { path, mode, owner } = op {
            if let Some((uid, gid)) = owner {
                if libc::chown(path.as_ptr(), *uid, *gid) != 0 {
                    return -1;
                }
            }
            if libc::chmod(path.as_ptr(), *mode) != 0 {
                return -1;
            }
        }
    }
    0
}

/// In the pre-exec hook (async-signal-safe): a new file at `path` holding `content`.
unsafe fn write_file(
    path: &std::ffi::CStr,
    content: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> bool {
    let fd = libc::open(
        path.as_ptr(),
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
        0o600,
    );
    if fd < 0 {
        return false;
    }
    let mut done = 0usize;
    let mut ok = true;
    while done < content.len() {
        let n = libc::write(fd, content[done..].as_ptr().cast(), content.len() - done);
        if n <= 0 {
            ok = false;
            break;
        }
        done += n as usize;
    }
    ok = ok
        && owner.is_none_or(|(uid, gid)| libc::fchown(fd, uid, gid) == 0)
        && libc::fchmod(fd, mode) == 0;
    libc::close(fd);
    ok
}

fn overlay_options(
    mask: Option<&Path>,
    lower: &Path,
    upper: &Path,
    work: &Path,
    userxattr: bool,
) -> Result<CString> {
    for p in [lower, upper, work].into_iter().chain(mask) {
        if !option_safe(p) {
            return Err(SandboxError::Invalid(format!(
                "{} cannot be an overlay layer (its name has `,` or `:`)",
                p.display()
            )));
        }
    }
    let mut o = format!(
        "lowerdir={}{},upperdir={},workdir={}",
        mask_prefix(mask),
        lower.display(),
        upper.display(),
        work.display()
    );
    if userxattr {
        o.push_str(",userxattr");
    }
    CString::new(o).map_err(|_| SandboxError::Invalid("a layer path has a NUL byte".into()))
}

/// The outside view for a command of the branch whose outside directory is `outside`.
/// `hide` are the directories hidden from the command (never units), `project` the project
/// path (the branch covers it). As root, `root` is the sandbox's id base and the directory
/// the command's stage is built in (see [`RootStage`]).
pub(crate) fn prepare(
    outside: &Path,
    hide: &[PathBuf],
    project: &Path,
    private_tmp: bool,
    root: Option<(u32, &Path)>,
    size: Option<u64>,
    masks: &[(PathBuf, Masked)],
) -> Result<Outside> {
    if let Some(size) = size {
        std::fs::create_dir_all(outside).map_err(SandboxError::io(format!(
            "creating the outside layer {}",
            outside.display()
        )))?;
        super::sized::make(outside, size, outside.join(LAYER_FILE).exists());
    }
    let made = match root {
        Some((base, stage)) => root_outside(outside, hide, project, base, stage, masks),
        None => user_outside(outside, hide, project, private_tmp, masks),
    }?;
    // The lister must never show the host side of what the command was not to read (a
    // diff is the agent's to read too: `shade mcp`'s `diff`).
    crate::outside::record_masked(outside, &made.masked).map_err(SandboxError::io(format!(
        "recording the masked paths of {}",
        outside.display()
    )))?;
    Ok(made)
}

/// File systems on a device: the machine's disks, each its own unit.
const DISK_FS: [&str; 10] = [
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "vfat", "exfat", "bcachefs",
];

/// Whether a mount is part of the machine for the branch's life, not something a program
/// mounted for a moment (a test's tmpfs, another sandbox's mounts) that would pile up as
/// units: `/`, disks mounted outside the temporary directories, and memory file systems
/// at the usual system places.
fn lasting(m: &Mount) -> bool {
    let p = &m.point;
    if p == Path::new("/") {
        return true;
    }
    let temporary = ["/tmp", "/var/tmp", "/run", "/dev/shm"]
        .iter()
        .any(|t| p.starts_with(t) && p != Path::new(t));
    if temporary {
        return false;
    }
    if DISK_FS.contains(&m.fstype.as_str()) {
        return true;
    }
    [
        "/tmp", "/var/tmp", "/run", "/home", "/root", "/srv", "/opt", "/var", "/var/lib",
    ]
    .iter()
    .any(|t| p == Path::new(t))
}

/// At most this many units as root (one per file system).
const MAX_ROOT_UNITS: usize = 32;

/// One root unit as the per-command stage mounts it: an idmapped clone of the host's
/// `lower` at `idmapped`, and the overlay on it at `merged` (see [`RootStage::enter`]).
#[derive(Debug)]
pub(crate) struct RootUnit {
    lower: CString,
    idmapped: CString,
    merged: CString,
    /// The overlay's options.
    options: CString,
    /// The idmapped clone made read-only too (the view has no upper: see
    /// [`RootUnit::read_only_root`]).
    read_only: bool,
    /// The unit's mask layer (see masks.rs), made in the stage before its overlay.
    mask: Option<MaskPlan>,
}

impl RootUnit {
    /// As root, for a command without an outside layer: the host's `/` idmapped to the
    /// sandbox (root's files are the command's root's to read), read-only (an idmapped
    /// mount writes the real files), under an overlay without an upper at `stage/m0`: a
    /// unix socket is not connectable through an overlay, and root's 0600 ones would be
    /// through the idmapped clone. Returns the unit and its view's path.
    pub(crate) fn read_only_root(stage: &Path) -> Result<(RootUnit, PathBuf)> {
        let idmapped = stage.join("l0");
        let merged = stage.join("m0");
        // Without an upper, overlayfs wants two lower layers: an empty one goes under.
        let empty = stage.join("e0");
        let unit = RootUnit {
            lower: super::cstring(Path::new("/"))?,
            idmapped: super::cstring(&idmapped)?,
            merged: super::cstring(&merged)?,
            options: CString::new(format!(
                "lowerdir={}:{}",
                idmapped.display(),
                empty.display()
            ))
            .map_err(|_| SandboxError::Invalid("a stage path has a NUL byte".into()))?,
            read_only: true,
            mask: None,
        };
        Ok((unit, merged))
    }

    /// The empty lower layer of a read-only view (see [`RootUnit::read_only_root`]).
    pub(crate) fn empty_dir(stage: &Path) -> Result<CString> {
        super::cstring(&stage.join("e0"))
    }

    /// The unit's two mount points in the stage, made before it is mounted.
    pub(crate) fn idmapped_dir(&self) -> CString {
        self.idmapped.clone()
    }

    /// See [`RootUnit::idmapped_dir`].
    pub(crate) fn merged_dir(&self) -> CString {
        self.merged.clone()
    }
}

fn root_outside(
    outside: &Path,
    hide: &[PathBuf],
    project: &Path,
    base: u32,
    stage: &Path,
    masks: &[(PathBuf, Masked)],
) -> Result<Outside> {
    let all = mounts().map_err(SandboxError::io("reading /proc/self/mountinfo"))?;
    // The topmost mount at each point.
    let mut top: Vec<Mount> = Vec::new();
    for m in all {
        top.retain(|t| t.point != m.point);
        top.push(m);
    }
    let pseudo_roots = [
        PathBuf::from("/proc"),
        PathBuf::from("/sys"),
        PathBuf::from("/dev"),
    ];
    let mut skip: Vec<PathBuf> = Vec::new();
    let mut chosen: Vec<Mount> = Vec::new();
    for m in &top {
        let hidden = under_any(&m.point, &pseudo_roots)
            || under_any(&m.point, hide)
            || m.point.starts_with(outside)
            || m.point.starts_with(project)
            || m.point.starts_with(stage)
            || PSEUDO.contains(&m.fstype.as_str())
            || m.fstype == "autofs"
            || m.fstype.starts_with("fuse")
            // Other branches' layers and other programs' overlays come and go; only a
            // container's `/` is one to keep.
            || (m.fstype == "overlay" && m.point != Path::new("/"))
            || !lasting(m);
        if hidden {
            skip.push(m.point.clone());
        } else {
            chosen.push(m.clone());
        }
    }
    // Nothing under a mount that is not shown.
    chosen.retain(|m| !skip.iter().any(|s| m.point != *s && m.point.starts_with(s)));
    chosen.sort_by(|a, b| a.point.cmp(&b.point));
    chosen.truncate(MAX_ROOT_UNITS);
    let units: Vec<PathBuf> = chosen
        .iter()
        .filter(|m| !m.read_only && m.point.is_dir() && option_safe(&m.point))
        .map(|m| m.point.clone())
        .collect();
    let dirs = record_units(outside, false, base, &units)?;
    let points: Vec<PathBuf> = chosen.iter().map(|m| m.point.clone()).collect();
    let mut masked = Vec::new();
    let mut views = Vec::new();
    let mut root_units = Vec::new();
    for (i, m) in chosen.iter().enumerate() {
        if !m.point.is_dir() {
            // A file mount point: bound read-only as it is, unless it is a socket or a FIFO
            // (a docker.sock bound into a container): a way to a service, never shown.
            if std::fs::symlink_metadata(&m.point).is_ok_and(|meta| meta.is_file()) {
                views.push(View::ReadOnly(m.point.clone()));
            }
            continue;
        }
        if !option_safe(&m.point) {
            // Shown as the directory below it, through its parent's overlay.
            continue;
        }
        let unit = dirs.get(&m.point).and_then(|unit| {
            unit_dirs(unit, &m.point, Some(base))
                .map_err(|e| tracing::warn!("{} is not captured: {e}", m.point.display()))
                .ok()
        });
        let idmapped = stage.join(format!("l{i}"));
        let merged = stage.join(format!("m{i}"));
        let mask_at = stage.join(format!("w{i}"));
        let mask = plan_mask(&mask_at, &m.point, &points, masks, Some(base), &mut masked)?;
        let mask_dir = mask.as_ref().map(|_| mask_at.as_path());
        // A read-only mount (or a unit that cannot be made) is a read-only overlay: a
        // socket on it is not connectable through the overlay, as it would be through a
        // bind.
        let (options, read_only) = match unit {
            Some((upper, work)) => (
                overlay_options(mask_dir, &idmapped, &upper, &work, false)?,
                false,
            ),
            None => (
                CString::new(format!(
                    "lowerdir={}{}:{}",
                    mask_prefix(mask_dir),
                    idmapped.display(),
                    stage.join("e0").display()
                ))
                .map_err(|_| SandboxError::Invalid("a stage path has a NUL byte".into()))?,
                true,
            ),
        };
        root_units.push(RootUnit {
            lower: super::cstring(&m.point)?,
            idmapped: super::cstring(&idmapped)?,
            merged: super::cstring(&merged)?,
            options,
            read_only,
            mask,
        });
        views.push(View::Layer {
            path: m.point.clone(),
            merged,
        });
    }
    Ok(Outside {
        views,
        ro_root: false,
        rebuilt: false,
        stage: None,
        root_units,
        masked,
    })
}

/// Nothing to undo since the layers are mounted per command, in the command's own mount
/// namespace (they go with it): kept for callers that release a branch's layer, and to
/// unmount what an older shade left mounted on the host. Safe for any directory, any
/// number of times.
pub fn release_outside(outside: &Path) {
    super::sized::release(outside);
    // Never through a link: the chmods and the unmounts below would follow it anywhere.
    if std::fs::symlink_metadata(outside).is_ok_and(|m| !m.is_dir()) {
        return;
    }
    let real_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    // overlayfs leaves `uN/work/work` with mode 000: a plain user could not remove the
    // branch's directory otherwise.
    if let Ok(units) = std::fs::read_dir(outside) {
        for unit in units.flatten() {
            let work = unit.path().join("work");
            if !real_dir(&unit.path()) || !real_dir(&work) {
                continue;
            }
            for dir in [work.join("work"), work.join("index"), work] {
                if real_dir(&dir) {
                    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
                }
            }
        }
    }
    let Ok(all) = mounts() else { return };
    let base = std::fs::canonicalize(outside).unwrap_or_else(|_| outside.to_path_buf());
    let mut points: Vec<PathBuf> = all
        .into_iter()
        .map(|m| m.point)
        .filter(|p| p.starts_with(&base))
        .collect();
    // Deepest first.
    points.sort();
    points.reverse();
    for p in points {
        if let Ok(c) = super::cstring(&p) {
            // SAFETY: umount2(2) on a NUL-terminated path we own.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// How deep the plain user's rebuilt tree goes, and how many overlays it mounts at most;
/// past either, a directory is shown empty.
const REBUILD_DEPTH: usize = 10;
const MAX_OVERLAYS: usize = 1024;

/// The plain user's view: no host path reached through a plain bind, since a unix socket
/// is connectable through a bind (the services listening under `/run`, a tmux server in a
/// directory the user cannot overlay) but not through an overlay, whose inode is another.
/// So `/` is rebuilt from its own tree (see [`Rebuild`]): every directory with no mount
/// below it is an overlay — a unit over the directories the user may write (`$HOME`,
/// `/tmp`, `/var/tmp`, `/run/user/UID`, top-level directories it can write), read-only
/// otherwise — and a directory an overlay cannot take (the kernel refuses a lower with
/// mounts below it in a user namespace) is made in the sandbox's own read-only root,
/// holding its files bound read-only one by one, its symlinks, and nothing that is a
/// socket, a FIFO or a device.
fn user_outside(
    outside: &Path,
    hide: &[PathBuf],
    project: &Path,
    private_tmp: bool,
    masks: &[(PathBuf, Masked)],
) -> Result<Outside> {
    let uid = nix::unistd::geteuid();
    let gid = nix::unistd::getegid();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        candidates.push(PathBuf::from(home));
    }
    if let Ok(Some(user)) = nix::unistd::User::from_uid(uid) {
        candidates.push(user.dir);
    }
    if !private_tmp {
        candidates.push("/tmp".into());
    }
    candidates.push("/var/tmp".into());
    candidates.push(PathBuf::from(format!("/run/user/{uid}")));
    if let Ok(entries) = std::fs::read_dir("/") {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir()
                && !matches!(p.to_str(), Some("/proc" | "/sys" | "/dev"))
                && nix::unistd::access(&p, nix::unistd::AccessFlags::W_OK).is_ok()
            {
                candidates.push(p);
            }
        }
    }
    let mut writable: Vec<PathBuf> = candidates
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.is_dir() && p != Path::new("/"))
        .filter(|p| !under_any(p, hide) && !p.starts_with(outside))
        .collect();
    writable.sort();
    writable.dedup();
    let points: Vec<PathBuf> = mounts()
        .map_err(SandboxError::io("reading /proc/self/mountinfo"))?
        .into_iter()
        .map(|m| m.point)
        .collect();
    // Every shade branch mounted here, whatever its state dir: never a unit, never shown
    // (bwrap binds the command's own branches from their host paths).
    let branches: Vec<PathBuf> = branch_mounts()
        .into_iter()
        .map(|c| PathBuf::from(std::ffi::OsStr::from_bytes(c.as_bytes())))
        .collect();
    let mut rb = Rebuild {
        writable: &writable,
        points: &points,
        branches: &branches,
        hide,
        project,
        outside,
        private_tmp,
        entries: Vec::new(),
        overlays: 0,
    };
    rb.dir(Path::new("/"), 0);
    let entries = rb.entries;
    let units: Vec<PathBuf> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Unit(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let recorded = record_units(outside, true, 0, &units)?;
    let stage = outside.join("stage");
    std::fs::create_dir_all(&stage).map_err(SandboxError::io("creating the layer's stage"))?;
    let empty = stage.join("empty");
    // The rebuilt `/`, assembled in the stage (see [`RebuiltRoot`]): each view at its path
    // under `root`.
    let root = stage.join("root");
    let at = |path: &Path| -> Result<CString> {
        super::cstring(&root.join(path.strip_prefix("/").unwrap_or(path)))
    };
    let dirs = vec![super::cstring(&empty)?];
    let mut ops = Vec::new();
    let mut masked = Vec::new();
    let mut mask_plans = Vec::new();
    // The unit's or read-only overlay's mask layer at `wN` in the stage.
    let mut mask_for = |path: &Path, masked: &mut Vec<PathBuf>| -> Result<Option<PathBuf>> {
        let at = stage.join(format!("w{}", mask_plans.len()));
        let plan = plan_mask(&at, path, &[], masks, None, masked)?;
        Ok(plan.map(|p| {
            mask_plans.push(p);
            at
        }))
    };
    for entry in entries {
        match entry {
            Entry::Unit(path) => {
                let Some(unit) = recorded.get(&path) else {
                    continue;
                };
                let mask = mask_for(&path, &mut masked)?;
                let made = unit_dirs(unit, &path, None)
                    .map_err(SandboxError::io("creating the layer's unit"));
                let opts = made.and_then(|(upper, work)| {
                    overlay_options(mask.as_deref(), &path, &upper, &work, true)
                });
                match opts {
                    Ok(options) => ops.push(RootOp::Overlay {
                        at: at(&path)?,
                        options,
                        read_only: false,
                    }),
                    // Shown empty and read-only: never the host's directory as it is.
                    Err(e) => {
                        tracing::warn!("{} is not captured: {e}", path.display());
                        ops.push(RootOp::Dir {
                            at: at(&path)?,
                            mode: 0o555,
                        });
                    }
                }
            }
            Entry::ReadOnly(path) => {
                let mask = mask_for(&path, &mut masked)?;
                ops.push(match read_only_options(mask.as_deref(), &path, &empty) {
                    Ok(options) => RootOp::Overlay {
                        at: at(&path)?,
                        options,
                        read_only: true,
                    },
                    Err(_) => RootOp::Dir {
                        at: at(&path)?,
                        mode: 0o555,
                    },
                });
            }
            Entry::Dir(path, mode) => ops.push(RootOp::Dir {
                at: at(&path)?,
                mode,
            }),
            Entry::File(path) => match masks.iter().find(|(p, _)| *p == path) {
                // A file of a directory made anew (read-only): absent, or its copy.
                Some((_, Masked::Hidden)) => masked.push(path),
                Some((_, Masked::Copy(content))) => {
                    let mode = std::fs::metadata(&path)
                        .map(|m| m.permissions().mode() & 0o7777)
                        .unwrap_or(0o600);
                    ops.push(RootOp::Copy {
                        at: at(&path)?,
                        content: content.clone(),
                        mode,
                    });
                    masked.push(path);
                }
                None => ops.push(RootOp::File {
                    at: at(&path)?,
                    source: super::cstring(&path)?,
                }),
            },
            Entry::Symlink(path, target) => ops.push(RootOp::Symlink {
                at: at(&path)?,
                target: super::cstring(&target)?,
            }),
        }
    }
    Ok(Outside {
        views: vec![View::Layer {
            path: PathBuf::from("/"),
            merged: root.clone(),
        }],
        ro_root: false,
        rebuilt: true,
        stage: Some(UserStage {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            holder: super::sized::root_of(outside).and_then(|_| super::sized::holder()),
            stage: super::cstring(&stage)?,
            dirs,
            tmpfs: Vec::new(),
            devpts: None,
            sockets: Vec::new(),
            masks: mask_plans,
            root: Some(RebuiltRoot {
                at: super::cstring(&root)?,
                ops,
            }),
        }),
        root_units: Vec::new(),
        masked,
    })
}

/// The options of a read-only overlay of `lower` (no upper: an empty second lower).
fn read_only_options(mask: Option<&Path>, lower: &Path, empty: &Path) -> Result<CString> {
    for p in [lower, empty].into_iter().chain(mask) {
        if !option_safe(p) {
            return Err(SandboxError::Invalid(format!(
                "{} cannot be an overlay layer (its name has `,` or `:`)",
                p.display()
            )));
        }
    }
    CString::new(format!(
        "lowerdir={}{}:{},userxattr",
        mask_prefix(mask),
        lower.display(),
        empty.display()
    ))
    .map_err(|_| SandboxError::Invalid("a layer path has a NUL byte".into()))
}

/// One path of the plain user's rebuilt `/`, in mount order.
#[derive(Debug)]
enum Entry {
    /// A directory the user may write, with no mount below: a unit of the layer.
    Unit(PathBuf),
    /// Any other directory with no mount below: a read-only overlay of it.
    ReadOnly(PathBuf),
    /// A directory made in the sandbox's root (mode), its entries following.
    Dir(PathBuf, u32),
    /// A regular file, bound read-only.
    File(PathBuf),
    /// A symlink, made again.
    Symlink(PathBuf, PathBuf),
}

/// Walks the host's tree from `/`, down only where mounts (or the project, what is hidden,
/// a directory the user may write) lie below, into [`Entry`]s.
struct Rebuild<'a> {
    writable: &'a [PathBuf],
    points: &'a [PathBuf],
    /// Shade branch mount points (any state dir's): left out of the view.
    branches: &'a [PathBuf],
    hide: &'a [PathBuf],
    project: &'a Path,
    outside: &'a Path,
    private_tmp: bool,
    entries: Vec<Entry>,
    overlays: usize,
}

impl Rebuild<'_> {
    /// The entries of directory `dir` (already made), `depth` below `/`.
    fn dir(&mut self, dir: &Path, depth: usize) {
        let Ok(read) = std::fs::read_dir(dir) else {
            return;
        };
        let mut paths: Vec<PathBuf> = read.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            self.entry(&p, depth + 1);
        }
    }

    fn entry(&mut self, p: &Path, depth: usize) {
        // bwrap's own (/proc, /sys, /dev, a private /tmp), the project (the branch), what is
        // hidden (an empty tmpfs) and the layer itself: made by their own mounts.
        let own = matches!(p.to_str(), Some("/proc" | "/sys" | "/dev"))
            || (self.private_tmp && p == Path::new("/tmp"))
            || p.starts_with(self.project)
            || under_any(p, self.hide)
            || under_any(p, self.branches)
            || p.starts_with(self.outside);
        if own {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return;
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            if let Ok(target) = std::fs::read_link(p) {
                self.entries.push(Entry::Symlink(p.to_path_buf(), target));
            }
            return;
        }
        if kind.is_file() {
            self.entries.push(Entry::File(p.to_path_buf()));
            return;
        }
        if !kind.is_dir() {
            // A socket, a FIFO or a device: a way to a service, never shown.
            return;
        }
        // A hidden directory below needs no split: bwrap's empty tmpfs covers it inside
        // the unit's overlay as it does inside root's (a state dir with a branch mounted
        // below splits for that mount). So another state dir in the home leaves the home
        // one writable unit.
        let below = self.points.iter().any(|m| m != p && m.starts_with(p))
            || self.project.starts_with(p)
            || self.outside.starts_with(p)
            || self.writable.iter().any(|w| w != p && w.starts_with(p));
        if below {
            self.entries.push(Entry::Dir(
                p.to_path_buf(),
                meta.permissions().mode() & 0o7777,
            ));
            if depth < REBUILD_DEPTH {
                self.dir(p, depth);
            }
            return;
        }
        if self.overlays >= MAX_OVERLAYS {
            self.entries.push(Entry::Dir(
                p.to_path_buf(),
                meta.permissions().mode() & 0o7777,
            ));
            return;
        }
        self.overlays += 1;
        let unit = under_any(p, self.writable) && option_safe(p);
        self.entries.push(if unit {
            Entry::Unit(p.to_path_buf())
        } else {
            Entry::ReadOnly(p.to_path_buf())
        });
    }
}

impl UserStage {
    /// A stage with nothing but what is added to it ([`UserStage::add_tmpfs`]), for a
    /// command without an outside layer (a linter's): a tmpfs over `at` (a directory every
    /// id may pass, as the root stage's) in a user and mount namespace of the command's.
    pub(crate) fn bare(at: &Path) -> Result<UserStage> {
        let uid = nix::unistd::geteuid();
        let gid = nix::unistd::getegid();
        Ok(UserStage {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            holder: None,
            stage: super::cstring(at)?,
            dirs: Vec::new(),
            tmpfs: Vec::new(),
            devpts: None,
            sockets: Vec::new(),
            masks: Vec::new(),
            root: None,
        })
    }

    /// Adds an allowed socket, bound at `name` in the stage; its path, for bwrap to bind.
    pub(crate) fn add_socket(
        &mut self,
        name: &str,
        socket: super::sockets::Pinned,
    ) -> Result<PathBuf> {
        let at = Path::new(std::ffi::OsStr::from_bytes(self.stage.as_bytes())).join(name);
        let staged = socket
            .staged(super::cstring(&at)?)
            .map_err(SandboxError::Invalid)?;
        self.sockets.push(staged);
        Ok(at)
    }

    /// Adds a tmpfs with `options` at `name` in the stage; its path, for bwrap to bind.
    pub(crate) fn add_tmpfs(&mut self, name: &str, options: &str) -> Result<PathBuf> {
        let at = Path::new(std::ffi::OsStr::from_bytes(self.stage.as_bytes())).join(name);
        let c = super::cstring(&at)?;
        self.dirs.push(c.clone());
        self.tmpfs.push((
            c,
            CString::new(options).map_err(|_| SandboxError::Invalid("tmpfs options".into()))?,
        ));
        Ok(at)
    }

    /// Adds the command's devpts, of at most `ptys` ptys, at `name` in the stage; its
    /// path, for bwrap to bind over `/dev/pts`.
    pub(crate) fn add_devpts(&mut self, name: &str, ptys: u32) -> Result<PathBuf> {
        let at = Path::new(std::ffi::OsStr::from_bytes(self.stage.as_bytes())).join(name);
        let c = super::cstring(&at)?;
        self.dirs.push(c.clone());
        self.devpts = Some(DevPts::new(c, ptys)?);
        Ok(at)
    }

    /// In the pre-exec hook (async-signal-safe): a user namespace mapping our ids to
    /// themselves and a mount namespace, the rebuilt `/` assembled there with the units'
    /// overlays in it (see [`RebuiltRoot`]). bwrap then starts inside and binds it.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // SAFETY: plain system calls on data built before the fork.
        unsafe {
            if let Some(ns) = self.holder {
                // Mapped already; only its own may use the layer's tmpfs.
                if libc::setns(ns, libc::CLONE_NEWUSER) != 0
                    || libc::unshare(libc::CLONE_NEWNS) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            } else {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // shade is not dumpable (no ptrace), which leaves /proc/self's files to
                // root; exec makes bwrap dumpable anyway.
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
                super::write_id_maps(&self.uid_map, &self.gid_map)?;
            }
            if make_private() != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(
                c"shade-stage".as_ptr(),
                self.stage.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                // Room for the masks' copies (see masks.rs: at most 256 KiB each).
                c"size=16m,mode=0700".as_ptr().cast(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            for dir in &self.dirs {
                if libc::mkdir(dir.as_ptr(), 0o700) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (target, options) in &self.tmpfs {
                if libc::mount(
                    c"shade-tmp".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    options.as_ptr().cast(),
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(pts) = &self.devpts {
                pts.mount()?;
            }
            // The masks before the overlays that take them (a mask that cannot be made
            // fails the command: its unit would show the secrets).
            for plan in &self.masks {
                if build_mask(plan) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for sock in &self.sockets {
                let fd = libc::open(
                    sock.target.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o600,
                );
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::close(fd);
                // One swapped since the check is not bound: its file stays empty.
                sock.bind(None);
            }
            if let Some(root) = &self.root {
                root.build()?;
            }
        }
        Ok(())
    }
}

impl RebuiltRoot {
    /// In the pre-exec hook, in the stage's namespaces (async-signal-safe): the root's
    /// tmpfs and every path on it.
    unsafe fn build(&self) -> io::Result<()> {
        let flags = libc::MS_NOSUID | libc::MS_NODEV;
        if libc::mkdir(self.at.as_ptr(), 0o700) != 0
            || libc::mount(
                c"shade-root".as_ptr(),
                self.at.as_ptr(),
                c"tmpfs".as_ptr(),
                flags,
                // Directories, symlinks, empty mount points and the masks' copies (at most
                // 256 KiB each, see masks.rs); read-only once bwrap has made its mounts.
                c"size=64m,mode=0755".as_ptr().cast(),
            ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        for op in &self.ops {
            match op {
                RootOp::Dir { at, .. } => {
                    if libc::mkdir(at.as_ptr(), 0o700) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                RootOp::Overlay {
                    at,
                    options,
                    read_only,
                } => {
                    if libc::mkdir(at.as_ptr(), 0o755) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let ro = if *read_only { libc::MS_RDONLY } else { 0 };
                    // A failing overlay (a directory gone since it was planned, a mount
                    // made below it meanwhile, a file system overlayfs refuses) shows an
                    // empty read-only directory: never the host's directory bound as it
                    // is, where its sockets would be reachable.
                    if libc::mount(
                        c"overlay".as_ptr(),
                        at.as_ptr(),
                        c"overlay".as_ptr(),
                        flags | ro,
                        options.as_ptr().cast(),
                    ) != 0
                        && libc::mount(
                            c"shade-empty".as_ptr(),
                            at.as_ptr(),
                            c"tmpfs".as_ptr(),
                            flags | libc::MS_RDONLY,
                            c"size=4k,mode=0555".as_ptr().cast(),
                        ) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                RootOp::File { at, source } => {
                    let fd = libc::open(
                        at.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o400,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::close(fd);
                    // One gone or no longer a regular file (a socket, a FIFO, a symlink
                    // put there since it was planned) is left out, as a file that went
                    // away would be.
                    if !bind_file_read_only(source, at) {
                        libc::unlink(at.as_ptr());
                    }
                }
                RootOp::Copy { at, content, mode } => {
                    if !write_file(at, content, *mode, None) {
                        return Err(io::Error::last_os_error());
                    }
                }
                RootOp::Symlink { at, target } => {
                    if libc::symlink(target.as_ptr(), at.as_ptr()) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
        }
        // The directories' modes last, deepest first (a 0555 one would refuse its entries
        // to whoever makes them without the capability: bwrap's own mount points).
        for op in self.ops.iter().rev() {
            if let RootOp::Dir { at, mode } = op {
                if libc::chmod(at.as_ptr(), *mode) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// The regular file at `source` (its last component not followed) bound at `target`,
/// read-only, nosuid and nodev; whether it was. Async-signal-safe.
unsafe fn bind_file_read_only(source: &std::ffi::CStr, target: &std::ffi::CStr) -> bool {
    let tree = libc::syscall(
        libc::SYS_open_tree,
        libc::AT_FDCWD,
        source.as_ptr(),
        (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint
            | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
    ) as libc::c_int;
    if tree < 0 {
        return false;
    }
    let mut st: libc::stat = std::mem::zeroed();
    let mut attr: libc::mount_attr = std::mem::zeroed();
    attr.attr_set = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    let ok = libc::fstat(tree, &mut st) == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFREG
        && set_attr_and_move(tree, &attr, target);
    libc::close(tree);
    ok
}

/// Gives the detached mount `tree` the attributes `attr` and moves it onto `target`
/// (`mount_setattr`, `move_mount`). Raw system calls only: async-signal-safe.
unsafe fn set_attr_and_move(
    tree: libc::c_int,
    attr: &libc::mount_attr,
    target: &std::ffi::CStr,
) -> bool {
    libc::syscall(
        libc::SYS_mount_setattr,
        tree,
        c"".as_ptr(),
        libc::AT_EMPTY_PATH as libc::c_uint,
        attr as *const libc::mount_attr,
        std::mem::size_of::<libc::mount_attr>(),
    ) == 0
        && libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH as libc::c_uint,
        ) == 0
}

/// As root, a command's stage: a mount namespace of its own made in the pre-exec hook,
/// while still host root (before entering the sandbox's user namespace), where
/// - a tmpfs at `at` (a directory every id may pass, `/dev/shm`) holds what bwrap binds, so
///   that bwrap, already the sandbox's root (an unprivileged host id), reaches sources that
///   lie under directories only host root may pass (root's 0700 home holds the state dir);
/// - `binds` are the branch mount, cache branches and shade's binary bound there;
/// - `units` are the outside layer: each host file system cloned without its submounts,
///   idmapped to the sandbox's user namespace (host root's files show as the command's
///   root's, so `/root` and `/etc` behave as root expects), under an overlay whose upper
///   is in the branch's outside directory (read-only ones under an overlay without an
///   upper, over the empty `e0`).
///
/// Everything goes with the command's mount namespace: nothing is left mounted on the
/// host whatever happens to shade.
#[derive(Debug, Default)]
pub(crate) struct RootStage {
    pub at: CString,
    /// Directories to make in the tmpfs (mount points), then files (for file binds).
    pub dirs: Vec<CString>,
    pub files: Vec<CString>,
    /// (source, target, read-only, recursive). What shade binds for the command (the
    /// branch, caches, shared directories, its helper) is bound alone, without the mounts
    /// below it: a directory shared for real shares its files, not whatever is mounted
    /// under it (another branch, a file system coming and going, which made bwrap's
    /// remount pass fail); read-only views keep theirs.
    pub binds: Vec<(CString, CString, bool, bool)>,
    pub units: Vec<RootUnit>,
    /// Sized tmpfs to mount in the stage (mount point, options): the private /tmp and
    /// /dev/shm, made here rather than by bubblewrap so that their inodes (and the user
    /// extended attributes tmpfs counts with them) are bounded with their size.
    pub tmpfs: Vec<(CString, CString)>,
    /// The command's devpts, with its `max=` (see [`DevPts`]); its mount point is one of
    /// `dirs`.
    pub devpts: Option<DevPts>,
    /// Allowed unix sockets (see sockets.rs), each bound on its file in the stage from the
    /// very socket checked, idmapped so that the sandbox's root may connect where host
    /// root may.
    pub sockets: Vec<super::sockets::StagedSocket>,
    /// Every branch mount in shade's namespace when the command was planned
    /// ([`branch_mounts`]), detached in the stage once its binds are made: the stage lives
    /// as long as the command, and a copy of another branch's mount there would keep the
    /// pool from handing that branch's connection on (it cannot tell a stage's copy from a
    /// copy someone could still read through).
    pub foreign: Vec<CString>,
}

/// The mount points of every shade branch (a FUSE mount whose source is `shade:…`) in our
/// mount namespace now.
pub(crate) fn branch_mounts() -> Vec<CString> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (head, tail) = l.split_once(" - ")?;
            let mut t = tail.split(' ');
            let (fstype, source) = (t.next()?, t.next()?);
            let fuse = fstype == "fuse" || fstype.starts_with("fuse.");
            if !fuse || !source.starts_with("shade:") {
                return None;
            }
            CString::new(unescape(head.split(' ').nth(4)?)).ok()
        })
        .collect()
}

impl RootStage {
    /// In the pre-exec hook, as host root (async-signal-safe): builds the stage in a new
    /// mount namespace; `userns` is the sandbox's user namespace the lowers are idmapped to.
    /// A unit whose file system refuses idmapping or overlay is bound read-only instead.
    pub(crate) fn enter(&self, userns: std::os::fd::RawFd) -> io::Result<()> {
        let fail = || Err(io::Error::last_os_error());
        // SAFETY: plain system calls on data built before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 || make_private() != 0 {
                return fail();
            }
            if libc::mount(
                c"shade-stage".as_ptr(),
                self.at.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                // Room for the masks' copies (see masks.rs: at most 256 KiB each).
                c"mode=0755,size=16m".as_ptr().cast(),
            ) != 0
            {
                return fail();
            }
            for d in &self.dirs {
                if libc::mkdir(d.as_ptr(), 0o755) != 0 {
                    return fail();
                }
            }
            for f in &self.files {
                let fd = libc::open(
                    f.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return fail();
                }
                libc::close(fd);
            }
            for (target, options) in &self.tmpfs {
                if libc::mount(
                    c"shade-tmp".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    options.as_ptr().cast(),
                ) != 0
                {
                    return fail();
                }
            }
            if let Some(pts) = &self.devpts {
                pts.mount()?;
            }
            for (source, target, read_only, recursive) in &self.binds {
                let rec = if *recursive { libc::MS_REC } else { 0 };
                if libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | rec,
                    std::ptr::null(),
                ) != 0
                {
                    return fail();
                }
                if *read_only && remount_read_only(target) != 0 {
                    return fail();
                }
            }
            // The masks before the overlays that take them (a mask that cannot be made
            // fails the command: its unit would show the secrets).
            for u in &self.units {
                if let Some(plan) = &u.mask {
                    if build_mask(plan) != 0 {
                        return fail();
                    }
                }
            }
            for u in &self.units {
                // A unit that cannot be mounted shows an empty read-only directory: never
                // the host's as it is (writable for real, its sockets connectable).
                if mount_unit(u, userns) != 0
                    && libc::mount(
                        c"shade-empty".as_ptr(),
                        u.merged.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                        c"size=4k,mode=0555".as_ptr().cast(),
                    ) != 0
                {
                    return fail();
                }
            }
            for sock in &self.sockets {
                // One swapped since the check is not bound: its file stays empty.
                sock.bind(Some(userns));
            }
            // The stage's own binds are copies of their own: the host's branch mounts are
            // not needed here any more (an error only leaves a copy the pool sees).
            for m in &self.foreign {
                libc::umount2(m.as_ptr(), libc::MNT_DETACH);
            }
        }
        Ok(())
    }
}

/// A command's own devpts instance, made in its stage and bound over the `/dev/pts` of
/// bubblewrap's `--dev` (whose devpts has no `max=`; `/dev/ptmx` is its link to
/// `pts/ptmx`, so it opens this one). Every devpts but the host's shares the host's
/// `kernel.pty.max` less `kernel.pty.reserve`: without a `max=` one command takes every
/// pty of every other sandbox and container (red team round 7). It is mounted by the stage's
/// owner (host root, or the plain user in the stage's user namespace), in a mount namespace
/// whose user namespace the command holds no capability in, so it can neither remount it
/// nor lift its `max=` (nor, under seccomp, mount anything).
#[derive(Debug)]
pub(crate) struct DevPts {
    /// The mount point in the stage.
    at: CString,
    /// bubblewrap's own options, plus `max=`.
    options: CString,
}

impl DevPts {
    /// A devpts at `at` of at most `ptys` ptys (at least 1: devpts takes `max=0` for no
    /// limit at all).
    pub(crate) fn new(at: CString, ptys: u32) -> Result<DevPts> {
        // The kernel refuses more than NR_UNIX98_PTY_MAX.
        let max = ptys.clamp(1, 1 << 20);
        let options = CString::new(format!("newinstance,ptmxmode=0666,mode=620,max={max}"))
            .map_err(|_| SandboxError::Invalid("devpts options".into()))?;
        Ok(DevPts { at, options })
    }

    /// Mounts it (async-signal-safe: the pre-exec hook's stage).
    fn mount(&self) -> io::Result<()> {
        // SAFETY: mount(2) on C strings built before the fork.
        let r = unsafe {
            libc::mount(
                c"devpts".as_ptr(),
                self.at.as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                self.options.as_ptr().cast(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Makes every mount of our (new) mount namespace private, so nothing we mount reaches
/// the host's; 0 or -1.
unsafe fn make_private() -> libc::c_int {
    libc::mount(
        std::ptr::null(),
        c"/".as_ptr(),
        std::ptr::null(),
        libc::MS_REC | libc::MS_PRIVATE,
        std::ptr::null(),
    )
}

/// mount(2) `target` read-only again after a bind; 0 or -1.
unsafe fn remount_read_only(target: &std::ffi::CStr) -> libc::c_int {
    libc::mount(
        std::ptr::null(),
        target.as_ptr(),
        std::ptr::null(),
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
        std::ptr::null(),
    )
}

/// One unit: the idmapped clone of its lower, then the overlay; 0 or -1.
unsafe fn mount_unit(u: &RootUnit, userns: std::os::fd::RawFd) -> libc::c_int {
    if idmapped_clone(&u.lower, &u.idmapped, userns, u.read_only) != 0 {
        return -1;
    }
    libc::mount(
        c"overlay".as_ptr(),
        u.merged.as_ptr(),
        c"overlay".as_ptr(),
        if u.read_only { libc::MS_RDONLY } else { 0 },
        u.options.as_ptr().cast(),
    )
}

/// `source` (a directory or a file: an allowed socket) cloned without its submounts,
/// idmapped to `userns`, at `target`; 0 or -1.
unsafe fn idmapped_clone(
    source: &std::ffi::CStr,
    target: &std::ffi::CStr,
    userns: std::os::fd::RawFd,
    read_only: bool,
) -> libc::c_int {
    let tree = libc::syscall(
        libc::SYS_open_tree,
        libc::AT_FDCWD,
        source.as_ptr(),
        (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint,
    ) as libc::c_int;
    if tree < 0 {
        return -1;
    }
    let mut attr: libc::mount_attr = std::mem::zeroed();
    attr.attr_set = libc::MOUNT_ATTR_IDMAP;
    if read_only {
        attr.attr_set |= libc::MOUNT_ATTR_RDONLY;
    }
    attr.userns_fd = userns as u64;
    let ok = set_attr_and_move(tree, &attr, target);
    libc::close(tree);
    if ok {
        0
    } else {
        -1
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), b"/a b");
        assert_eq!(unescape(r"/plain"), b"/plain");
    }
}

//! The outside layer: every write a confined command makes outside the project lands in its
//! branch's outside directory (issue 29), through kernel overlays whose lower layers are the
//! host's own file systems, so reads stay at native speed.
//!
//! On disk (`Branch::outside_dir`, read by the lister): `layer.json` (when it was made, the
//! id shift, whether the overlays keep their attributes in `user.*` xattrs, and which host
//! path each unit covers) and per unit `uN/upper` (the written files) and `uN/work`
//! (overlayfs's scratch). `stage/uN` is where a unit's overlay is mounted for bwrap to bind.
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
//!   namespace of its own that bwrap starts in, so they see every mount of that moment; the
//!   rest of `/` is bound read-only.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

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

/// How deep a plain user's unit is split around mounts below it, and how many units at most.
const SPLIT_DEPTH: usize = 4;
const MAX_UNITS: usize = 256;

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
}

/// What a command with an outside layer gets: its views in mount order, and for the plain
/// user the overlays the pre-exec hook mounts in the command's own namespaces.
#[derive(Debug)]
pub(crate) struct Outside {
    pub views: Vec<View>,
    /// The plain user's `--ro-bind / /` under the units (root has the `/` unit).
    pub ro_root: bool,
    pub stage: Option<UserStage>,
}

/// The plain user's per-command stage, all built before the fork.
#[derive(Debug)]
pub(crate) struct UserStage {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// (overlay options, mount point); a failing one is bound read-only from `lower`.
    mounts: Vec<(CString, CString, CString)>,
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
            shift: 0,
            userxattr,
            units: Vec::new(),
        },
        Err(e) => return Err(io_err("reading the outside layer")(e)),
    };
    let mut changed = !file.exists();
    for p in wanted {
        if !layer.units.iter().any(|u| &u.path == p) {
            let dir = format!("u{}", layer.units.len());
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

/// Makes `uN/upper`, `uN/work` and `stage/uN`; the upper's root takes the lower root's
/// mode (and, as root, owner): overlayfs shows the upper's root attributes for the merged
/// root.
fn unit_dirs(unit: &Path, lower: &Path, root: bool) -> io::Result<(PathBuf, PathBuf)> {
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
        if root {
            std::os::unix::fs::chown(&upper, Some(meta.uid()), Some(meta.gid()))?;
            // chown clears set-id bits; give the mode again.
            std::fs::set_permissions(
                &upper,
                std::fs::Permissions::from_mode(meta.permissions().mode() & 0o7777),
            )?;
        }
    }
    Ok((upper, work))
}

fn stage_dir(outside: &Path, unit: &Path) -> PathBuf {
    let name = unit.file_name().map(PathBuf::from).unwrap_or_default();
    outside.join("stage").join(name)
}

fn overlay_options(lower: &Path, upper: &Path, work: &Path, userxattr: bool) -> Result<CString> {
    for p in [lower, upper, work] {
        if !option_safe(p) {
            return Err(SandboxError::Invalid(format!(
                "{} cannot be an overlay layer (its name has `,` or `:`)",
                p.display()
            )));
        }
    }
    let mut o = format!(
        "lowerdir={},upperdir={},workdir={}",
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
/// path (the branch covers it).
pub(crate) fn prepare(
    outside: &Path,
    hide: &[PathBuf],
    project: &Path,
    private_tmp: bool,
) -> Result<Outside> {
    if nix::unistd::geteuid().is_root() {
        Ok(Outside {
            views: root_views(outside, hide, project)?,
            ro_root: false,
            stage: None,
        })
    } else {
        user_outside(outside, hide, project, private_tmp)
    }
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

/// Outside directories whose overlays this process mounted (root), and their views.
static MOUNTED: Mutex<Option<HashMap<PathBuf, Vec<View>>>> = Mutex::new(None);

fn root_views(outside: &Path, hide: &[PathBuf], project: &Path) -> Result<Vec<View>> {
    let mut guard = MOUNTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(views) = map.get(outside) {
        return Ok(views.clone());
    }
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
            || PSEUDO.contains(&m.fstype.as_str())
            || m.fstype == "autofs"
            || m.fstype.starts_with("fuse")
            // Other branches' layers (their state directories are not ours to hide) and
            // other programs' overlays come and go; only a container's `/` is one to keep.
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
    let dirs = record_units(outside, false, &units)?;
    let stage = outside.join("stage");
    std::fs::create_dir_all(&stage).map_err(SandboxError::io("creating the layer's stage"))?;
    // Only root passes: the merged trees show root's files as root sees them.
    let _ = std::fs::set_permissions(&stage, std::fs::Permissions::from_mode(0o700));
    let mounted: HashSet<PathBuf> = mounts()
        .map_err(SandboxError::io("reading /proc/self/mountinfo"))?
        .into_iter()
        .filter(|m| m.fstype == "overlay")
        .map(|m| m.point)
        .collect();
    let mut views = Vec::new();
    for m in &chosen {
        let Some(unit) = dirs.get(&m.point) else {
            views.push(View::ReadOnly(m.point.clone()));
            continue;
        };
        match mount_root_unit(outside, unit, &m.point, &mounted) {
            Ok(merged) => views.push(View::Layer {
                path: m.point.clone(),
                merged,
            }),
            Err(e) => {
                tracing::warn!(
                    "{} is not captured (bound read-only): {e}",
                    m.point.display()
                );
                views.push(View::ReadOnly(m.point.clone()));
            }
        }
    }
    map.insert(outside.to_path_buf(), views.clone());
    Ok(views)
}

fn mount_root_unit(
    outside: &Path,
    unit: &Path,
    lower: &Path,
    mounted: &HashSet<PathBuf>,
) -> Result<PathBuf> {
    let merged = stage_dir(outside, unit);
    std::fs::create_dir_all(&merged).map_err(SandboxError::io("creating the layer's stage"))?;
    let canon = std::fs::canonicalize(&merged).unwrap_or_else(|_| merged.clone());
    if mounted.contains(&canon) {
        // Another run of this branch (a process that ended without releasing it) left it:
        // the same upper, so the same layer.
        return Ok(merged);
    }
    let (upper, work) =
        unit_dirs(unit, lower, true).map_err(SandboxError::io("creating the layer's unit"))?;
    let opts = overlay_options(lower, &upper, &work, false)?;
    let target = super::cstring(&merged)?;
    // SAFETY: mount(2) on NUL-terminated strings we own.
    let ret = unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            target.as_ptr(),
            c"overlay".as_ptr(),
            0,
            opts.as_ptr().cast(),
        )
    };
    if ret != 0 {
        return Err(SandboxError::Io {
            what: format!("mounting the outside layer of {}", lower.display()),
            err: io::Error::last_os_error(),
        });
    }
    Ok(merged)
}

/// Unmounts the branch's outside overlays (root), before its directory is removed: a
/// removal walking into a mounted overlay of `/` would take all day. Safe to call for any
/// directory, any number of times.
pub fn release_outside(outside: &Path) {
    let mut guard = MOUNTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(map) = guard.as_mut() {
        map.remove(outside);
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
    points.dedup();
    for p in points.iter().rev() {
        if let Err(e) = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!("unmounting the outside layer {}: {e}", p.display());
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(&base) {
        open_up(&base, meta.dev(), 0);
    }
}

/// Lets the branch's removal reach every file of the layer: overlayfs leaves its work
/// directory mode 000, and an upper keeps the modes of what it copied (a read-only
/// directory), which a plain user could not empty. Stays on the layer's file system.
fn open_up(dir: &Path, dev: u64, depth: usize) {
    if depth > 256 {
        return;
    }
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() || meta.dev() != dev {
        return;
    }
    let mode = meta.permissions().mode();
    if mode & 0o700 != 0o700 {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o700));
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            open_up(&e.path(), dev, depth + 1);
        }
    }
}

/// The plain user's units: the directories it may write, split around mounts below them.
fn user_outside(
    outside: &Path,
    hide: &[PathBuf],
    project: &Path,
    private_tmp: bool,
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
    let mut dirs: Vec<PathBuf> = candidates
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.is_dir() && p != Path::new("/"))
        .filter(|p| !under_any(p, hide) && !p.starts_with(outside))
        .collect();
    dirs.sort();
    dirs.dedup();
    // A directory inside another one is covered by it.
    let outer: Vec<PathBuf> = dirs
        .iter()
        .filter(|d| !dirs.iter().any(|o| o != *d && d.starts_with(o)))
        .cloned()
        .collect();
    let points: Vec<PathBuf> = mounts()
        .map_err(SandboxError::io("reading /proc/self/mountinfo"))?
        .into_iter()
        .map(|m| m.point)
        .collect();
    let mut units = Vec::new();
    for d in &outer {
        split(d, &points, hide, project, outside, 0, &mut units);
    }
    units.truncate(MAX_UNITS);
    let recorded = record_units(outside, true, &units)?;
    let mut views = Vec::new();
    let mut stage_mounts = Vec::new();
    for path in &units {
        let Some(unit) = recorded.get(path) else {
            continue;
        };
        let merged = stage_dir(outside, unit);
        let made = std::fs::create_dir_all(&merged)
            .and_then(|()| unit_dirs(unit, path, false))
            .map_err(SandboxError::io("creating the layer's unit"));
        let (upper, work) = match made {
            Ok(uw) => uw,
            Err(e) => {
                tracing::warn!("{} is not captured: {e}", path.display());
                continue;
            }
        };
        let Ok(opts) = overlay_options(path, &upper, &work, true) else {
            continue;
        };
        stage_mounts.push((opts, super::cstring(&merged)?, super::cstring(path)?));
        views.push(View::Layer {
            path: path.clone(),
            merged,
        });
    }
    Ok(Outside {
        views,
        ro_root: true,
        stage: Some(UserStage {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            mounts: stage_mounts,
        }),
    })
}

/// `dir` as a unit if no mount lies below it, else its subdirectories (recursively), the
/// directory itself left read-only.
fn split(
    dir: &Path,
    points: &[PathBuf],
    hide: &[PathBuf],
    project: &Path,
    outside: &Path,
    depth: usize,
    units: &mut Vec<PathBuf>,
) {
    if units.len() >= MAX_UNITS
        || under_any(dir, hide)
        || dir.starts_with(project)
        || dir.starts_with(outside)
        || !option_safe(dir)
    {
        return;
    }
    let below = points.iter().any(|p| p != dir && p.starts_with(dir));
    let covers = project.starts_with(dir) || hide.iter().any(|h| h.starts_with(dir));
    if !below && !covers {
        units.push(dir.to_path_buf());
        return;
    }
    if depth >= SPLIT_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut subs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        // A mount point is another file system: left as it is (read-only).
        .filter(|p| !points.contains(p))
        .collect();
    subs.sort();
    for s in subs {
        split(&s, points, hide, project, outside, depth + 1, units);
    }
}

impl UserStage {
    /// In the pre-exec hook (async-signal-safe): a user namespace mapping our ids to
    /// themselves and a mount namespace, the units' overlays mounted there (a unit that
    /// fails is bound read-only instead). bwrap then starts inside and binds them.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // SAFETY: plain system calls on data built before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            // shade is not dumpable (no ptrace), which leaves /proc/self's files to root;
            // exec makes bwrap dumpable anyway.
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            match write_file(c"/proc/self/setgroups", b"deny") {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                other => other?,
            }
            write_file(c"/proc/self/uid_map", &self.uid_map)?;
            write_file(c"/proc/self/gid_map", &self.gid_map)?;
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            for (opts, target, lower) in &self.mounts {
                let ret = libc::mount(
                    c"overlay".as_ptr(),
                    target.as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    opts.as_ptr().cast(),
                );
                if ret != 0 {
                    // Read-only as it is: never writable for real.
                    if libc::mount(
                        lower.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ) != 0
                    {
                        // Gone since it was planned (another program's temporary
                        // directory): nothing to show there.
                        if *libc::__errno_location() == libc::ENOENT {
                            // bwrap's --bind-try skips a source that is not there.
                            libc::rmdir(target.as_ptr());
                            continue;
                        }
                        return Err(io::Error::last_os_error());
                    }
                    if libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
        }
        Ok(())
    }
}

unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let err = io::Error::last_os_error();
    libc::close(fd);
    if n == data.len() as isize {
        Ok(())
    } else {
        Err(err)
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

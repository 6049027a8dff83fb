//! Where shade keeps its own state: branch stores (spilled file contents, mount points)
//! and accept journals. Never inside the project, never in /tmp (tmpfs would hold spilled
//! data in RAM, and /tmp may be cleaned under a live branch).

use std::path::{Path, PathBuf};

/// Root of shade's state on this machine.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// `$SHADE_STATE_DIR`, else `$XDG_STATE_HOME/shade`, else `~/.local/state/shade`.
    pub fn from_env() -> StateDir {
        if let Some(p) = std::env::var_os("SHADE_STATE_DIR").filter(|p| !p.is_empty()) {
            return StateDir::at(PathBuf::from(p));
        }
        if let Some(p) = std::env::var_os("XDG_STATE_HOME").filter(|p| !p.is_empty()) {
            return StateDir::at(PathBuf::from(p).join("shade"));
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/root"));
        StateDir::at(home.join(".local/state/shade"))
    }

    /// A state dir at an explicit place (tests use a temp dir).
    pub fn at(root: PathBuf) -> StateDir {
        StateDir { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// One directory per live branch: `store/` (spilled contents), `mnt/` (its mount point),
    /// `owner` (pid of the process serving it, for stale-branch cleanup).
    pub fn branches(&self) -> PathBuf {
        self.root.join("branches")
    }

    /// Accept history: what each accept replaced, for `shade log` and `shade undo`.
    pub fn history(&self) -> PathBuf {
        self.root.join("history")
    }

    /// Accept journals, one file per accept in progress.
    pub fn journals(&self) -> PathBuf {
        self.root.join("journals")
    }
}

/// The file that marks a directory as a shade state dir, so that the sandbox of a command
/// run with another state dir finds and hides it (see [`known_state_dirs`]).
pub const MARKER: &str = "SHADE-STATE-DIR";

/// Where each user's state dirs are listed (a symlink to each), in the user's home from the
/// password database. Hidden from commands and guarded at accept when it lies inside their
/// project ([`state_places`]): it names the state dirs every sandbox hides, and a forged
/// entry or a link in its place were followed. Elsewhere a command's writes there land in
/// its outside layer. (Not in the default
/// state dir: making that would hide it, and with it split the home's outside-layer unit.)
fn registry() -> Option<PathBuf> {
    let uid = nix::unistd::geteuid();
    let home = nix::unistd::User::from_uid(uid).ok()??.dir;
    Some(home.join(REGISTRY))
}

/// The registry's place in a home.
const REGISTRY: &str = ".local/state/shade-state-dirs";

impl StateDir {
    /// Marks the state dir ([`MARKER`]) and lists it in the user's registry, so that the
    /// sandboxes of other state dirs hide it too. Called whenever a branch is made in it;
    /// cheap when both are there already.
    pub fn mark(&self) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        let marker = self.root.join(MARKER);
        // Once per state dir per process: every branch calls this (10,000 of them in one
        // `shade mcp`), and the registry's entry does not change meanwhile.
        static MARKED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
        let mut marked = MARKED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if marked.contains(&self.root) {
            if plain_file(&marker) {
                return Ok(());
            }
        } else {
            marked.push(self.root.clone());
        }
        drop(marked);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)?;
        if !plain_file(&marker) {
            // Never through a link: a marker replaced by a dangling symlink would have this
            // write create whatever file it names (red team round 8).
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&marker)?
                .write_all(
                    b"shade keeps its state here; the sandboxes of every shade hide this directory\n",
                )?;
        }
        // The registry is best effort: the mount table finds a state dir with a live branch
        // without it.
        let (Some(reg), Ok(real)) = (registry(), std::fs::canonicalize(&self.root)) else {
            return Ok(());
        };
        if std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&reg)
            .is_err()
            || !own_dir(&reg)
        {
            return Ok(());
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&real, &mut h);
        let base = std::hash::Hasher::finish(&h);
        for k in 0..8u64 {
            let link = reg.join(format!("{:016x}", base.wrapping_add(k)));
            match std::fs::read_link(&link) {
                Ok(t) if t == real => return Ok(()),
                Ok(t) if plain_file(&t.join(MARKER)) => continue,
                // A state dir no more: the slot is free.
                Ok(_) => {
                    let _ = std::fs::remove_file(&link);
                }
                Err(_) => {}
            }
            match std::os::unix::fs::symlink(&real, &link) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(_) => return Ok(()),
            }
        }
        Ok(())
    }
}

/// The state dirs the environment and the password database name (`$SHADE_STATE_DIR`,
/// `$XDG_STATE_HOME/shade`, `$HOME/.local/state/shade`, the user's real home's) and those
/// of the user's registry that are still marked ([`StateDir::mark`]; unmarked entries are
/// pruned here). Found without walking the disk; some may not exist.
pub fn known_state_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![StateDir::from_env().root];
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    dirs.extend(env("XDG_STATE_HOME").map(|x| x.join("shade")));
    dirs.extend(env("HOME").map(|h| h.join(".local/state/shade")));
    let Some(reg) = registry() else {
        return dirs;
    };
    // The user's own default state dir, whatever the environment says.
    if let Some(home) = reg.parent() {
        dirs.push(home.join("shade"));
    }
    dirs.extend(registered(&reg));
    dirs
}

/// The marked state dirs registry `reg` lists, its stale entries pruned. Only a real
/// directory of ours is read, and only its symlinks are removed: a registry replaced by a
/// symlink (a command whose project is the home can do that) would otherwise have the
/// pruning delete the files of whatever directory it names (red team round 8).
fn registered(reg: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if !own_dir(reg) {
        return dirs;
    }
    if let Ok(entries) = std::fs::read_dir(reg) {
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            match std::fs::read_link(e.path()) {
                Ok(t) if plain_file(&t.join(MARKER)) => dirs.push(t),
                _ => {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    dirs
}

/// The state dirs and state-dir registries that lie inside `project` (canonical), as
/// absolute paths with their existing part resolved: every [`known_state_dirs`] (present
/// or not: an absent one may not be made there by a command either, or another shade would
/// later take a command's tree for its history), the directories of this user's and — as
/// root — every home's registry, the state dirs those registries list, and every state dir
/// of a shade branch mounted here. Neither the project itself nor a directory holding it
/// (a branch of a branch has a mount point inside a state dir as its project).
///
/// A branch hides these and accept refuses to write them (red team round 8: another state
/// dir inside the project was read and written whole, its history forged for `shade undo`).
/// A marked directory none of these lists (made by a shade of another environment whose
/// registry is elsewhere) is caught at accept by its marker ([`marked_above`]).
pub fn state_places(project: &Path) -> Vec<PathBuf> {
    let mut cands: Vec<PathBuf> = known_state_dirs();
    let mut registries: Vec<PathBuf> = registry().into_iter().collect();
    if nix::unistd::geteuid().is_root() {
        // Another user's registry is read, never pruned (its entries are that user's).
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        for home in passwd.lines().filter_map(|l| l.split(':').nth(5)) {
            let home = Path::new(home);
            if home.is_absolute() && home != Path::new("/") {
                registries.push(home.join(REGISTRY));
            }
        }
    }
    for reg in &registries {
        if !plain_dir(reg) {
            continue;
        }
        if let Ok(entries) = std::fs::read_dir(reg) {
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_symlink()) {
                    continue;
                }
                if let Ok(t) = std::fs::read_link(e.path()) {
                    if t.is_absolute() && plain_file(&t.join(MARKER)) {
                        cands.push(t);
                    }
                }
            }
        }
    }
    cands.extend(mounted_state_dirs());
    cands.extend(registries);
    // As named and as resolved: a symlink in a state dir's path inside the project is hidden
    // (and guarded) by its own name too, so that it cannot be replaced by a tree of the
    // command's that a later shade would take for its state.
    let lexical = |c: &&PathBuf| {
        c.is_absolute()
            && !c
                .components()
                .any(|p| matches!(p, std::path::Component::ParentDir))
    };
    let mut out: Vec<PathBuf> = cands
        .iter()
        .filter(lexical)
        .flat_map(|c| [Some(c.clone()), resolved(c)])
        .flatten()
        .filter(|c| c.starts_with(project) && c.as_path() != project)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The state dirs of the shade branches mounted here (`<state>/branches/<id>/mnt`), those
/// that are marked or whose branch has an owner file.
fn mounted_state_dirs() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for l in info.lines() {
        let Some((head, tail)) = l.split_once(" - ") else {
            continue;
        };
        let mut t = tail.split(' ');
        let (Some(fstype), Some(source)) = (t.next(), t.next()) else {
            continue;
        };
        if !(fstype == "fuse" || fstype.starts_with("fuse.")) || !source.starts_with("shade:") {
            continue;
        }
        let Some(point) = head.split(' ').nth(4) else {
            continue;
        };
        // Mount points with escapes (`\040`) are rare under a state dir: skipped.
        if point.contains('\\') {
            continue;
        }
        let point = Path::new(point);
        let root = point
            .parent()
            .filter(|_| point.file_name() == Some(std::ffi::OsStr::new("mnt")))
            .and_then(Path::parent)
            .filter(|b| b.file_name() == Some(std::ffi::OsStr::new("branches")))
            .and_then(Path::parent);
        if let Some(r) = root {
            if plain_file(&r.join(MARKER)) {
                out.push(r.to_path_buf());
            }
        }
    }
    out
}

/// `p` with its longest existing prefix resolved (the rest appended as is).
fn resolved(p: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut cur = p.to_path_buf();
    loop {
        if let Ok(c) = std::fs::canonicalize(&cur) {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return Some(out);
        }
        rest.push(cur.file_name()?.to_os_string());
        if !cur.pop() {
            return None;
        }
    }
}

/// The nearest directory at or above `rel` (relative to the project `root`, the root itself
/// excluded) that holds a state-dir [`MARKER`] in the real project, if any: a state dir no
/// list names. `seen` caches answers per directory for one plan.
pub fn marked_above(
    root: &Path,
    rel: &Path,
    seen: &mut std::collections::HashMap<PathBuf, bool>,
) -> Option<PathBuf> {
    let mut found = None;
    let mut dir = PathBuf::new();
    for c in rel.components() {
        dir.push(c);
        let marked = *seen
            .entry(dir.clone())
            .or_insert_with(|| plain_file(&root.join(&dir).join(MARKER)));
        if marked {
            found = Some(dir.clone());
            break;
        }
    }
    found
}

/// Whether `p`, not followed, is a directory.
fn plain_dir(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_dir())
}

/// Whether `p`, not followed, is a regular file.
fn plain_file(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
}

/// Whether `p`, not followed, is a directory of the effective user's.
fn own_dir(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .is_ok_and(|m| m.file_type().is_dir() && m.uid() == nix::unistd::geteuid().as_raw())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A state dir made anywhere is marked and listed, so another shade's sandbox finds it
    /// without its environment; once gone it drops out of the list.
    #[test]
    fn marked_state_dirs_are_known_until_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("elsewhere/state");
        let state = StateDir::at(root.clone());
        state.mark().unwrap();
        state.mark().unwrap();
        assert!(root.join(MARKER).is_file());
        let real = std::fs::canonicalize(&root).unwrap();
        let known = known_state_dirs();
        assert_eq!(known.iter().filter(|d| **d == real).count(), 1, "{known:?}");
        drop(tmp);
        assert!(!known_state_dirs().contains(&real));
    }

    /// A registry that is a symlink is not read, so its pruning deletes nothing of the
    /// directory it names; in a real one only symlinks are pruned (red team round 8, 05).
    #[test]
    fn a_symlinked_registry_deletes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::write(victim.join("passwd"), "precious").unwrap();
        let reg = tmp.path().join("shade-state-dirs");
        std::os::unix::fs::symlink(&victim, &reg).unwrap();
        assert!(registered(&reg).is_empty());
        assert!(victim.join("passwd").is_file());
        // The victim as a registry of its own: its file stays, a stale link goes.
        std::os::unix::fs::symlink(tmp.path().join("gone"), victim.join("stale")).unwrap();
        assert!(registered(&victim).is_empty());
        assert!(victim.join("passwd").is_file());
        assert!(std::fs::symlink_metadata(victim.join("stale")).is_err());
    }

    /// A marker replaced by a dangling symlink is refused, never written through.
    #[test]
    fn a_symlinked_marker_is_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        std::fs::create_dir(&root).unwrap();
        let target = tmp.path().join("etc-nologin");
        std::os::unix::fs::symlink(&target, root.join(MARKER)).unwrap();
        assert!(StateDir::at(root).mark().is_err());
        assert!(std::fs::symlink_metadata(&target).is_err());
    }
}

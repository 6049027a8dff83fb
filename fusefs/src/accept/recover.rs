//! Crash recovery: finish (committed) or undo (uncommitted) every accept a crash left behind.
//!
//! Recovery runs the same idempotent code as `apply`, so it is itself safe to kill and run
//! again.

use super::journal::{journal_path, Journal, Phase};
use super::{exec, guard, sys};
use std::io;
use std::path::{Path, PathBuf};

/// A `<id>.json.tmp` is a journal version that never got renamed into place (the previous
/// version, if any, rules and its own removal takes the temp file along). One without a
/// journal is the first version of an accept that crashed, or of one still writing it: the
/// latter holds its project's lock, so wait for that lock (or, when the file is unreadable
/// because it is being written, only drop it once its writer is gone).
fn drop_orphan_tmp(dir: &Path, id: &str, tmp: &Path, state: &Path) -> io::Result<()> {
    if journal_path(dir, id).exists() {
        return Ok(());
    }
    // Not shade's own file: refused and left alone.
    guard::owned(tmp)?;
    match Journal::load(tmp) {
        Ok(j) => {
            guard::check_journal(&j, id, state)?;
            if let Ok(root) = sys::open_dir_path(j.root.path()) {
                sys::lock_exclusive(&root)?;
                // Staging may have started before the crash; nothing else was touched.
                if !journal_path(dir, id).exists() && tmp.exists() {
                    return exec::roll_back_locked(&root, &j, dir);
                }
                return Ok(());
            }
        }
        Err(_) => {
            // Unreadable: its writer was killed mid-write, or is writing it right now. The id
            // starts with the writer's pid; keep the file while that process lives.
            let pid = id
                .split('-')
                .next()
                .and_then(|h| i32::from_str_radix(h, 16).ok());
            if pid.is_some_and(|pid| pid == std::process::id() as i32 || sys::process_alive(pid)) {
                return Ok(());
            }
        }
    }
    match std::fs::remove_file(tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Which projects recovery touched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoverReport {
    /// Project roots whose accept was completed from its journal.
    pub rolled_forward: Vec<PathBuf>,
    /// Project roots whose unfinished (uncommitted) accept was discarded.
    pub rolled_back: Vec<PathBuf>,
    /// Journals of accepts into another branch (a speculation into a `--shadow` session's)
    /// whose branch died with its process: its content is gone, nothing to finish.
    pub dropped: Vec<PathBuf>,
    /// Journals whose project directory no longer exists: nothing to finish, dropped.
    pub project_gone: Vec<PathBuf>,
    /// Changes a roll-forward left out because their path changed since (by project).
    pub not_applied: Vec<(PathBuf, super::NotApplied)>,
}

/// Whether `root` is the mount point of a branch in `state` whose serving process is gone
/// (a dead branch's store and mount go with its process: an accept into it cannot be finished,
/// and rolling forward would write into the bare mount-point directory).
fn dead_branch_mount(state: &crate::state::StateDir, root: &Path) -> bool {
    let branches = state.branches();
    let canonical = std::fs::canonicalize(&branches).unwrap_or_else(|_| branches.clone());
    let Some(rest) = [&branches, &canonical]
        .into_iter()
        .find_map(|b| root.strip_prefix(b).ok())
    else {
        return false;
    };
    let mut parts = rest.components();
    let (Some(id), Some(mnt), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if mnt.as_os_str() != "mnt" {
        return false;
    }
    let owner = std::fs::read_to_string(branches.join(id).join("owner")).unwrap_or_default();
    let pid: i32 = owner
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    pid <= 0 || !sys::process_alive(pid)
}

/// Process every journal in `state.journals()`. A journal that cannot be finished (its
/// project is gone or unreadable) is left in place and logged; the first such error is
/// returned after all others were processed.
pub fn recover(state: &crate::state::StateDir) -> io::Result<RecoverReport> {
    let _signals = super::DeferSignals::new();
    let dir = state.journals();
    let mut report = RecoverReport::default();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(e),
    };
    // A journals dir that is not shade's own (a command's tree put in its place) is never
    // replayed: refused, and left as it is.
    guard::owned(state.root())?;
    guard::owned(&dir)?;
    let mut names: Vec<PathBuf> = entries
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()?;
    names.sort();
    let mut first_err = None;
    for path in names {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(id) = name.strip_suffix(".json.tmp") {
            if let Err(e) = drop_orphan_tmp(&dir, id, &path, state.root()) {
                tracing::warn!(journal = %path.display(), error = %e, "stale journal temp file not removed");
            }
            continue;
        }
        let Some(id) = name.strip_suffix(".json") else {
            continue;
        };
        let result = guard::owned(&path).and_then(|()| Journal::load(&path)).and_then(|mut j| {
            guard::check_journal(&j, id, state.root())?;
            let root = j.root.path().to_path_buf();
            if dead_branch_mount(state, &root) {
                return j.remove(&dir).map(|()| report.dropped.push(root));
            }
            if matches!(std::fs::symlink_metadata(&root), Err(e) if e.kind() == io::ErrorKind::NotFound)
            {
                return j.remove(&dir).map(|()| report.project_gone.push(root));
            }
            match j.phase {
                Phase::Staging => exec::roll_back(&j, &dir).map(|()| report.rolled_back.push(root)),
                Phase::Committed | Phase::Applied => {
                    let set_aside = exec::roll_forward(&mut j, &dir)?;
                    for n in super::not_applied(&root, &j.id, &set_aside) {
                        report.not_applied.push((root.clone(), n));
                    }
                    report.rolled_forward.push(root);
                    Ok(())
                }
            }
        });
        if let Err(e) = result {
            tracing::warn!(journal = %path.display(), error = %e, "accept journal not recovered");
            first_err.get_or_insert(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(report),
    }
}

/// Drop journal `id` without finishing or undoing it (`shade recover --drop ID`), for an accept
/// that cannot be finished; returns the project it was for. Its staging directory, if any,
/// stays in the project for the user to look at.
pub fn drop_journal(state: &crate::state::StateDir, id: &str) -> io::Result<PathBuf> {
    let dir = state.journals();
    let path = journal_path(&dir, id);
    if id.contains('/') || !path.exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no accept journal {id} in {}", dir.display()),
        ));
    }
    let loaded = Journal::load(&path).ok();
    let root = loaded
        .as_ref()
        .map(|j| j.root.path().to_path_buf())
        .unwrap_or_default();
    // Unknown (unreadable journal): said as unfinished, never as rolled back.
    let committed = loaded.is_none_or(|j| j.phase != super::journal::Phase::Staging);
    for p in [path, super::journal::tmp_path(&dir, id)] {
        match std::fs::remove_file(p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    sys::fsync(&sys::open_dir_path(&dir)?)?;
    // The history must not go on claiming the accept's after-state.
    super::history::mark_dropped(&super::history::beside_journals(&dir), id, committed)?;
    Ok(root)
}

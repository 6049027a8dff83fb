//! Pre-flight: validate every path, check every base against lower now, and make sure no op
//! would have to go through a symlink. Runs before anything is staged, so a refusal leaves
//! the project exactly as it was.
//!
//! Ops are checked in plan order against a simulation of what earlier ops did: a path under
//! a directory renamed earlier is looked up at its lower place (the overlay may record bases
//! either way, so a `Present` base may match at the literal or the pre-rename place), and a
//! path the plan itself deleted or created earlier is not compared with lower again.

use super::safe_path::{base_matches, invalid_reason, rebase, Seen, Walker};
use super::{sys, AcceptError, Conflict};
use crate::fingerprint::Base;
use crate::plan::{PlanOp, ReadBase};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

/// What an earlier op left at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planned {
    File,
    Link,
    Mkdir,
    Moved,
    Gone,
}

/// The guards the journal records for the ops whose roll-forward depends on what is there.
#[derive(Clone, Copy, Debug)]
pub enum Guard {
    None,
    Delete(Base),
    Rename { from: Base, to: Base },
}

/// What earlier ops left, as a tree of path components: every question about a path and
/// its ancestors is one walk down its components, so a plan for a chain `d` levels deep
/// costs O(d) per op, not O(d) lookups of O(d)-long path comparisons each.
#[derive(Default)]
struct Planning {
    state: Option<Planned>,
    children: HashMap<OsString, Planning>,
}

impl Planning {
    /// `p` is now `k`; what was planned below it is gone (replaced with it).
    fn set(&mut self, p: &Path, k: Planned) {
        let mut n = self;
        for c in comps(p) {
            n = n.children.entry(c.to_os_string()).or_default();
        }
        n.children.clear();
        n.state = Some(k);
    }

    /// What is planned below `p` (not at `p` itself), taken out: a directory rename moves it.
    fn take_below(&mut self, p: &Path) -> HashMap<OsString, Planning> {
        let mut n = self;
        for c in comps(p) {
            match n.children.get_mut(c) {
                Some(next) => n = next,
                None => return HashMap::new(),
            }
        }
        std::mem::take(&mut n.children)
    }

    /// Put `below` (see [`Planning::take_below`]) under `p`.
    fn put_below(&mut self, p: &Path, below: HashMap<OsString, Planning>) {
        let mut n = self;
        for c in comps(p) {
            n = n.children.entry(c.to_os_string()).or_default();
        }
        n.children = below;
    }

    /// The planned states along `p`, outermost first: (number of components of the path
    /// it is at — `p` itself has all of them —, state).
    fn along(&self, p: &Path) -> Vec<(usize, Planned)> {
        let mut out = Vec::new();
        let mut n = self;
        for (i, c) in comps(p).enumerate() {
            match n.children.get(c) {
                Some(next) => n = next,
                None => break,
            }
            if let Some(k) = n.state {
                out.push((i + 1, k));
            }
        }
        out
    }
}

/// The components of a (validated, relative) plan path.
fn comps(p: &Path) -> impl Iterator<Item = &OsStr> {
    p.components().filter_map(|c| match c {
        std::path::Component::Normal(n) => Some(n),
        _ => None,
    })
}

/// The first `n` components of `p`.
fn prefix(p: &Path, n: usize) -> PathBuf {
    comps(p).take(n).collect()
}

struct Sim {
    root: RawFd,
    /// Lookups in the project keep the directories of the last one open: a plan for a
    /// chain `d` levels deep opens each level once, not once per op below it.
    walker: std::cell::RefCell<Walker>,
    planned: Planning,
    /// Earlier directory renames, (from, to), in order.
    renames: Vec<(PathBuf, PathBuf)>,
    /// Lower objects some op of the plan is based on (and checks where it saw them).
    known: Vec<Base>,
}

impl Sim {
    /// What is at `p` in the project (never following a symlink).
    fn observe(&self, p: &Path) -> io::Result<Seen> {
        self.walker.borrow_mut().observe(p)
    }

    fn set(&mut self, p: &Path, k: Planned) {
        self.planned.set(p, k);
    }

    /// The nearest planned state at `p` or an ancestor.
    fn nearest(&self, p: &Path) -> Option<Planned> {
        self.planned.along(p).last().map(|(_, k)| *k)
    }

    /// The nearest planned state at a (strict) ancestor of `p`.
    fn nearest_above(&self, p: &Path) -> Option<Planned> {
        let depth = comps(p).count();
        self.planned
            .along(p)
            .into_iter()
            .rev()
            .find(|(i, _)| *i < depth)
            .map(|(_, k)| k)
    }

    /// Where `p` was in lower before the earlier renames.
    fn map_back(&self, p: &Path) -> PathBuf {
        let mut cur = p.to_path_buf();
        for (from, to) in self.renames.iter().rev() {
            if let Some(b) = rebase(&cur, to, from) {
                cur = b;
            }
        }
        cur
    }

    fn io(path: &Path, source: io::Error) -> AcceptError {
        AcceptError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Refuse paths that go through a file or symlink (made by the plan or found in lower).
    /// Returns the blocking fingerprint found in lower, for the conflict report.
    fn parents_ok(&self, p: &Path) -> Result<Option<Seen>, AcceptError> {
        let depth = comps(p).count();
        let above: Vec<(usize, Planned)> = self
            .planned
            .along(p)
            .into_iter()
            .filter(|(i, _)| *i < depth)
            .collect();
        // Innermost first, as the ancestors were asked before.
        if let Some((i, _)) = above
            .iter()
            .rev()
            .find(|(_, k)| matches!(k, Planned::File | Planned::Link))
        {
            return Err(AcceptError::Unsafe {
                path: p.to_path_buf(),
                reason: format!(
                    "parent {} is made a file or symlink earlier in the plan",
                    prefix(p, *i).display()
                ),
            });
        }
        let mb = self.map_back(p);
        let seen = self.observe(&mb).map_err(|e| Self::io(&mb, e))?;
        if let Seen::Blocked { .. } = seen {
            // The plan may itself replace the blocking parent (delete the symlink, mkdir).
            let replaced = above
                .iter()
                .any(|(_, k)| matches!(k, Planned::Mkdir | Planned::Gone | Planned::Moved));
            if !replaced {
                return Ok(Some(seen));
            }
        }
        Ok(None)
    }

    /// Whether `base` still holds for `p`, and what was found there.
    fn holds(&self, p: &Path, base: &Base) -> Result<(bool, Base), AcceptError> {
        let lit = self.observe(p).map_err(|e| Self::io(p, e))?.base();
        let mb = self.map_back(p);
        let mapped = if mb == p {
            lit
        } else {
            self.observe(&mb).map_err(|e| Self::io(&mb, e))?.base()
        };
        let found = if matches!(mapped, Base::Present(_)) {
            mapped
        } else {
            lit
        };
        let ok = match base {
            Base::Present(_) => base_matches(base, &lit) || base_matches(base, &mapped),
            Base::Absent => {
                let shadowed = matches!(self.nearest(p), Some(Planned::Gone | Planned::Mkdir))
                    || self.renames.iter().any(|(_, to)| to == p);
                // An object the plan itself accounts for (moves here, deletes or
                // replaces) is no news; only one nobody based anything on is.
                let accounted =
                    |b: &Base| *b == Base::Absent || self.known.iter().any(|k| base_matches(k, b));
                // Under a directory an earlier rename put here, roll-forward finds what was
                // at the pre-rename place; the literal path's old contents left with
                // whatever the rename replaced (checked by that rename's own base).
                let relevant = if mb == p { &lit } else { &mapped };
                shadowed || accounted(relevant)
            }
        };
        Ok((ok, found))
    }

    /// Whether `base` still holds where it was observed (`at`, before any op runs).
    fn holds_at(&self, at: &Path, base: &Base) -> Result<(bool, Base), AcceptError> {
        let now = self.observe(at).map_err(|e| Self::io(at, e))?.base();
        Ok((base_matches(base, &now), now))
    }

    /// The object at `p` as roll-forward will find it (after earlier renames), for `force`.
    fn observed(&self, p: &Path) -> Result<Base, AcceptError> {
        if matches!(self.nearest(p), Some(Planned::Gone)) {
            return Ok(Base::Absent);
        }
        // Inside a directory the plan makes (after deleting what was there), nothing is.
        let made = self.nearest_above(p);
        if made == Some(Planned::Mkdir) {
            return Ok(Base::Absent);
        }
        let mb = self.map_back(p);
        Ok(self.observe(&mb).map_err(|e| Self::io(&mb, e))?.base())
    }
}

impl Sim {
    /// Who owns `p` in the project now, `(uid, gid)`; `None` where nothing is (or the
    /// walk meets a symlink or file: nothing the plan could keep an owner of).
    fn owner_now(&self, p: &Path) -> Option<(u32, u32)> {
        let st = if p.as_os_str().is_empty() {
            sys::lstat_at(self.root, std::ffi::OsStr::new("."))
        } else {
            let (dir, name) = self.walker.borrow_mut().open_parent(p).ok()?;
            sys::lstat_at(dir.as_raw_fd(), &name)
        };
        st.ok().flatten().map(|st| (st.st_uid, st.st_gid))
    }

    /// Who owns `p` for this op: what a directory the plan made was given (`made`),
    /// nothing inside one, else the project's owner of the object there (where earlier
    /// renames put it), also when the plan deleted it to put something else in its place.
    fn owner_before(&self, p: &Path, made: &BTreeMap<PathBuf, (u32, u32)>) -> Option<(u32, u32)> {
        if let Some(o) = made.get(p) {
            return Some(*o);
        }
        let under_new = p
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .any(|a| made.contains_key(a));
        if under_new {
            return None;
        }
        self.owner_now(&self.map_back(p))
    }

    /// As root, refuse an op that gives its path an owner the project did not have there:
    /// each of uid and gid must be the path's current one, its parent's for a new path, a
    /// renamed object's own, or shade's (`own`, else its euid/egid). Records the owners of
    /// directories the plan makes.
    fn owner_allowed(
        &self,
        op: &PlanOp,
        made: &mut BTreeMap<PathBuf, (u32, u32)>,
        own: Option<(u32, u32)>,
    ) -> Result<(), AcceptError> {
        let (path, perms) = match op {
            PlanOp::WriteFile { path, perms, .. }
            | PlanOp::Special { path, perms, .. }
            | PlanOp::Mkdir { path, perms, .. }
            | PlanOp::SetPerms { path, perms, .. } => (path, perms),
            _ => return Ok(()),
        };
        // SAFETY: geteuid/getegid cannot fail.
        let me = unsafe { (libc::geteuid(), libc::getegid()) };
        let own = own.unwrap_or(me);
        // shade's own ids as they are too: what shade itself wrote into a branch of a
        // branch (not through a command's namespace) is shade's.
        let mut allowed = vec![own, me];
        match self.owner_before(path, made) {
            Some(o) => allowed.push(o),
            None => {
                let parent = path.parent().unwrap_or(Path::new(""));
                allowed.extend(self.owner_before(parent, made));
            }
        }
        if let Some(origin) = &perms.origin {
            allowed.extend(self.owner_now(origin));
        }
        let uid = perms.uid.unwrap_or(own.0);
        let gid = perms.gid.unwrap_or(own.1);
        if !allowed.iter().any(|o| o.0 == uid) || !allowed.iter().any(|o| o.1 == gid) {
            return Err(AcceptError::Owner {
                path: op.base_at().unwrap_or(path).clone(),
                uid,
                gid,
                own,
            });
        }
        if let PlanOp::Mkdir { .. } = op {
            made.insert(path.clone(), (uid, gid));
        }
        Ok(())
    }
}

fn unsafe_path(path: &Path, reason: impl Into<String>) -> AcceptError {
    AcceptError::Unsafe {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Validate all paths of `plan` (nothing touches the file system before this passes).
pub fn validate(plan: &[PlanOp]) -> Result<(), AcceptError> {
    for op in plan {
        if let PlanOp::Special { path, mode, .. } = op {
            let kind = match mode & libc::S_IFMT {
                libc::S_IFCHR => Some("a character device"),
                libc::S_IFBLK => Some("a block device"),
                _ => None,
            };
            if let Some(kind) = kind {
                return Err(unsafe_path(
                    path,
                    format!(
                        "it is {kind}; accept writes only files, directories, symlinks, fifos \
                         and sockets (make device nodes yourself if you mean it); nothing was \
                         written"
                    ),
                ));
            }
        }
        let paths: Vec<&PathBuf> = match op {
            PlanOp::RenameDir { from, to, .. } => {
                if to.starts_with(from) || from.starts_with(to) {
                    return Err(unsafe_path(
                        to,
                        format!("cannot rename {} into itself", from.display()),
                    ));
                }
                vec![from, to]
            }
            other => vec![other.path()],
        };
        for p in paths {
            if let Some(reason) = invalid_reason(p) {
                return Err(unsafe_path(p, reason));
            }
        }
    }
    Ok(())
}

/// Check every op against lower (`root` is the project dir fd). Returns the guard to journal
/// for each op and what roll-forward is to find at its path before running it (its
/// pre-state), or every conflict found.
pub fn preflight(
    root: RawFd,
    plan: &[PlanOp],
    reads: &[ReadBase],
    force: bool,
    own: Option<(u32, u32)>,
) -> Result<Vec<(Guard, Base)>, AcceptError> {
    let known = plan
        .iter()
        .filter(|op| op.base_at().is_some())
        .filter_map(PlanOp::base)
        .filter(|b| *b != Base::Absent)
        .collect();
    let mut sim = Sim {
        root,
        walker: std::cell::RefCell::new(Walker::new(root)),
        planned: Planning::default(),
        renames: Vec::new(),
        known,
    };
    let mut conflicts = Vec::new();
    let mut guards = Vec::with_capacity(plan.len());
    // As root accept sets owners: who the plan's new directories go to, for their entries.
    let mut owners = sys::is_root().then(BTreeMap::<PathBuf, (u32, u32)>::new);
    let mut conflict = |path: &Path, expected: Base, found: Base| {
        conflicts.push(Conflict {
            path: path.to_path_buf(),
            expected,
            found,
            read: false,
        });
    };
    for op in plan {
        let (paths, bases): (Vec<&PathBuf>, Vec<Base>) = match op {
            PlanOp::RenameDir {
                from,
                to,
                base_from,
                base_to,
            } => (vec![from, to], vec![*base_from, *base_to]),
            PlanOp::WriteFile { path, base, .. }
            | PlanOp::Link { path, base, .. }
            | PlanOp::Special { path, base, .. }
            | PlanOp::Symlink { path, base, .. }
            | PlanOp::Mkdir { path, base, .. }
            | PlanOp::SetPerms { path, base, .. }
            | PlanOp::Delete { path, base, .. } => (vec![path], vec![*base]),
        };
        for (p, base) in paths.iter().zip(&bases) {
            // Conflicts name the path as the user knows it in the project: where the base
            // was seen, not a temporary name the plan moves it through.
            let shown: &Path = op.base_at().map_or(p.as_path(), |a| a.as_path());
            if let Some(Seen::Blocked { at }) = sim.parents_ok(p)? {
                if force {
                    return Err(unsafe_path(
                        p,
                        "a parent directory is a symlink or file in the project; not following it",
                    ));
                }
                conflict(shown, *base, Base::Present(at));
                continue;
            }
            if !force {
                let (ok, found) = match op.base_at() {
                    Some(at) => sim.holds_at(at, base)?,
                    None => sim.holds(p, base)?,
                };
                if !ok {
                    conflict(shown, *base, found);
                }
            }
        }
        if let Some(made) = &mut owners {
            sim.owner_allowed(op, made, own)?;
        }
        let guard = match op {
            PlanOp::Delete { path, base, .. } => {
                Guard::Delete(if force { sim.observed(path)? } else { *base })
            }
            PlanOp::RenameDir {
                from,
                to,
                base_from,
                base_to,
            } => {
                if force {
                    let f = sim.observed(from)?;
                    if !matches!(f, Base::Present(fp) if fp.is_dir()) {
                        return Err(unsafe_path(
                            from,
                            "rename source is no longer a directory; cannot force",
                        ));
                    }
                    Guard::Rename {
                        from: f,
                        to: sim.observed(to)?,
                    }
                } else {
                    Guard::Rename {
                        from: *base_from,
                        to: *base_to,
                    }
                }
            }
            _ => Guard::None,
        };
        let pre = match op {
            PlanOp::RenameDir { .. } => Base::Absent,
            other => sim.observed(other.path())?,
        };
        guards.push((guard, pre));
        match op {
            PlanOp::WriteFile { path, .. }
            | PlanOp::Link { path, .. }
            | PlanOp::Special { path, .. } => sim.set(path, Planned::File),
            PlanOp::Symlink { path, .. } => sim.set(path, Planned::Link),
            PlanOp::Mkdir { path, .. } => sim.set(path, Planned::Mkdir),
            PlanOp::SetPerms { .. } => {}
            PlanOp::RenameDir { from, to, .. } => {
                // What earlier ops planned inside the directory goes with it (a delete in a
                // directory parked at its temporary name is not undone by moving it on).
                let below = sim.planned.take_below(from);
                sim.set(from, Planned::Gone);
                sim.set(to, Planned::Moved);
                sim.planned.put_below(to, below);
                sim.renames.push((from.clone(), to.clone()));
            }
            PlanOp::Delete { path, .. } => sim.set(path, Planned::Gone),
        }
    }
    if !force {
        // Reads the branch's changes may derive from, checked where they were read.
        for r in reads {
            let seen = if r.path.as_os_str().is_empty() {
                // The project root's own listing.
                Seen::Base(sys::fstat(root).map_err(|e| Sim::io(&r.path, e))?)
            } else {
                sim.observe(&r.path).map_err(|e| Sim::io(&r.path, e))?
            };
            let now = match seen {
                Seen::Blocked { at } => Base::Present(at),
                Seen::Base(b) => b,
            };
            let blocked = matches!(seen, Seen::Blocked { .. });
            let mut changed = blocked || !r.holds(&now);
            if let (false, Some(since)) = (changed, r.subtree_since) {
                let dir =
                    super::safe_path::open_dir(root, &r.path).map_err(|e| Sim::io(&r.path, e))?;
                changed = super::safe_path::changed_below(dir.as_raw_fd(), since)
                    .map_err(|e| Sim::io(&r.path, e))?;
            }
            if changed && !conflicts.iter().any(|c| c.path == r.path) {
                let shown = if r.path.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    r.path.clone()
                };
                conflicts.push(Conflict {
                    path: shown,
                    expected: Base::Present(r.seen),
                    found: now,
                    read: true,
                });
            }
        }
    }
    if conflicts.is_empty() {
        Ok(guards)
    } else {
        tracing::debug!(?plan, "accept refused on conflicts");
        Err(AcceptError::Conflicts(conflicts))
    }
}

//! The cgroup that holds one command as root: its process limit (the pids controller), its
//! memory limit (the memory controller) and its CPU share (the cpu controller's weight), made before the command starts, entered by
//! its bwrap right before exec (so everything it starts is counted from its first fork),
//! emptied and removed after it.
//!
//! Where it comes from: cgroup v2 (at /sys/fs/cgroup, or a hybrid system's
//! /sys/fs/cgroup/unified) for the controllers enabled there, the cgroup v1 hierarchy of
//! each other one (/sys/fs/cgroup/pids, /sys/fs/cgroup/memory). Each is made below shade's
//! own cgroup (so a container's limits still apply) or, in v2 where shade's own cannot have
//! children with controllers, below the hierarchy's root. shade itself stays where it is:
//! the memory of its branches (the FUSE server's) is its own budget, not the command's; the
//! OOM killer of the command's cgroup only ever picks the command's processes.
//!
//! What the memory controller counts: the command's processes' memory and the kernel's for
//! them, the page cache they fault in (reclaimable), and what they write to a tmpfs (its
//! private /tmp and /dev/shm, its outside layer when sized): those pages are charged to
//! the writer, so they count against the memory limit as well as their own size. Swap
//! counts too (`memory.memsw.limit_in_bytes` in v1, `memory.swap.max` 0 in v2): the limit
//! is of memory and swap together.
//!
//! The CPU share: the cgroup's weight (`cpu.weight` in v2, `cpu.shares` in v1) is what all
//! the command's processes together weigh against their siblings, shade's own processes
//! and the host's other work at that level: a command that starts a hundred busy
//! processes gets, at the default weight, what one busy plain process would.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::budget::LimitHit;

/// The cgroup's processes are the command's plus bwrap's two (its monitor and the
/// sandbox's init).
const BWRAP_PROCESSES: u32 = 2;
/// How long removing an emptied cgroup is tried (the kernel frees it a moment after its
/// last process is reaped), in naps of at most [`RMDIR_NAP`]: then it is left with a log
/// line.
const RMDIR_ATTEMPTS: u32 = 100;
/// The longest nap between two tries.
const RMDIR_NAP: Duration = Duration::from_millis(20);
/// The least memory limit shade sets: bwrap and a shell must start under it.
pub(crate) const MIN_MEMORY: u64 = 16 << 20;

static SEQ: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Controller {
    Pids,
    Memory,
    Cpu,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Pids => "pids",
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
        }
    }
}

/// One directory of the command's cgroup: in v2 it may carry both controllers, in v1 one.
struct Part {
    dir: PathBuf,
    /// `cgroup.procs`, opened before the fork: the child writes "0" (itself) to it.
    procs: OwnedFd,
    v2: bool,
    controllers: Vec<Controller>,
}

/// The cgroup(s) holding one command (as root).
pub(crate) struct Cgroup {
    parts: Vec<Part>,
    max: Option<u32>,
    memory: Option<u64>,
    cpu_weight: Option<u32>,
}

/// What [`Cgroup::create`] could not have, and why (the caller warns).
pub(crate) struct Missing {
    /// Whether the process limit is missing.
    pub processes: bool,
    /// Whether the memory limit is missing.
    pub memory: bool,
    /// Whether the CPU weight is missing.
    pub cpu: bool,
    /// Why, for the warning.
    pub why: String,
}

impl Cgroup {
    /// A new cgroup allowing `max` processes and `memory` bytes to the command, and giving
    /// it `cpu_weight` (v2's scale, see `Limits::cpu_weight`; `None`: no such limit or
    /// setting). Whatever could not be had is said in [`Missing`]; `None` when nothing at
    /// all was wanted or had.
    pub(crate) fn create(
        max: Option<u32>,
        memory: Option<u64>,
        cpu_weight: Option<u32>,
    ) -> (Option<Cgroup>, Option<Missing>) {
        let mut wanted: Vec<Controller> = Vec::new();
        if max.is_some() {
            wanted.push(Controller::Pids);
        }
        if memory.is_some() {
            wanted.push(Controller::Memory);
        }
        if cpu_weight.is_some() {
            wanted.push(Controller::Cpu);
        }
        if wanted.is_empty() {
            return (None, None);
        }
        let name = format!(
            "shade-{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            pid_namespace()
        );
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let memory = memory.map(|m| m.max(MIN_MEMORY));
        let mut cg = Cgroup {
            parts: Vec::new(),
            max,
            memory,
            cpu_weight: cpu_weight.map(|w| w.clamp(1, 10_000)),
        };
        let mut why: Vec<String> = Vec::new();
        // cgroup v2 first: one directory for every controller it has.
        for (parent, controllers) in v2_candidates(&own, &wanted) {
            let todo: Vec<Controller> = controllers.into_iter().filter(|c| !cg.has(*c)).collect();
            if todo.is_empty() {
                continue;
            }
            match cg.make(&parent.join(&name), true, todo) {
                Ok(()) => {}
                Err(e) => why.push(e),
            }
        }
        // Then v1, one hierarchy per controller.
        for c in wanted.clone() {
            if cg.has(c) {
                continue;
            }
            let parents = v1_candidates(&own, c);
            if parents.is_empty() {
                why.push(format!(
                    "no cgroup hierarchy with the {} controller",
                    c.name()
                ));
            }
            for parent in parents {
                match cg.make(&parent.join(&name), false, vec![c]) {
                    Ok(()) => break,
                    Err(e) => why.push(e),
                }
            }
        }
        let missing = Missing {
            processes: max.is_some() && !cg.has(Controller::Pids),
            memory: memory.is_some() && !cg.has(Controller::Memory),
            cpu: cpu_weight.is_some() && !cg.has(Controller::Cpu),
            why: why.join("; "),
        };
        let missing = (missing.processes || missing.memory || missing.cpu).then_some(missing);
        let cg = (!cg.parts.is_empty()).then_some(cg);
        (cg, missing)
    }

    fn has(&self, c: Controller) -> bool {
        self.parts.iter().any(|p| p.controllers.contains(&c))
    }

    /// Makes `dir` with `controllers` set; `Err` says why not (and `dir` is removed).
    fn make(&mut self, dir: &Path, v2: bool, controllers: Vec<Controller>) -> Result<(), String> {
        if let Some(parent) = dir.parent() {
            sweep(parent);
        }
        let result = (|| -> std::io::Result<Part> {
            fs::create_dir(dir)?;
            for c in &controllers {
                match c {
                    Controller::Pids => fs::write(
                        dir.join("pids.max"),
                        self.max
                            .unwrap_or(u32::MAX - BWRAP_PROCESSES)
                            .saturating_add(BWRAP_PROCESSES)
                            .to_string(),
                    )?,
                    Controller::Memory => {
                        let bytes = self.memory.unwrap_or(u64::MAX).to_string();
                        if v2 {
                            fs::write(dir.join("memory.max"), &bytes)?;
                            // Memory and swap together: none of it in swap.
                            write_if_present(&dir.join("memory.swap.max"), "0")?;
                        } else {
                            fs::write(dir.join("memory.limit_in_bytes"), &bytes)?;
                            // Where swap is accounted, memory and swap together.
                            write_if_present(&dir.join("memory.memsw.limit_in_bytes"), &bytes)?;
                            // The OOM killer ends the command (a parent's setting is
                            // inherited: a disabled one would leave it hanging).
                            fs::write(dir.join("memory.oom_control"), "0")?;
                        }
                    }
                    Controller::Cpu => {
                        let weight = self.cpu_weight.unwrap_or(100);
                        if v2 {
                            fs::write(dir.join("cpu.weight"), weight.to_string())?;
                        } else {
                            fs::write(dir.join("cpu.shares"), v1_shares(weight).to_string())?;
                        }
                    }
                }
            }
            let procs = fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))?;
            Ok(Part {
                dir: dir.to_path_buf(),
                procs: procs.into(),
                v2,
                controllers,
            })
        })();
        match result {
            Ok(part) => {
                self.parts.push(part);
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_dir(dir);
                Err(format!("{}: {e}", dir.display()))
            }
        }
    }

    /// Makes `cmd`'s process enter the cgroup right before it execs.
    pub(crate) fn enter_on_exec(&self, cmd: &mut Command) {
        let fds: Vec<RawFd> = self.parts.iter().map(|p| p.procs.as_raw_fd()).collect();
        // SAFETY: write(2) of a static buffer to fds that outlive the spawn.
        unsafe {
            cmd.pre_exec(move || {
                for fd in &fds {
                    if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
    }

    /// The limits the command ran into: a fork refused at the process limit (`pids.events`'
    /// "max"), a process killed at the memory limit (the OOM killer's count).
    pub(crate) fn hits(&self) -> Vec<LimitHit> {
        let mut out = Vec::new();
        for p in &self.parts {
            for c in &p.controllers {
                match c {
                    Controller::Pids => {
                        if count(&p.dir.join("pids.events"), "max") > 0 {
                            out.extend(self.max.map(LimitHit::Processes));
                        }
                    }
                    Controller::Memory => {
                        let file = if p.v2 {
                            "memory.events"
                        } else {
                            "memory.oom_control"
                        };
                        if count(&p.dir.join(file), "oom_kill") > 0 {
                            out.extend(self.memory.map(LimitHit::Memory));
                        }
                    }
                    // A share, not a limit: nothing is ever refused.
                    Controller::Cpu => {}
                }
            }
        }
        out
    }

    /// Kills what is left in it and removes it, trying a bounded number of times.
    fn remove(&self) {
        for p in &self.parts {
            remove_dir(&p.dir);
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

fn remove_dir(dir: &Path) {
    // The sandbox's processes are still being killed as bwrap returns (its init died last):
    // the first try usually finds them. Short naps first, so an end a millisecond away is
    // not waited for 20 ms; the whole wait is as bounded as before.
    let deadline = std::time::Instant::now() + RMDIR_NAP * RMDIR_ATTEMPTS;
    let mut nap = Duration::from_millis(1);
    loop {
        let left = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in left.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2); a pid gone meanwhile gives ESRCH.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
            Err(e) if std::time::Instant::now() >= deadline => {
                tracing::warn!(
                    "could not remove the command's cgroup {}: {e}; left behind",
                    dir.display()
                );
                return;
            }
            Err(_) => {
                std::thread::sleep(nap);
                nap = (nap * 2).min(RMDIR_NAP);
            }
        }
    }
}

/// Removes the cgroups a shade that is gone left in `parent` (killed with SIGKILL, it had
/// no chance to): `shade-PID-N-NS` of our PID namespace whose PID is not a live process. Processes still in one
/// are that shade's command, left running: a shade killed while its sandbox was being set
/// up (bubblewrap binds its inner process to the outer one only at the end of its set-up)
/// leaves the sandbox unwatched, with no time limit; they are killed first (see
/// [`kill_all`]). Children cgroups make the removal fail, and those are left.
fn sweep(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let own_ns = pid_namespace();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(fields) = name.to_str().and_then(|n| n.strip_prefix("shade-")) else {
            continue;
        };
        let mut fields = fields.split('-');
        let Some(pid) = fields.next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let ns = fields.nth(1);
        // A pid is only a pid in its own namespace: another namespace's shade is none of
        // ours to judge (a name without one is an older shade's: removed if empty).
        if ns.is_some_and(|ns| ns.is_empty() || ns != own_ns) {
            continue;
        }
        // kill(pid, 0) in our own PID namespace, whatever /proc is mounted here.
        let alive = i32::try_from(pid).map_or(true, crate::accept::process_alive);
        if !alive {
            if ns.is_some() {
                kill_all(&e.path());
            }
            let _ = fs::remove_dir(e.path());
        }
    }
}

/// This process's PID namespace (the inode number of /proc/self/ns/pid), named in its
/// commands' cgroups so that [`sweep`] judges only its own namespace's pids.
fn pid_namespace() -> String {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino().to_string())
        .unwrap_or_default()
}

/// SIGKILL every process in the cgroup `dir` and wait (at most about 1 s) until it is
/// empty: `cgroup.kill` where the kernel has it (v2, Linux 5.14), else each pid of
/// `cgroup.procs` through a pidfd checked to be in `dir` still (a pid read from the file
/// may have ended and been reused meanwhile), round after round (what it forks meanwhile
/// is in the cgroup too; killing a sandbox's first process ends its PID namespace).
fn kill_all(dir: &Path) {
    let procs = dir.join("cgroup.procs");
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let killed = fs::write(dir.join("cgroup.kill"), "1").is_ok();
    for round in 0..50 {
        let Ok(list) = fs::read_to_string(&procs) else {
            return;
        };
        let pids: Vec<i32> = list.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.is_empty() {
            if round > 0 {
                tracing::info!(
                    "killed what a killed shade left running in {}",
                    dir.display()
                );
            }
            return;
        }
        if !killed {
            for pid in pids {
                kill_if_in(pid, &name);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tracing::warn!("{} still has processes after SIGKILL", dir.display());
}

/// SIGKILL `pid` through a pidfd, if the process is still in a cgroup named `name`
/// (`shade-PID-N`, in any hierarchy).
fn kill_if_in(pid: i32, name: &str) {
    // SAFETY: pidfd_open(2) of a pid; the fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let Ok(fd) = RawFd::try_from(fd) else {
        return;
    };
    if fd < 0 {
        return;
    }
    // SAFETY: a new fd of ours.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let suffix = format!("/{name}");
    let inside = !name.is_empty()
        && fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| c.lines().any(|l| l.trim_end().ends_with(&suffix)));
    if inside {
        // SAFETY: pidfd_send_signal(2) on our pidfd.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }
}

/// cgroup v1's `cpu.shares` for v2's `cpu.weight` (1024 is v1's default as 100 is v2's;
/// the kernel takes 2 at least).
fn v1_shares(weight: u32) -> u64 {
    (u64::from(weight) * 1024 / 100).max(2)
}

/// Says once per process that the CPU weight could not be set here, and why.
pub(crate) fn warn_cpu_unset(why: &str) {
    static WARNED: OnceLock<()> = OnceLock::new();
    if WARNED.set(()).is_ok() {
        tracing::warn!("the commands' CPU weight is not set here: {why}");
    }
}

/// `file`'s "`key` N" line's N (0 when there is none).
fn count(file: &Path, key: &str) -> u64 {
    fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

fn write_if_present(file: &Path, value: &str) -> std::io::Result<()> {
    match fs::write(file, value) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// v2 directories a child may be made in, each with the wanted controllers enabled for
/// its children, best first: shade's own cgroup where they are enabled already, else the
/// hierarchy's root (which may have processes and children with controllers at once).
fn v2_candidates(own: &str, wanted: &[Controller]) -> Vec<(PathBuf, Vec<Controller>)> {
    let mut out: Vec<(PathBuf, Vec<Controller>)> = Vec::new();
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let root = Path::new(root);
        if !is_cgroup2(root) {
            continue;
        }
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .trim_start_matches('/');
        let mine = root.join(rel);
        let enabled = |dir: &Path| -> Vec<Controller> {
            wanted
                .iter()
                .copied()
                .filter(|c| has_word(&dir.join("cgroup.subtree_control"), c.name()))
                .collect()
        };
        let at_mine = enabled(&mine);
        if !at_mine.is_empty() {
            out.push((mine.clone(), at_mine));
        }
        for c in wanted {
            if has_word(&root.join("cgroup.controllers"), c.name())
                && !has_word(&root.join("cgroup.subtree_control"), c.name())
            {
                let _ = fs::write(
                    root.join("cgroup.subtree_control"),
                    format!("+{}", c.name()),
                );
            }
        }
        let at_root = enabled(root);
        if !at_root.is_empty() && mine != root {
            out.push((root.to_path_buf(), at_root));
        }
    }
    // The directory with the most controllers first: a process is in one cgroup per
    // hierarchy, so one directory must carry what it can.
    out.sort_by_key(|(_, c)| std::cmp::Reverse(c.len()));
    out
}

/// v1 directories a child with controller `c` may be made in: below shade's own cgroup in
/// that hierarchy, else its root.
fn v1_candidates(own: &str, c: Controller) -> Vec<PathBuf> {
    let v1 = Path::new("/sys/fs/cgroup").join(c.name());
    if !v1.join("cgroup.procs").exists() || is_cgroup2(&v1) {
        return Vec::new();
    }
    let rel = own
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            ctrl.split(',').any(|x| x == c.name()).then_some(path)
        })
        .unwrap_or("/")
        .trim_start_matches('/');
    let mine = v1.join(rel);
    let mut out = Vec::new();
    if mine.is_dir() {
        out.push(mine);
    }
    out.push(v1);
    out.dedup();
    out
}

fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

fn has_word(file: &Path, word: &str) -> bool {
    fs::read_to_string(file).is_ok_and(|s| s.split_whitespace().any(|w| w == word))
}

/// How the memory limit is enforced for root's commands here, for `shade doctor`.
pub fn memory_enforcement() -> String {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    if let Some((dir, _)) = v2_candidates_readonly(&own)
        .into_iter()
        .find(|(_, c)| c.contains(&Controller::Memory))
    {
        return format!(
            "a memory cgroup per command (cgroup v2, below {})",
            dir.display()
        );
    }
    match v1_candidates(&own, Controller::Memory).first() {
        Some(dir) => format!(
            "a memory cgroup per command (cgroup v1, below {})",
            dir.display()
        ),
        None => "none: no cgroup with the memory controller is writable here".into(),
    }
}

/// [`v2_candidates`] without enabling anything (for `shade doctor`).
fn v2_candidates_readonly(own: &str) -> Vec<(PathBuf, Vec<Controller>)> {
    let mut out = Vec::new();
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let root = Path::new(root);
        if !is_cgroup2(root) {
            continue;
        }
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .trim_start_matches('/');
        for dir in [root.join(rel), root.to_path_buf()] {
            let file = if dir == root {
                "cgroup.controllers"
            } else {
                "cgroup.subtree_control"
            };
            if has_word(&dir.join(file), "memory") {
                out.push((dir, vec![Controller::Memory]));
            }
        }
    }
    out
}

/// Says once per process that the memory limit could not be enforced here, and why.
pub(crate) fn warn_memory_unenforced(why: &str) {
    static WARNED: OnceLock<()> = OnceLock::new();
    if WARNED.set(()).is_ok() {
        tracing::warn!("the memory limit is not enforced here: {why}");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("events");
        fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        assert_eq!(count(&f, "oom_kill"), 3);
        assert_eq!(count(&f, "max"), 0);
        fs::write(&f, "max 7\n").unwrap();
        assert_eq!(count(&f, "max"), 7);
    }

    #[test]
    fn v1_shares_scale_from_v2_weights() {
        assert_eq!(v1_shares(100), 1024);
        assert_eq!(v1_shares(10), 102);
        assert_eq!(v1_shares(1), 10);
        assert_eq!(v1_shares(10_000), 102_400);
    }
}

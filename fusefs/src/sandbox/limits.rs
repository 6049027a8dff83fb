//! What one command may consume: processes, memory, its private /tmp and /dev/shm, its
//! branch's contents and metadata, and time. [`Limits`] says how much; this module
//! enforces the process and memory limits of a plain user's command (`RLIMIT_NPROC` inside
//! the sandbox's user namespace and `RLIMIT_AS`, see [`Rlimits`]; as root the command's
//! cgroup bounds both, see cgroup.rs) and says which limits a run reached ([`LimitHit`]),
//! each in one line. Where no cgroup can be had as root (no cgroup file system mounted, or
//! a read-only one in a container), root's commands run without those limits and a warning
//! says so: `RLIMIT_NPROC` does not bind real root.

use std::ffi::OsString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use crate::budget::{BranchLimits, LimitHit, DEFAULT_METADATA};

/// How much one command may consume; `None` is no limit of shade's own (the system's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Processes (and threads) the command may have at once. `None`: the host's default
    /// share (see [`bounded`]); never unbounded, and a set value is kept within half of
    /// the host's room.
    pub max_processes: Option<u32>,
    /// Bytes of its private /tmp (a tmpfs; `None`: the kernel's default, half of RAM).
    pub tmp_size: Option<u64>,
    /// Bytes of its private /dev/shm (as `tmp_size`).
    pub shm_size: Option<u64>,
    /// Bytes of file contents its branch may hold (see [`BranchLimits::size`]).
    pub branch_size: Option<u64>,
    /// Bytes of metadata its branch may keep in shade's memory (see
    /// [`BranchLimits::metadata`]); `None` here is [`DEFAULT_METADATA`], never unbounded.
    pub branch_metadata: Option<u64>,
    /// Killed after this long.
    pub time_limit: Option<Duration>,
    /// Bytes the branch's outside layer may hold (what its commands write outside the
    /// project, kept in memory: a tmpfs held by shade for the branch's life); `None` keeps
    /// the layer on the state directory's disk, unbounded.
    pub outside_size: Option<u64>,
    /// Bytes of memory (and swap) the command may use. As root, its cgroup's limit: the
    /// command's processes together, killed by the OOM killer past it (see cgroup.rs). As a
    /// plain user, who has no cgroup of their own, `RLIMIT_AS` of each of its processes:
    /// together at most this times the process limit (see [`rlimits`]).
    pub memory: Option<u64>,
    /// The command's share of the CPU as root: its cgroup's weight (cgroup v2's
    /// `cpu.weight`, 1–10000, 100 being a plain process's; v1's `cpu.shares` is 1024 × this
    /// / 100). All its processes together weigh this much against the host's other work,
    /// however many it starts. `None`: no cpu controller setting (the system's default).
    pub cpu_weight: Option<u32>,
    /// The niceness (0–19) every process of the command starts with, root or plain user;
    /// it cannot lower it again (`RLIMIT_NICE` 0, no CAP_SYS_NICE). `None`: shade's own.
    pub nice: Option<u8>,
    /// The scheduling policy every process of the command starts with (see [`Scheduler`]).
    pub scheduler: Scheduler,
    /// Files (and pipes, sockets, memfds…) each of its processes may have open: its
    /// `RLIMIT_NOFILE` hard limit, root or plain user (never above shade's own). `None`:
    /// the host's default share (see [`bounded`]): [`DEFAULT_OPEN_FILES`] or fewer, so that
    /// times the process limit it stays within an eighth of `fs.file-max`. What a command
    /// pins in pipe buffers, socket buffers and memfds grows with it.
    pub open_files: Option<u64>,
    /// Ptys the command may have at once: the `max=` of its sandbox's own devpts, root or
    /// plain user. Every devpts but the host's shares one count (`kernel.pty.max` less
    /// `kernel.pty.reserve`) with every other sandbox and container; past it their
    /// terminals fail. `None`: the host's default share (see [`bounded`]).
    pub ptys: Option<u32>,
}

/// The CPU scheduling policy of a command's processes (sched(7)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scheduler {
    /// Left as shade's own (normally `SCHED_OTHER`).
    #[default]
    Normal,
    /// `SCHED_BATCH`: a CPU-bound workload, never preempting an interactive task on
    /// wake-up. The command may switch back to `SCHED_OTHER` (the kernel allows it to anyone;
    /// its niceness stays).
    Batch,
    /// `SCHED_IDLE`: runs only when nothing else wants the CPU (weight below nice 19). The
    /// command cannot leave it (the kernel asks for the right to lower niceness to 20 −
    /// `RLIMIT_NICE`, and that limit is 0).
    Idle,
}

impl Scheduler {
    /// The policy's name in the config and in `shade doctor`.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Normal => "normal",
            Scheduler::Batch => "batch",
            Scheduler::Idle => "idle",
        }
    }

    /// [`Scheduler::name`] read back.
    pub fn parse(text: &str) -> Option<Scheduler> {
        match text {
            "normal" => Some(Scheduler::Normal),
            "batch" => Some(Scheduler::Batch),
            "idle" => Some(Scheduler::Idle),
            _ => None,
        }
    }

    fn policy(self) -> Option<libc::c_int> {
        match self {
            Scheduler::Normal => None,
            Scheduler::Batch => Some(libc::SCHED_BATCH),
            Scheduler::Idle => Some(libc::SCHED_IDLE),
        }
    }
}

impl Limits {
    /// What a command nobody asked for gets (speculation, `shade mcp`) unless the config
    /// says otherwise: a laptop survives it, and it yields the CPU to the user's own work
    /// (weight 50, nice 10, `SCHED_BATCH`). Not `SCHED_IDLE`: `shade mcp`'s commands and
    /// the linters share this table, and an MCP client waits on its command as on any
    /// foreground one; at idle priority a busy machine starved them for minutes.
    pub const SPECULATION: Limits = Limits {
        max_processes: Some(512),
        tmp_size: Some(512 << 20),
        shm_size: Some(512 << 20),
        branch_size: Some(1 << 30),
        branch_metadata: Some(64 << 20),
        time_limit: Some(Duration::from_secs(300)),
        outside_size: Some(1 << 30),
        memory: Some(4 << 30),
        cpu_weight: Some(50),
        nice: Some(10),
        scheduler: Scheduler::Batch,
        open_files: None,
        ptys: None,
    };

    /// What `shade run` gets unless the config says otherwise: nothing below the system's
    /// own limits but the branch's metadata budget, memory (16 GiB: a build fits, a
    /// runaway command does not take the machine), processes and open files (the host's
    /// default share, see [`bounded`]), and a CPU share a little below the
    /// user's own programs (one plain process's weight for the whole command as root; nice
    /// 5 and `SCHED_BATCH` for each process).
    pub const RUN: Limits = Limits {
        max_processes: None,
        tmp_size: None,
        shm_size: None,
        branch_size: None,
        branch_metadata: None,
        time_limit: None,
        outside_size: None,
        memory: Some(16 << 30),
        cpu_weight: Some(100),
        nice: Some(5),
        scheduler: Scheduler::Batch,
        open_files: None,
        ptys: None,
    };

    /// The speculation limits in force (the config's, see [`configure`]).
    pub fn speculation() -> Limits {
        configured().map_or(Limits::SPECULATION, |c| c.speculation)
    }

    /// The `shade run` limits in force (the config's, see [`configure`]).
    pub fn run() -> Limits {
        configured().map_or(Limits::RUN, |c| c.run)
    }

    /// The branch's share: its contents and metadata budgets.
    pub fn branch(&self) -> BranchLimits {
        BranchLimits {
            size: self.branch_size,
            metadata: Some(self.branch_metadata.unwrap_or(DEFAULT_METADATA)),
        }
    }

    /// The limits in one line, for `shade doctor`.
    pub fn describe(&self) -> String {
        use crate::units::format_size;
        let size = |s: Option<u64>, none: &str| s.map_or(none.to_string(), format_size);
        format!(
            "processes {}, /tmp {}, /dev/shm {}, branch contents {}, branch metadata {}, \
             outside layer {}, memory {}, time {}, cpu weight {}, nice {}, scheduler {}, \
             open files {}, ptys {}",
            self.max_processes
                .map_or("the host's share".to_string(), |n| n.to_string()),
            size(self.tmp_size, "half of RAM"),
            size(self.shm_size, "half of RAM"),
            size(self.branch_size, "unlimited"),
            format_size(self.branch_metadata.unwrap_or(DEFAULT_METADATA)),
            size(self.outside_size, "unlimited (on disk)"),
            size(self.memory, "unlimited"),
            self.time_limit
                .map_or("unlimited".to_string(), |d| format!("{} s", d.as_secs())),
            self.cpu_weight
                .map_or("as the system's".to_string(), |w| w.to_string()),
            self.nice
                .map_or("as shade's".to_string(), |n| n.to_string()),
            self.scheduler.name(),
            self.open_files
                .map_or("the host's share".to_string(), |n| n.to_string()),
            self.ptys
                .map_or("the host's share".to_string(), |n| n.to_string()),
        )
    }
}

/// The host-wide kernel tables one command's limits are measured against, read from
/// /proc/sys when the command starts (a host with more memory has a larger file table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostTables {
    /// `fs.file-max`: open files (struct files) the whole machine may have; past it every
    /// process without CAP_SYS_ADMIN gets ENFILE.
    pub file_max: u64,
    /// `fs.nr_open`: the most a process's `RLIMIT_NOFILE` can be.
    pub nr_open: u64,
    /// Tasks (processes and threads) the machine may still start: the lower of
    /// `kernel.pid_max` and `kernel.threads-max`, less the tasks alive now.
    pub task_room: u64,
    /// Ptys every devpts but the host's own may still open, together: `kernel.pty.max`
    /// less `kernel.pty.reserve` (kept for the host's devpts), less the ptys open now
    /// (`kernel.pty.nr`, which counts the host's too).
    pub pty_room: u64,
}

/// One command's default share of the host's tables: its processes times its open files
/// stay below 1/8 of `fs.file-max`, its processes below 1/8 of the tasks the host may
/// still start, so a few commands at once (speculation, `shade mcp`, lint, the user's
/// `shade run`) leave the machine most of both.
pub const DEFAULT_SHARE: u64 = 8;
/// What a setting of the user's (config) may take at most: half of each table. Past it the
/// setting is lowered and a warning says so: one command never takes the machine's table.
pub const EXPLICIT_SHARE: u64 = 2;
/// Files a process may have open by default: the kernel's own default soft limit, what
/// most programs are written for (a build's rustc, ld, node stay far below it).
pub const DEFAULT_OPEN_FILES: u64 = 1024;
/// The least a bounded command gets, whatever the tables say: a shell, a build tool and a
/// few children must start.
const FLOOR_PROCESSES: u64 = 32;
/// As [`FLOOR_PROCESSES`], for each process's open files.
const FLOOR_OPEN_FILES: u64 = 64;
/// As [`FLOOR_PROCESSES`], for ptys: a few terminals (`script`, `tmux`, a test runner's).
/// Never 0, which devpts would take for no limit.
const FLOOR_PTYS: u64 = 8;

impl HostTables {
    /// The tables as /proc/sys says now; what cannot be read is taken as a small host's
    /// (so a command is bounded rather than not).
    pub fn read() -> HostTables {
        let num = |path: &str| -> Option<u64> {
            fs::read_to_string(path)
                .ok()
                .and_then(|t| t.split_whitespace().next()?.parse().ok())
        };
        let file_max = num("/proc/sys/fs/file-max").unwrap_or(1 << 20);
        let nr_open = num("/proc/sys/fs/nr_open").unwrap_or(1 << 20);
        let pid_max = num("/proc/sys/kernel/pid_max").unwrap_or(32768);
        let threads_max = num("/proc/sys/kernel/threads-max").unwrap_or(pid_max);
        // /proc/loadavg's fourth field: runnable/total scheduling entities (tasks) now.
        let tasks = fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| {
                let field = t.split_whitespace().nth(3)?;
                field.split_once('/')?.1.parse::<u64>().ok()
            })
            .unwrap_or(0);
        let pty_max = num("/proc/sys/kernel/pty/max").unwrap_or(4096);
        let pty_reserve = num("/proc/sys/kernel/pty/reserve").unwrap_or(1024);
        let pty_nr = num("/proc/sys/kernel/pty/nr").unwrap_or(0);
        HostTables {
            file_max,
            nr_open,
            task_room: pid_max.min(threads_max).saturating_sub(tasks),
            pty_room: pty_max.saturating_sub(pty_reserve).saturating_sub(pty_nr),
        }
    }
}

/// `limits` bounded against the host's tables (see [`HostTables`]), and what was lowered,
/// one line each. Every confined command goes through this (`shade run`, the agent's
/// commands, speculation, `shade mcp`, the linters): one left without a process limit
/// takes the host's pids with a fork bomb, and processes times files per process is what
/// it can hold of `fs.file-max`.
///
/// Unset (`None`) process and open-file limits get the defaults: [`DEFAULT_OPEN_FILES`]
/// (fewer when a set process limit leaves less of the file share per process) and as many
/// processes as the file share allows at that, at most 1/[`DEFAULT_SHARE`] of the task
/// room.
/// A set value is kept up to 1/[`EXPLICIT_SHARE`] of the tables: processes up to half the
/// task room, open files up to `fs.nr_open` and so that processes × open files stays
/// within half of `fs.file-max` (open files are lowered first).
///
/// Ptys likewise: by default less than 1/[`DEFAULT_SHARE`] of the pty room (so that that
/// many commands at once leave one for everyone else), a set value up to half of it.
pub fn bounded(limits: &Limits, host: &HostTables) -> (Limits, Vec<String>) {
    let mut notes = Vec::new();
    let pty_default = (host.pty_room.saturating_sub(1) / DEFAULT_SHARE).max(FLOOR_PTYS);
    let pty_cap = (host.pty_room / EXPLICIT_SHARE).max(pty_default);
    let ptys = match limits.ptys.map(u64::from) {
        Some(t) if t > pty_cap => {
            notes.push(format!(
                "the pty limit {t} is lowered to {pty_cap}: half of the ptys this host's \
                 sandboxes and containers may still open (kernel.pty.max less \
                 kernel.pty.reserve and the ptys open)"
            ));
            pty_cap
        }
        Some(t) => t.max(1),
        None => pty_default,
    };
    let file_default = (host.file_max / DEFAULT_SHARE).max(FLOOR_PROCESSES * FLOOR_OPEN_FILES);
    let file_cap = (host.file_max / EXPLICIT_SHARE).max(file_default);
    let task_default = (host.task_room / DEFAULT_SHARE).max(FLOOR_PROCESSES);
    let task_cap = (host.task_room / EXPLICIT_SHARE).max(task_default);
    let nr_open = host.nr_open.max(FLOOR_OPEN_FILES);
    let asked_p = limits.max_processes.map(u64::from);
    let asked_n = limits.open_files;
    let mut p = match asked_p {
        Some(p) if p > task_cap => {
            notes.push(format!(
                "the process limit {p} is lowered to {task_cap}: half of the tasks this \
                 host may still start (kernel.pid_max, kernel.threads-max)"
            ));
            task_cap
        }
        Some(p) => p.max(1),
        None => task_default,
    };
    let mut n = match asked_n {
        Some(n) => n.clamp(1, nr_open),
        // Fewer files each where a set process limit takes the file share.
        None if asked_p.is_some() => DEFAULT_OPEN_FILES
            .min(nr_open)
            .min((file_default / p).max(FLOOR_OPEN_FILES)),
        None => DEFAULT_OPEN_FILES.min(nr_open),
    };
    if asked_p.is_none() {
        // As many processes as the default file share allows at this many files each.
        p = p.min((file_default / n).max(FLOOR_PROCESSES));
    }
    if p.saturating_mul(n) > file_cap {
        let lowered = (file_cap / p).max(FLOOR_OPEN_FILES);
        if asked_n.is_some() {
            notes.push(format!(
                "the open-file limit {n} is lowered to {lowered}: {p} processes × {n} files \
                 would take more than half of the host's file table (fs.file-max {})",
                host.file_max
            ));
        }
        n = lowered;
        if p.saturating_mul(n) > file_cap {
            let fewer = (file_cap / n).max(1);
            notes.push(format!(
                "the process limit {p} is lowered to {fewer}: the host's file table \
                 (fs.file-max {}) allows no more at {n} files each",
                host.file_max
            ));
            p = fewer;
        }
    }
    let mut out = *limits;
    out.max_processes = Some(u32::try_from(p).unwrap_or(u32::MAX));
    out.open_files = Some(n);
    out.ptys = Some(u32::try_from(ptys).unwrap_or(u32::MAX));
    (out, notes)
}

/// [`bounded`] against the tables now, the notes logged (and, for a command in the
/// terminal, `foreground`, printed): what the sandbox enforces.
pub(crate) fn host_bounded(limits: &Limits, foreground: bool) -> Limits {
    let (out, notes) = bounded(limits, &HostTables::read());
    for note in notes {
        if foreground {
            eprintln!("shade: warning: {note}");
        }
        tracing::warn!("{note}");
    }
    out
}

#[derive(Clone, Copy)]
struct Configured {
    run: Limits,
    speculation: Limits,
}

static CONFIGURED: RwLock<Option<Configured>> = RwLock::new(None);

fn configured() -> Option<Configured> {
    *CONFIGURED.read().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the limits of `shade run` and of speculation/MCP commands for this process, from
/// the config file (a later call, for a file named with `--config`, replaces them).
pub fn configure(run: Limits, speculation: Limits) {
    // The FUSE threads work for these commands: the least nice of the modes (one
    // connection serves every mode in turn, and a plain user's thread can never be made
    // less nice again), the least strict policy (normal unless both are batch or idle).
    let nice = match (run.nice, speculation.nice) {
        (Some(a), Some(b)) => Some(libc::c_int::from(a.min(b))),
        _ => None,
    };
    let policy = match (run.scheduler.policy(), speculation.scheduler.policy()) {
        (Some(a), Some(b)) if a == b => Some(a),
        (Some(_), Some(_)) => Some(libc::SCHED_BATCH),
        _ => None,
    };
    crate::priority::set_serving(nice, policy);
    *CONFIGURED.write().unwrap_or_else(PoisonError::into_inner) =
        Some(Configured { run, speculation });
}

/// The argument that makes shade's binary set the command's resource limits and exec the
/// rest ([`limits_helper`]).
pub const LIMITS_HELPER_ARG: &str = "__shade-sandbox-limits";

/// The resource limits a plain user's command gets inside its sandbox (as root, its
/// cgroup bounds processes and memory instead): set by [`limits_helper`] right before the
/// command, so bwrap's own set-up is not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Rlimits {
    /// `RLIMIT_NPROC`: the processes of the command's uid in the sandbox's user namespace
    /// (the kernel keeps a count per user namespace, so the user's other processes do not
    /// eat into it).
    pub nproc: Option<u32>,
    /// `RLIMIT_AS`: each process's address space (what it maps, touched or not). bwrap.rs
    /// sets it on bwrap itself instead (see [`set_address_space`]); the helper takes it too.
    pub address_space: Option<u64>,
}

impl Rlimits {
    /// Whether there is nothing to set.
    pub(crate) fn is_empty(&self) -> bool {
        self.nproc.is_none() && self.address_space.is_none()
    }

    /// The helper's first argument: `nproc=N,as=BYTES` (either may be left out).
    fn spec(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.nproc {
            parts.push(format!("nproc={n}"));
        }
        if let Some(b) = self.address_space {
            parts.push(format!("as={b}"));
        }
        parts.join(",")
    }

    /// [`Rlimits::spec`] read back; a bare number is a process limit.
    fn parse(text: &str) -> Option<Rlimits> {
        let mut out = Rlimits::default();
        if let Ok(n) = text.parse::<u32>() {
            out.nproc = Some(n);
            return Some(out);
        }
        for part in text.split(',').filter(|p| !p.is_empty()) {
            match part.split_once('=')? {
                ("nproc", n) => out.nproc = Some(n.parse().ok()?),
                ("as", b) => out.address_space = Some(b.parse().ok()?),
                _ => return None,
            }
        }
        Some(out)
    }
}

/// Inside the sandbox, before the command (a plain user's run with limits): set the limits
/// `argv[0]` names ([`Rlimits`]) and exec `argv[1..]`. Returns only on failure.
pub fn limits_helper(argv: &[OsString]) -> i32 {
    let parsed = argv
        .first()
        .and_then(|n| n.to_str())
        .and_then(Rlimits::parse);
    let (Some(limits), Some((prog, args))) = (parsed, argv.get(1..).and_then(<[_]>::split_first))
    else {
        eprintln!("shade: {LIMITS_HELPER_ARG}: usage: nproc=N,as=BYTES COMMAND [ARG…]");
        return super::EXIT_CANNOT_EXEC;
    };
    let set = |what: &str, resource, n: libc::rlim_t| {
        let lim = libc::rlimit {
            rlim_cur: n,
            rlim_max: n,
        };
        // SAFETY: setrlimit(2) with a valid struct.
        if unsafe { libc::setrlimit(resource, &lim) } != 0 {
            eprintln!(
                "shade: cannot set the {what} limit: {}",
                std::io::Error::last_os_error()
            );
            return false;
        }
        true
    };
    if let Some(n) = limits.nproc {
        if !set("process", libc::RLIMIT_NPROC, libc::rlim_t::from(n)) {
            return super::EXIT_CANNOT_EXEC;
        }
    }
    if let Some(b) = limits.address_space {
        if !set("memory", libc::RLIMIT_AS, b) {
            return super::EXIT_CANNOT_EXEC;
        }
    }
    let err = Command::new(prog).args(args).exec();
    eprintln!("shade: {}: {err}", prog.to_string_lossy());
    super::EXIT_CANNOT_EXEC
}

/// For a plain user's run: the limits to set inside the sandbox. `RLIMIT_NPROC` counts the
/// sandbox's init too, hence one more than the command's share. Nothing as root (its
/// cgroup bounds both).
pub(crate) fn rlimits(limits: &Limits, root: bool) -> Rlimits {
    if root {
        return Rlimits::default();
    }
    Rlimits {
        nproc: limits.max_processes.map(|n| n.saturating_add(1)),
        address_space: limits.memory.map(|m| m.max(super::cgroup::MIN_MEMORY)),
    }
}

/// A command's CPU priority, set on bwrap in its pre-exec hook (so on everything it starts):
/// its niceness and scheduling policy (`Limits::nice`, `Limits::scheduler`), and
/// `RLIMIT_NICE` and `RLIMIT_RTPRIO` 0 (soft and hard), so that it can never lower its
/// niceness, leave `SCHED_IDLE` or take a real-time policy: without CAP_SYS_NICE in the
/// host's namespace (no command has it, root's included) the kernel allows only what those
/// limits allow, and raising a hard limit needs CAP_SYS_RESOURCE there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuPriority {
    nice: Option<libc::c_int>,
    policy: Option<libc::c_int>,
}

impl CpuPriority {
    /// What `limits` asks for.
    pub(crate) fn of(limits: &Limits) -> CpuPriority {
        CpuPriority {
            nice: limits.nice.map(|n| libc::c_int::from(n.min(19))),
            policy: limits.scheduler.policy(),
        }
    }

    /// Applies it to the calling process. Async-signal-safe (raw system calls only).
    pub(crate) fn apply(&self) -> std::io::Result<()> {
        let err = || Err(std::io::Error::last_os_error());
        // SAFETY: plain system calls on stack data.
        unsafe {
            if let Some(nice) = self.nice {
                // Never lower it: a shade started nicer than asked stays as nice.
                *libc::__errno_location() = 0;
                let now = libc::getpriority(libc::PRIO_PROCESS, 0);
                let known = !(now == -1 && *libc::__errno_location() != 0);
                if (!known || now < nice) && libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0 {
                    return err();
                }
            }
            if let Some(policy) = self.policy {
                let param = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, policy, &param) != 0 {
                    return err();
                }
            }
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::setrlimit(libc::RLIMIT_NICE, &zero) != 0
                || libc::setrlimit(libc::RLIMIT_RTPRIO, &zero) != 0
            {
                return err();
            }
        }
        Ok(())
    }
}

/// `RLIMIT_NOFILE` of the calling process (and what it execs) to at most `n` open files:
/// the hard limit `n` (or shade's own, if lower), the soft one no higher. Lowering a hard
/// limit is always allowed; raising it again needs CAP_SYS_RESOURCE in the host's
/// namespace, which no command has. Async-signal-safe.
pub(crate) fn set_open_files(n: u64) -> std::io::Result<()> {
    // SAFETY: getrlimit(2)/setrlimit(2) with valid structs.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let hard = lim.rlim_max.min(n);
        let new = libc::rlimit {
            rlim_cur: lim.rlim_cur.min(hard),
            rlim_max: hard,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &new) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The share of the per-user queues the kernel charges to the sandbox's host user (root's
/// too: a user namespace's counts go up to its creator's) that one command gets:
/// `RLIMIT_SIGPENDING` (queued signals) and `RLIMIT_MSGQUEUE` (POSIX message queue bytes),
/// each an eighth of shade's own (at least one default queue's bytes), so that a command
/// cannot leave its user's other programs unable to queue a signal (EAGAIN) or open a
/// message queue (EMFILE) — the red team filled both from one command (round 7).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueLimits {
    sigpending: u64,
    msgqueue: u64,
}

impl QueueLimits {
    /// The share of shade's own limits, read before the fork.
    pub(crate) fn share() -> QueueLimits {
        let own = |r| {
            // SAFETY: getrlimit(2) into a zeroed struct.
            unsafe {
                let mut lim: libc::rlimit = std::mem::zeroed();
                if libc::getrlimit(r, &mut lim) == 0 {
                    lim.rlim_cur
                } else {
                    libc::RLIM_INFINITY
                }
            }
        };
        let share = |v: u64, floor: u64| {
            if v == libc::RLIM_INFINITY {
                v
            } else {
                (v / 8).max(floor).min(v)
            }
        };
        QueueLimits {
            sigpending: share(own(libc::RLIMIT_SIGPENDING), 64),
            // One queue of the default size (10 messages of 8 KiB, with the kernel's
            // per-message overhead).
            msgqueue: share(own(libc::RLIMIT_MSGQUEUE), 96 * 1024),
        }
    }

    /// Set both on the calling process (inherited by what it execs and starts; it cannot
    /// raise them again). Async-signal-safe.
    pub(crate) fn apply(&self) -> std::io::Result<()> {
        for (r, v) in [
            (libc::RLIMIT_SIGPENDING, self.sigpending),
            (libc::RLIMIT_MSGQUEUE, self.msgqueue),
        ] {
            let lim = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            // SAFETY: setrlimit(2) with a valid struct.
            if unsafe { libc::setrlimit(r, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// `RLIMIT_AS` of the calling process (and what it execs) to `bytes`: a plain user's memory
/// limit, set last in bwrap's pre-exec hook. Async-signal-safe.
pub(crate) fn set_address_space(bytes: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit(2) with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `argv` behind whatever sets `limits` inside the sandbox: shade's own binary (`helper`,
/// bound into the sandbox), else util-linux's `prlimit`. `None` when neither is at hand
/// (the caller then warns and runs without the limits).
pub(crate) fn rlimit_argv(
    limits: Rlimits,
    helper: Option<&Path>,
    argv: Vec<OsString>,
) -> Option<Vec<OsString>> {
    let prefix: Vec<OsString> = match helper {
        Some(h) => vec![
            h.as_os_str().to_os_string(),
            LIMITS_HELPER_ARG.into(),
            limits.spec().into(),
        ],
        None => {
            let prlimit = ["/usr/bin/prlimit", "/bin/prlimit"]
                .into_iter()
                .map(Path::new)
                .find(|p| p.exists())?;
            let mut v = vec![prlimit.as_os_str().to_os_string()];
            if let Some(n) = limits.nproc {
                v.push(format!("--nproc={n}:{n}").into());
            }
            if let Some(b) = limits.address_space {
                v.push(format!("--as={b}:{b}").into());
            }
            v.push("--".into());
            v
        }
    };
    Some(prefix.into_iter().chain(argv).collect())
}

/// bwrap's options that size the private /tmp and /dev/shm: `--size BYTES` goes right
/// before the `--tmpfs` it applies to.
pub(crate) fn tmpfs_size(size: Option<u64>) -> Vec<OsString> {
    match size {
        Some(b) => vec!["--size".into(), b.max(4096).to_string().into()],
        None => Vec::new(),
    }
}

pub(crate) use super::cgroup::Cgroup;

/// The user and mount namespaces of the sandbox whose init is `pid` (its PID namespace
/// `pid_ns_ino`, checked after opening them, so a reused pid cannot give another's).
pub(crate) fn namespaces_of(pid: i32, pid_ns_ino: u64) -> Option<(fs::File, fs::File)> {
    use std::os::unix::fs::MetadataExt;
    let user = fs::File::open(format!("/proc/{pid}/ns/user")).ok()?;
    let mnt = fs::File::open(format!("/proc/{pid}/ns/mnt")).ok()?;
    let same = fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino() == pid_ns_ino;
    same.then_some((user, mnt))
}

/// Which of the sandbox's private /tmp (when it has one, `tmp`) and /dev/shm, sized by
/// `limits`, are full now: looked at from a child that enters the sandbox's namespaces
/// (`ns`, held since the start, so they outlive the command). Bounded: the child only
/// makes non-blocking calls on tmpfs, and is killed if it has not ended within a second.
pub(crate) fn full_tmpfs(ns: &(fs::File, fs::File), limits: &Limits, tmp: bool) -> Vec<LimitHit> {
    let mut asks: Vec<(&'static std::ffi::CStr, LimitHit)> = Vec::new();
    if let (Some(size), true) = (limits.tmp_size, tmp) {
        asks.push((c"/tmp", LimitHit::Tmp(size)));
    }
    if let Some(size) = limits.shm_size {
        asks.push((c"/dev/shm", LimitHit::Shm(size)));
    }
    if asks.is_empty() {
        return Vec::new();
    }
    let Ok((rd, wr)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return Vec::new();
    };
    let (user, mnt) = (ns.0.as_raw_fd(), ns.1.as_raw_fd());
    let paths: Vec<&std::ffi::CStr> = asks.iter().map(|(p, _)| *p).collect();
    // SAFETY: the child makes only async-signal-safe calls (setns, statfs, write, _exit)
    // on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Vec::new();
    }
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            if libc::setns(user, libc::CLONE_NEWUSER) != 0 && libc::geteuid() != 0 {
                libc::_exit(1);
            }
            if libc::setns(mnt, libc::CLONE_NEWNS) != 0 {
                libc::_exit(1);
            }
            for p in &paths {
                let mut st: libc::statfs = std::mem::zeroed();
                // Full: no block left, on a tmpfs.
                let full = libc::statfs(p.as_ptr(), &mut st) == 0
                    && st.f_type == libc::TMPFS_MAGIC
                    && st.f_bavail == 0;
                let b = [u8::from(full)];
                libc::write(wr.as_raw_fd(), b.as_ptr().cast(), 1);
            }
            libc::_exit(0);
        }
    }
    drop(wr);
    let mut done = false;
    for _ in 0..100 {
        // SAFETY: reaping our own child without blocking.
        if unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } != 0 {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !done {
        // SAFETY: our own child; then reaped (SIGKILL cannot be ignored).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        return Vec::new();
    }
    let mut answers = Vec::new();
    let _ = std::io::Read::read_to_end(&mut fs::File::from(rd), &mut answers);
    asks.into_iter()
        .zip(answers)
        .filter(|(_, full)| *full == 1)
        .map(|((_, hit), _)| hit)
        .collect()
}

static WARNED: OnceLock<()> = OnceLock::new();

/// Says once per process that a limit could not be enforced here, and why.
pub(crate) fn warn_unenforced(what: &str, why: &str) {
    if WARNED.set(()).is_ok() {
        tracing::warn!("{what} is not enforced here: {why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_are_described_in_one_line() {
        let d = Limits::SPECULATION.describe();
        assert_eq!(
            d,
            "processes 512, /tmp 512 MiB, /dev/shm 512 MiB, branch contents 1 GiB, \
             branch metadata 64 MiB, outside layer 1 GiB, memory 4 GiB, time 300 s, \
             cpu weight 50, nice 10, scheduler batch, open files the host's share, \
             ptys the host's share"
        );
        assert!(Limits::RUN
            .describe()
            .contains("processes the host's share"));
    }

    #[test]
    fn the_helpers_limits_are_read_back() {
        let r = Rlimits {
            nproc: Some(9),
            address_space: Some(1 << 30),
        };
        assert_eq!(Rlimits::parse(&r.spec()), Some(r));
        assert_eq!(
            Rlimits::parse("7").map(|r| (r.nproc, r.address_space)),
            Some((Some(7), None))
        );
        assert_eq!(Rlimits::parse("nproc=x"), None);
        assert!(rlimits(&Limits::SPECULATION, true).is_empty());
        assert_eq!(
            rlimits(&Limits::SPECULATION, false).address_space,
            Some(4 << 30)
        );
    }

    /// This host's tables as measured by the red team: fs.file-max 2,466,170, pid_max
    /// 32768 with ~150 tasks alive, kernel.pty.max 4096 less the reserve 1024 and one
    /// pty open.
    const HOST: HostTables = HostTables {
        file_max: 2_466_170,
        nr_open: 1 << 20,
        task_room: 32_618,
        pty_room: 3071,
    };

    /// Processes and open files, 0 where unset.
    fn both(l: &Limits) -> (u64, u64) {
        (
            l.max_processes.map_or(0, u64::from),
            l.open_files.unwrap_or(0),
        )
    }

    #[test]
    fn every_command_gets_processes_and_files_within_the_hosts_share() {
        let (run, notes) = bounded(&Limits::RUN, &HOST);
        assert!(notes.is_empty(), "{notes:?}");
        let (p, n) = both(&run);
        assert_eq!(n, DEFAULT_OPEN_FILES);
        assert_eq!(p, HOST.file_max / 8 / DEFAULT_OPEN_FILES);
        assert!(p * n <= HOST.file_max / 8);
        // Speculation keeps its 512 processes, with fewer files each.
        let (spec, notes) = bounded(&Limits::SPECULATION, &HOST);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(spec.max_processes, Some(512));
        assert_eq!(spec.open_files, Some(HOST.file_max / 8 / 512));
        // The defaults of a command made without any (Limits::default()) too.
        let (none, _) = bounded(&Limits::default(), &HOST);
        assert_eq!(none.max_processes, run.max_processes);
        // A host with pid_max 4 M: the file table bounds the processes.
        let big = HostTables {
            task_room: 4 << 20,
            ..HOST
        };
        assert_eq!(
            bounded(&Limits::RUN, &big).0.max_processes,
            run.max_processes
        );
        // A small host's pids bound them instead.
        let few = HostTables {
            task_room: 1000,
            ..HOST
        };
        assert_eq!(bounded(&Limits::RUN, &few).0.max_processes, Some(125));
    }

    #[test]
    fn a_users_limits_are_kept_within_half_of_the_hosts_tables() {
        let ask = |p: u32, n: u64| Limits {
            max_processes: Some(p),
            open_files: Some(n),
            ..Limits::RUN
        };
        // Within half: kept as asked, nothing said.
        let (l, notes) = bounded(&ask(2000, 600), &HOST);
        assert_eq!((l.max_processes, l.open_files), (Some(2000), Some(600)));
        assert!(notes.is_empty());
        // Files first.
        let (l, notes) = bounded(&ask(512, 8192), &HOST);
        assert_eq!(l.max_processes, Some(512));
        assert_eq!(l.open_files, Some(HOST.file_max / 2 / 512));
        assert_eq!(notes.len(), 1, "{notes:?}");
        // Then processes.
        let (l, notes) = bounded(&ask(u32::MAX, u64::MAX), &HOST);
        let (p, n) = both(&l);
        assert!(p <= HOST.task_room / 2 && n <= HOST.nr_open);
        assert!(p * n <= HOST.file_max / 2, "{p} × {n}");
        assert!(notes.len() >= 2, "{notes:?}");
        // Only the process limit set: fewer files each, within the default share.
        let (l, _) = bounded(
            &Limits {
                max_processes: Some(4000),
                ..Limits::RUN
            },
            &HOST,
        );
        let (p, n) = both(&l);
        assert!(p == 4000 && p * n <= HOST.file_max / 8);
    }

    #[test]
    fn every_command_gets_ptys_within_the_hosts_share() {
        // Less than an eighth: eight commands at once leave ptys for everyone else.
        for room in [3071, 3072, 3073, 1 << 20] {
            let host = HostTables {
                pty_room: room,
                ..HOST
            };
            let (l, notes) = bounded(&Limits::RUN, &host);
            assert!(notes.is_empty(), "{notes:?}");
            let p = u64::from(l.ptys.unwrap_or(0));
            assert!(
                p * DEFAULT_SHARE < room && p >= room / DEFAULT_SHARE - 1,
                "{room}: {p}"
            );
        }
        assert_eq!(bounded(&Limits::SPECULATION, &HOST).0.ptys, Some(383));
        // A table all taken (or unreadable) still leaves a command a few, never 0 (which
        // devpts takes for no limit).
        let full = HostTables {
            pty_room: 0,
            ..HOST
        };
        assert_eq!(bounded(&Limits::RUN, &full).0.ptys, Some(8));
        // A set value is kept up to half of the room, and said when lowered.
        let ask = |t: u32| Limits {
            ptys: Some(t),
            ..Limits::RUN
        };
        let (l, notes) = bounded(&ask(1000), &HOST);
        assert_eq!((l.ptys, notes.len()), (Some(1000), 0));
        let (l, notes) = bounded(&ask(u32::MAX), &HOST);
        assert_eq!(l.ptys, Some(1535));
        assert!(notes[0].contains("pty limit"), "{notes:?}");
    }

    #[test]
    fn the_branch_metadata_budget_is_never_unbounded() {
        assert_eq!(Limits::RUN.branch().metadata, Some(DEFAULT_METADATA));
        assert_eq!(Limits::SPECULATION.branch().size, Some(1 << 30));
    }
}

//! CPU time and peak memory of speculative work, measured by the kernel: the benchmark moves
//! itself into a cgroup of its own (v2 if the unified hierarchy has the controllers, else the
//! v1 `cpuacct` and `memory` hierarchies), so that the branch's FUSE threads and every
//! sandboxed command it starts (they inherit the cgroup) are counted. A speculation runs while
//! the scripted user thinks and the main agent is idle, so the cgroup's CPU time over the
//! speculation's life (start → aborted and unmounted) is the speculation's, and its memory
//! peak over that window, less the level at its start, is what it added. Without a usable
//! cgroup, CPU falls back to getrusage (self and reaped children) and memory is not measured.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};

enum Kind {
    V1 {
        cpu: PathBuf,
        mem: PathBuf,
        home: Vec<PathBuf>,
    },
    V2 {
        dir: PathBuf,
        home: PathBuf,
        peak: Mutex<File>,
    },
    Rusage,
}

/// The benchmark's own cgroup; dropping it moves the process back and removes it.
pub struct Meter {
    kind: Kind,
}

/// The counters at a window's start.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    cpu_ns: u64,
    mem: Option<u64>,
}

/// What a window measured.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Used {
    /// CPU seconds (user + system) in milliseconds.
    pub cpu_ms: f64,
    /// Peak memory above the level at the window's start, in bytes (None: not measured).
    pub peak_bytes: Option<u64>,
}

fn read_u64(p: &Path) -> Result<u64> {
    let s = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    s.trim()
        .parse()
        .with_context(|| format!("parsing {}", p.display()))
}

fn write(p: &Path, s: &str) -> Result<()> {
    std::fs::write(p, s).with_context(|| format!("writing {} to {}", s.trim(), p.display()))
}

/// This process's cgroup path in the v1 hierarchy `controller` (from /proc/self/cgroup).
fn v1_path(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
        names
            .split(',')
            .any(|n| n == controller)
            .then(|| path.to_string())
    })
}

fn rusage_ns() -> u64 {
    let total = |who| {
        nix::sys::resource::getrusage(who)
            .map(|u| {
                let t = |tv: nix::sys::time::TimeVal| {
                    tv.tv_sec() as u64 * 1_000_000_000 + tv.tv_usec() as u64 * 1000
                };
                t(u.user_time()) + t(u.system_time())
            })
            .unwrap_or(0)
    };
    total(nix::sys::resource::UsageWho::RUSAGE_SELF)
        + total(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
}

impl Meter {
    /// Move this process into a new cgroup (root needed), or fall back to getrusage.
    pub fn enter() -> Meter {
        match Self::try_v2().or_else(|_| Self::try_v1()) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("speculation bench: no cgroup ({e:#}); CPU from getrusage, no memory");
                Meter { kind: Kind::Rusage }
            }
        }
    }

    fn try_v2() -> Result<Meter> {
        let root = Path::new("/sys/fs/cgroup");
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
            .context("no cgroup v2 at /sys/fs/cgroup")?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            anyhow::bail!("cgroup v2 without the memory controller");
        }
        let text = std::fs::read_to_string("/proc/self/cgroup")?;
        let own = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .trim_start_matches('/');
        let home = root.join(own);
        // A leaf of our own beside where we are (the parent may not hold processes when
        // controllers are on for its children).
        let parent = home.parent().unwrap_or(root).to_path_buf();
        let _ = write(&parent.join("cgroup.subtree_control"), "+memory +cpu");
        let dir = parent.join(format!("shade-spec-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        write(&dir.join("cgroup.procs"), &std::process::id().to_string())?;
        let peak = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("memory.peak"))?;
        Ok(Meter {
            kind: Kind::V2 {
                dir,
                home,
                peak: Mutex::new(peak),
            },
        })
    }

    fn try_v1() -> Result<Meter> {
        let mut made = Vec::new();
        let mut home = Vec::new();
        for controller in ["cpuacct", "memory"] {
            let base = Path::new("/sys/fs/cgroup").join(controller);
            let own = v1_path(controller).context("not in a v1 hierarchy")?;
            let here = base.join(own.trim_start_matches('/'));
            let dir = here.join(format!("shade-spec-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            write(&dir.join("cgroup.procs"), &std::process::id().to_string())?;
            made.push(dir);
            home.push(here);
        }
        Ok(Meter {
            kind: Kind::V1 {
                cpu: made[0].clone(),
                mem: made[1].clone(),
                home,
            },
        })
    }

    /// How the figures are measured, for the report.
    pub fn how(&self) -> &'static str {
        match self.kind {
            Kind::V1 { .. } => "cgroup v1 (cpuacct.usage, memory.max_usage_in_bytes)",
            Kind::V2 { .. } => "cgroup v2 (cpu.stat usage_usec, memory.peak)",
            Kind::Rusage => "getrusage (CPU only)",
        }
    }

    fn cpu_ns(&self) -> u64 {
        match &self.kind {
            Kind::V1 { cpu, .. } => read_u64(&cpu.join("cpuacct.usage")).unwrap_or(0),
            Kind::V2 { dir, .. } => std::fs::read_to_string(dir.join("cpu.stat"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("usage_usec "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .map(|us| us * 1000)
                .unwrap_or(0),
            Kind::Rusage => rusage_ns(),
        }
    }

    /// Start a window: note the counters and reset the memory peak.
    pub fn begin(&self) -> Window {
        let mem = match &self.kind {
            Kind::V1 { mem, .. } => {
                let _ = write(&mem.join("memory.max_usage_in_bytes"), "0");
                read_u64(&mem.join("memory.usage_in_bytes")).ok()
            }
            Kind::V2 { dir, peak, .. } => {
                if let Ok(mut f) = peak.lock() {
                    let _ = f.write_all(b"reset\n");
                }
                read_u64(&dir.join("memory.current")).ok()
            }
            Kind::Rusage => None,
        };
        Window {
            cpu_ns: self.cpu_ns(),
            mem,
        }
    }

    /// End a window.
    pub fn end(&self, w: Window) -> Used {
        let cpu_ms = self.cpu_ns().saturating_sub(w.cpu_ns) as f64 / 1e6;
        let peak = match &self.kind {
            Kind::V1 { mem, .. } => read_u64(&mem.join("memory.max_usage_in_bytes")).ok(),
            Kind::V2 { peak, .. } => peak.lock().ok().and_then(|mut f| {
                let mut s = String::new();
                f.seek(SeekFrom::Start(0)).ok()?;
                f.read_to_string(&mut s).ok()?;
                s.trim().parse().ok()
            }),
            Kind::Rusage => None,
        };
        Used {
            cpu_ms,
            peak_bytes: match (peak, w.mem) {
                (Some(p), Some(m)) => Some(p.saturating_sub(m)),
                _ => None,
            },
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let pid = std::process::id().to_string();
        match &self.kind {
            Kind::V1 { cpu, mem, home } => {
                for h in home {
                    let _ = write(&h.join("cgroup.procs"), &pid);
                }
                let _ = std::fs::remove_dir(cpu);
                let _ = std::fs::remove_dir(mem);
            }
            Kind::V2 { dir, home, .. } => {
                let _ = write(&home.join("cgroup.procs"), &pid);
                let _ = std::fs::remove_dir(dir);
            }
            Kind::Rusage => {}
        }
    }
}

//! Finding and killing what a command left behind.
//!
//! A command's processes are those in its process group and, when it ran in a private
//! mount namespace, every process in that namespace: a daemon that called setsid() has
//! left the group but still sees (and keeps busy) the branch.

use std::collections::HashSet;
use std::fs;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// How often we look again while waiting for processes to die.
const POLL: Duration = Duration::from_millis(20);
/// How long we wait for SIGKILLed processes to disappear before giving up.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Who belongs to a run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Members {
    /// The command's process group (its pid).
    pub pgid: i32,
    /// Inode of its private mount namespace, if it has one.
    pub mnt_ns: Option<u64>,
    /// Inode of its PID namespace (confined runs): everything in it belongs to the run.
    pub pid_ns: Option<u64>,
    /// Confined runs: bwrap's monitor (our child, `pgid`). It is only ever SIGKILLed: any
    /// signal kills it, and its death kills the whole PID namespace at once (bwrap's
    /// `--die-with-parent`), which would leave the command no grace period.
    pub monitor: Option<i32>,
}

impl Members {
    /// Live (non-zombie) processes of the run, never ourselves.
    pub(crate) fn scan(&self) -> Vec<i32> {
        let me = std::process::id() as i32;
        let Ok(dir) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| pid != me && self.contains(pid))
            .collect()
    }

    fn contains(&self, pid: i32) -> bool {
        let Some((state, pgrp)) = stat_of(pid) else {
            return false;
        };
        if matches!(state, 'Z' | 'X') {
            return false;
        }
        pgrp == self.pgid
            || (self.mnt_ns.is_some() && ns_of(pid, "mnt") == self.mnt_ns)
            || (self.pid_ns.is_some() && ns_of(pid, "pid") == self.pid_ns)
    }

    /// The run's own processes, not counted as leftovers: the command (the process group
    /// leader, or pid 2 of a confined run's namespace), bwrap's monitor and the namespace's
    /// init.
    fn is_core(&self, pid: i32) -> bool {
        if pid == self.pgid {
            return true;
        }
        self.pid_ns.is_some() && matches!(inner_pid(pid), Some(1 | 2))
    }

    fn signal(&self, pids: &[i32], sig: libc::c_int) {
        // A stopped process only acts on SIGTERM once continued.
        let sigs: &[libc::c_int] = if sig == libc::SIGTERM {
            &[sig, libc::SIGCONT]
        } else {
            &[sig]
        };
        for &sig in sigs {
            // SAFETY: kill(2); a vanished pid gives ESRCH, which is fine.
            unsafe {
                match self.monitor {
                    Some(monitor) if sig == libc::SIGKILL => {
                        libc::kill(monitor, sig);
                    }
                    Some(_) => {}
                    None => {
                        libc::kill(-self.pgid, sig);
                    }
                }
                for &pid in pids {
                    if Some(pid) != self.monitor || sig == libc::SIGKILL {
                        libc::kill(pid, sig);
                    }
                }
            }
        }
    }

    /// SIGTERM to everyone, SIGKILL to whoever is still there after `grace`, or as soon
    /// as `hurry()` says so (the user pressed Ctrl-C again). Returns how many processes
    /// other than the run's own (see `is_core`) were seen alive on the way.
    pub(crate) fn terminate(&self, grace: Duration, hurry: impl Fn() -> bool) -> usize {
        let mut seen = HashSet::new();
        let mut leftovers = HashSet::new();
        let mut live = self.scan();
        if live.is_empty() {
            return 0;
        }
        let note = |live: &[i32], leftovers: &mut HashSet<i32>| {
            for &p in live {
                if !leftovers.contains(&p) && !self.is_core(p) {
                    leftovers.insert(p);
                }
            }
        };
        note(&live, &mut leftovers);
        seen.extend(&live);
        self.signal(&live, libc::SIGTERM);
        let deadline = Instant::now() + grace;
        // Most processes go at once: look again soon, then every POLL.
        let mut nap = Duration::from_millis(1);
        while !live.is_empty() && Instant::now() < deadline && !hurry() {
            sleep(nap);
            nap = (nap * 2).min(POLL);
            live = self.scan();
            note(&live, &mut leftovers);
            // Late forks get the same treatment.
            let new: Vec<i32> = live.iter().copied().filter(|p| seen.insert(*p)).collect();
            self.signal(&new, libc::SIGTERM);
        }
        let deadline = Instant::now() + KILL_WAIT;
        let mut nap = Duration::from_millis(1);
        while !live.is_empty() && Instant::now() < deadline {
            seen.extend(&live);
            self.signal(&live, libc::SIGKILL);
            sleep(nap);
            nap = (nap * 2).min(POLL);
            live = self.scan();
        }
        if !live.is_empty() {
            crate::pool::note_survivors();
            tracing::warn!(?live, "processes of the command survived SIGKILL");
        }
        leftovers.len()
    }
}

/// State letter and process group from /proc/PID/stat.
fn stat_of(pid: i32) -> Option<(char, i32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// A namespace's inode from the `KIND:[N]` link.
fn ns_of(pid: i32, kind: &str) -> Option<u64> {
    let link = fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok()?;
    let link = link.to_str()?;
    link.strip_prefix(kind)?
        .strip_prefix(":[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The process's pid in its innermost PID namespace (`NSpid:` in its status).
fn inner_pid(pid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

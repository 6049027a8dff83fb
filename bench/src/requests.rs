//! Request counts per operation on the FUSE views, from the kernel's own
//! `fuse:fuse_request_send` tracepoint: unlike times, counts do not depend on how busy
//! the machine is, so they show whether a change removed round trips.
//!
//! Each count runs in a private tracefs instance whose event filter keeps only the
//! view's own FUSE connection, so other FUSE mounts on the machine do not leak in.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const TRACEFS: &str = "/sys/kernel/tracing";

/// Requests one operation sent, by opcode name (`FUSE_LOOKUP` → count).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    pub total: u64,
    pub by_opcode: BTreeMap<String, u64>,
}

impl Counts {
    /// "3000 (LOOKUP 1000, CREATE 1000, WRITE 1000)", largest first.
    pub fn describe(&self) -> String {
        let mut ops: Vec<_> = self.by_opcode.iter().collect();
        ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = ops
            .iter()
            .map(|(op, n)| format!("{} {n}", op.trim_start_matches("FUSE_")))
            .collect();
        if parts.is_empty() {
            "0".into()
        } else {
            format!("{} ({})", self.total, parts.join(", "))
        }
    }
}

/// A tracefs instance recording the FUSE requests sent to one connection.
pub struct Tracer {
    dir: PathBuf,
}

impl Tracer {
    /// Trace requests to the FUSE filesystem mounted at `mountpoint`.
    pub fn new(mountpoint: &Path) -> Result<Tracer> {
        let dev = std::fs::metadata(mountpoint)
            .with_context(|| format!("stat {}", mountpoint.display()))?
            .dev();
        // The tracepoint prints the kernel's dev_t: major << 20 | minor.
        let kdev = (libc::major(dev) << 20) | libc::minor(dev);
        let dir = PathBuf::from(TRACEFS).join("instances").join(format!(
            "shade-bench-{}-{}",
            std::process::id(),
            kdev
        ));
        if !Path::new(TRACEFS)
            .join("events/fuse/fuse_request_send")
            .exists()
        {
            bail!("{TRACEFS}/events/fuse/fuse_request_send missing: no FUSE tracepoints here");
        }
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let t = Tracer { dir };
        t.write("buffer_size_kb", "16384")?;
        t.write(
            "events/fuse/fuse_request_send/filter",
            &format!("connection == {kdev}"),
        )?;
        Ok(t)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let p = self.dir.join(file);
        std::fs::write(&p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
    }

    /// Requests sent while `f` runs.
    pub fn count(&self, f: impl FnOnce() -> Result<()>) -> Result<Counts> {
        self.write("trace", "")?;
        self.write("events/fuse/fuse_request_send/enable", "1")?;
        let res = f();
        self.write("events/fuse/fuse_request_send/enable", "0")?;
        res?;
        let text = std::fs::read_to_string(self.dir.join("trace"))?;
        let mut c = Counts::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            // "... fuse_request_send: connection 55 req 12 opcode 1 (FUSE_LOOKUP) len 45"
            let Some(op) = line
                .split_once(" (")
                .and_then(|(_, rest)| rest.split_once(')'))
                .map(|(op, _)| op)
            else {
                continue;
            };
            c.total += 1;
            *c.by_opcode.entry(op.to_string()).or_default() += 1;
        }
        let lost = self.overruns()?;
        if lost > 0 {
            bail!("the trace buffer lost {lost} events: counts would be short");
        }
        Ok(c)
    }

    /// Events dropped because a per-CPU buffer was full, over all CPUs.
    fn overruns(&self) -> Result<u64> {
        let mut lost = 0;
        for e in std::fs::read_dir(self.dir.join("per_cpu"))? {
            let stats = std::fs::read_to_string(e?.path().join("stats"))?;
            lost += stats
                .lines()
                .find_map(|l| l.strip_prefix("overrun: "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
        Ok(lost)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.write("events/fuse/fuse_request_send/enable", "0");
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("bench: removing {}: {e}", self.dir.display());
        }
    }
}

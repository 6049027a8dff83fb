//! Crash harness for accept (issue 3): SIGKILL the accepting process at many points, recover,
//! and check that no file is ever torn and that the tree ends up exactly old or exactly new.
//!
//! The test binary re-executes itself (`current_exe() --exact crash_child`) as the child that
//! runs `apply` (or `recover`) on a prepared tree of ~500 entries with a dir rename, type
//! changes, a whole-tree delete, new, modified and deleted files and symlinks. The parent kills
//! it either deterministically (`SHADE_FAULT_KILL_AT_STEP=N`, the accept engine's fault
//! injection hook) or after a random delay, then runs `recover` itself and compares:
//! - before recovery: every file/symlink in the tree is byte-identical to its old or its new
//!   version (never torn), every directory exists in the old or the new state;
//! - after recovery: the tree equals the new state exactly if the journal had committed, the
//!   old state exactly if it had not, and nothing of accept's own is left.
//!
//! Some trials also kill the recovery itself once (recovery must be re-runnable).
//! `SHADE_CRASH_SEED` reproduces the random part; `SHADE_CRASH_RANDOM` sets its trial count.
#![allow(clippy::unwrap_used)]

mod accept_common;

use accept_common::{materialize, snapshot, Entry, Env, Snap};
use shade_fusefs::accept::{
    apply, recover, AcceptOptions, FAIL_AT_STEP_ENV, KILL_AT_STEP_ENV, RUN_AT_STEP_ENV,
};
use shade_fusefs::{Base, Perms, PlanOp};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_DIR_ENV: &str = "SHADE_CRASH_CHILD_DIR";
const CHILD_MODE_ENV: &str = "SHADE_CRASH_CHILD_MODE";

/// One change of the branch, in plan order (the order the overlay emits).
#[derive(Clone, Debug)]
enum Abs {
    RenameDir(PathBuf, PathBuf),
    Delete(PathBuf),
    Mkdir(PathBuf, u32),
    Write(PathBuf, Vec<u8>, u32),
    Link(PathBuf, PathBuf),
    /// A second name of a file written earlier in the plan.
    HardLink(PathBuf, PathBuf),
    SetPerms(PathBuf, u32),
}

fn p(s: impl AsRef<str>) -> PathBuf {
    PathBuf::from(s.as_ref())
}

fn content(tag: &str, i: usize) -> Vec<u8> {
    // Sizes from 0 to ~48 KiB so a torn copy would show.
    let len = (i * 7919) % 49_152;
    let len = len.max((i % 11).min(1));
    let line = format!("{tag} {i}\n");
    let mut v = line.repeat(len / line.len() + 1).into_bytes();
    v.truncate(len);
    v
}

fn old_tree() -> Snap {
    let mut s = Snap::new();
    for d in 0..20 {
        s.insert(p(format!("d{d:02}")), Entry::Dir(0o755));
        for f in 0..15 {
            let i = d * 15 + f;
            let mode = if i % 4 == 0 { 0o755 } else { 0o644 };
            s.insert(
                p(format!("d{d:02}/f{f:02}")),
                Entry::File(content("old", i), mode),
            );
        }
    }
    s.insert(p("d00/l0"), Entry::Link(p("f00")));
    s.insert(p("ren_a"), Entry::Dir(0o755));
    s.insert(p("ren_a/sub"), Entry::Dir(0o700));
    for k in 0..20 {
        s.insert(
            p(format!("ren_a/x{k}")),
            Entry::File(content("ren", k), 0o644),
        );
    }
    for k in 0..5 {
        s.insert(
            p(format!("ren_a/sub/y{k}")),
            Entry::File(content("rensub", k), 0o600),
        );
    }
    for a in 0..3 {
        s.insert(p(format!("gone/g{a}/h")), Entry::Dir(0o755));
        s.insert(p(format!("gone/g{a}")), Entry::Dir(0o755));
        for k in 0..10 {
            s.insert(
                p(format!("gone/g{a}/h/z{k}")),
                Entry::File(content("gone", a * 10 + k), 0o644),
            );
        }
    }
    s.insert(p("gone"), Entry::Dir(0o755));
    s.insert(p("t2f"), Entry::Dir(0o755));
    for k in 0..3 {
        s.insert(
            p(format!("t2f/c{k}")),
            Entry::File(content("t2f", k), 0o644),
        );
    }
    s.insert(p("f2t"), Entry::File(content("f2t", 1), 0o644));
    // A directory removed and made again, with a new file of an old name.
    s.insert(p("redo"), Entry::Dir(0o755));
    for k in 0..3 {
        s.insert(
            p(format!("redo/r{k}")),
            Entry::File(content("redo", k), 0o644),
        );
    }
    s
}

fn changes() -> Vec<Abs> {
    let mut v = vec![Abs::RenameDir(p("ren_a"), p("ren_b"))];
    v.push(Abs::Delete(p("t2f")));
    v.push(Abs::Delete(p("f2t")));
    v.push(Abs::Delete(p("redo")));
    v.push(Abs::Mkdir(p("newdir"), 0o755));
    v.push(Abs::Mkdir(p("newdir/sub"), 0o750));
    v.push(Abs::Mkdir(p("f2t"), 0o755));
    v.push(Abs::Mkdir(p("redo"), 0o750));
    for d in 0..20 {
        for f in 0..15 {
            let i = d * 15 + f;
            if i % 3 == 0 {
                let mode = if i % 2 == 0 { 0o755 } else { 0o640 };
                v.push(Abs::Write(
                    p(format!("d{d:02}/f{f:02}")),
                    content("new", i),
                    mode,
                ));
            }
        }
        for k in 0..5 {
            v.push(Abs::Write(
                p(format!("d{d:02}/n{k}")),
                content("added", d * 5 + k),
                0o644,
            ));
        }
    }
    for k in 0..40 {
        v.push(Abs::Write(
            p(format!("newdir/sub/m{k}")),
            content("newdir", k),
            0o644,
        ));
    }
    for k in 0..5 {
        v.push(Abs::Write(
            p(format!("ren_b/x{k}")),
            content("renmod", k),
            0o644,
        ));
    }
    v.push(Abs::Write(p("ren_b/new1"), content("rennew", 1), 0o644));
    v.push(Abs::Write(p("t2f"), content("t2f-file", 2), 0o644));
    v.push(Abs::Write(p("f2t/a"), content("f2t-a", 3), 0o644));
    v.push(Abs::Write(p("redo/r1"), content("redo-new", 1), 0o644));
    v.push(Abs::Link(p("d00/l0"), p("f01")));
    v.push(Abs::Link(p("d01/lnew"), p("../d00/f00")));
    v.push(Abs::HardLink(p("d03/hard"), p("newdir/sub/m0")));
    v.push(Abs::HardLink(p("ren_b/hard"), p("d00/n0")));
    v.push(Abs::SetPerms(p("d02"), 0o750));
    for d in 0..20 {
        for f in 0..15 {
            let i = d * 15 + f;
            if i % 7 == 1 && i % 3 != 0 {
                v.push(Abs::Delete(p(format!("d{d:02}/f{f:02}"))));
            }
        }
    }
    v.push(Abs::Delete(p("ren_b/x10")));
    v.push(Abs::Delete(p("ren_b/sub/y0")));
    v.push(Abs::Delete(p("gone")));
    v
}

/// The model: what the tree must be after the changes (independent of the engine).
fn model(old: &Snap, changes: &[Abs]) -> Snap {
    let mut s = old.clone();
    let remove_tree = |s: &mut Snap, at: &Path| s.retain(|k, _| !k.starts_with(at));
    for c in changes {
        match c {
            Abs::RenameDir(from, to) => {
                let moved: Vec<_> = s
                    .iter()
                    .filter(|(k, _)| k.starts_with(from))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                remove_tree(&mut s, from);
                for (k, v) in moved {
                    s.insert(to.join(k.strip_prefix(from).unwrap()), v);
                }
            }
            Abs::Delete(at) => remove_tree(&mut s, at),
            Abs::Mkdir(at, mode) | Abs::SetPerms(at, mode) => {
                s.insert(at.clone(), Entry::Dir(*mode));
            }
            Abs::Write(at, b, mode) => {
                s.insert(at.clone(), Entry::File(b.clone(), *mode));
            }
            Abs::Link(at, t) => {
                s.insert(at.clone(), Entry::Link(t.clone()));
            }
            Abs::HardLink(at, t) => {
                let e = s.get(t).cloned().expect("hard link target in the model");
                s.insert(at.clone(), e);
            }
        }
    }
    s
}

fn map_back(path: &Path) -> PathBuf {
    match path.strip_prefix("ren_b") {
        Ok(rest) => Path::new("ren_a").join(rest),
        Err(_) => path.to_path_buf(),
    }
}

/// The plan a branch would hand to accept for `changes`, with bases observed now.
fn plan(env: &mut Env, changes: &[Abs]) -> Vec<PlanOp> {
    let mut deleted: Vec<PathBuf> = Vec::new();
    let base = |env: &Env, deleted: &[PathBuf], at: &Path| -> Base {
        if deleted.iter().any(|d| at.starts_with(d)) {
            Base::Absent
        } else {
            env.base(map_back(at).to_str().unwrap())
        }
    };
    let mut out = Vec::new();
    for c in changes {
        out.push(match c {
            Abs::RenameDir(from, to) => PlanOp::RenameDir {
                from: from.clone(),
                to: to.clone(),
                base_from: env.base(from.to_str().unwrap()),
                base_to: Base::Absent,
            },
            Abs::Delete(at) => {
                let b = base(env, &deleted, at);
                deleted.push(at.clone());
                PlanOp::Delete {
                    path: at.clone(),
                    base: b,
                    base_at: None,
                }
            }
            Abs::Mkdir(at, mode) => PlanOp::Mkdir {
                path: at.clone(),
                perms: accept_common::perms(*mode),
                base: Base::Absent,
                base_at: None,
            },
            Abs::SetPerms(at, mode) => PlanOp::SetPerms {
                path: at.clone(),
                // Times are set last, in clean-up: a re-run must set them again.
                perms: Perms {
                    times: Some(((1_000_000_000, 5), (1_000_000_000, 7))),
                    ..accept_common::perms(*mode)
                },
                base: base(env, &deleted, at),
                base_at: None,
            },
            Abs::HardLink(at, t) => PlanOp::Link {
                path: at.clone(),
                target: t.clone(),
                base: base(env, &deleted, at),
                base_at: None,
            },
            Abs::Write(at, bytes, mode) => {
                let b = base(env, &deleted, at);
                env.write(at.to_str().unwrap(), bytes, *mode, b)
            }
            Abs::Link(at, t) => PlanOp::Symlink {
                path: at.clone(),
                target: t.clone(),
                base: base(env, &deleted, at),
                base_at: None,
            },
        });
    }
    out
}

/// The child side: does nothing in a normal test run.
#[test]
fn crash_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let mut env = Env::at_existing(&dir);
    if std::env::var(CHILD_MODE_ENV).as_deref() == Ok("recover") {
        recover(&env.state).unwrap();
    } else if std::env::var(CHILD_MODE_ENV).as_deref() == Ok("fault") {
        // Say how the accept ended, for the fault harness.
        let plan = plan(&mut env, &changes());
        let opts = AcceptOptions {
            force: false,
            state: env.state.clone(),
            reads: Vec::new(),
            own: None,
        };
        let outcome = match apply(&env.root, plan, &opts) {
            Ok(r) if r.not_applied.is_empty() => "ok".to_string(),
            Ok(r) => format!(
                "partial {}",
                r.not_applied
                    .iter()
                    .map(|n| n.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Err(e) if e.nothing_written() => format!("unchanged {e}"),
            Err(e @ shade_fusefs::AcceptError::Unfinished { .. }) => format!("unfinished {e}"),
            Err(e) => format!("other {e}"),
        };
        std::fs::write(dir.join("outcome"), outcome).unwrap();
    } else {
        let plan = plan(&mut env, &changes());
        apply(
            &env.root,
            plan,
            &AcceptOptions {
                force: false,
                state: env.state.clone(),
                reads: Vec::new(),
                own: None,
            },
        )
        .unwrap();
    }
    std::process::exit(0);
}

enum Kill {
    AtStep(u64),
    After(Duration),
}

/// Run the child on `dir`; `true` when it was killed, `false` when it ran to completion.
fn run_child(dir: &Path, mode: &str, kill: Kill) -> bool {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "crash_child",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env(CHILD_DIR_ENV, dir)
    .env(CHILD_MODE_ENV, mode)
    .env_remove(KILL_AT_STEP_ENV)
    .env_remove(FAIL_AT_STEP_ENV)
    .env_remove(RUN_AT_STEP_ENV)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Kill::AtStep(n) = kill {
        cmd.env(KILL_AT_STEP_ENV, n.to_string());
    }
    let mut child = cmd.spawn().unwrap();
    if let Kill::After(d) = kill {
        std::thread::sleep(d);
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    match out.status.signal() {
        Some(libc::SIGKILL) => true,
        _ => {
            assert!(
                out.status.success(),
                "child failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            false
        }
    }
}

/// The journal phase a crash left (None: no journal).
fn journal_phase(env: &Env) -> Option<String> {
    let rd = std::fs::read_dir(env.state.journals()).ok()?;
    for e in rd {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "json") {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            return Some(v["phase"].as_str().unwrap().to_string());
        }
    }
    None
}

fn is_scratch(p: &Path) -> bool {
    p.iter().any(|c| c.to_string_lossy().starts_with(".shade-"))
}

/// Every path fully old or fully new (files byte-exact, dirs known to one of the states).
fn check_not_torn(now: &Snap, old: &Snap, new: &Snap) -> Result<(), String> {
    for (path, e) in now {
        if is_scratch(path) {
            continue;
        }
        let candidates = [old.get(path), new.get(path), old.get(&map_back(path))];
        let ok = match e {
            Entry::Dir(_) => candidates.iter().any(|c| matches!(c, Some(Entry::Dir(_)))),
            _ => candidates.contains(&Some(e)),
        };
        if !ok {
            return Err(format!(
                "{} is neither old nor new: {:?}",
                path.display(),
                short(e)
            ));
        }
    }
    Ok(())
}

fn short(e: &Entry) -> String {
    match e {
        Entry::File(b, m) => format!("file {} bytes mode {m:o}", b.len()),
        other => format!("{other:?}"),
    }
}

fn first_diff(a: &Snap, b: &Snap) -> String {
    for (k, v) in a {
        match b.get(k) {
            None => return format!("{} only on the left", k.display()),
            Some(w) if w != v => {
                return format!("{} differs: {} vs {}", k.display(), short(v), short(w))
            }
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            return format!("{} only on the right", k.display());
        }
    }
    "equal".into()
}

struct Harness {
    old: Snap,
    new: Snap,
    trials: usize,
    failures: Vec<String>,
    completed_runs: usize,
    committed_kills: usize,
}

impl Harness {
    fn fresh(&self) -> Env {
        // A SIGKILL does not lose page-cache data, so durability is not what this tests:
        // tmpfs (when there is one) keeps the fsyncs cheap and the harness fast.
        let base = std::env::var_os("SHADE_CRASH_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                if Path::new("/dev/shm").is_dir() {
                    PathBuf::from("/dev/shm")
                } else {
                    std::env::temp_dir()
                }
            });
        let env = Env::in_dir(tempfile::tempdir_in(base).unwrap());
        materialize(&env.root, &self.old);
        env
    }

    /// One trial: prepare, run the child with `kill`, (maybe) crash a recovery too, recover,
    /// check. Returns whether the child was killed.
    fn trial(&mut self, label: String, kill: Kill, kill_recovery_at: Option<u64>) -> bool {
        self.trials += 1;
        let env = self.fresh();
        let killed = run_child(&env.dir, "apply", kill);
        if let Err(e) = self.check(&env, killed, kill_recovery_at) {
            self.failures.push(format!("{label}: {e}"));
        }
        killed
    }

    fn check(
        &mut self,
        env: &Env,
        killed: bool,
        kill_recovery_at: Option<u64>,
    ) -> Result<(), String> {
        let phase = journal_phase(env);
        if !killed {
            self.completed_runs += 1;
        }
        if matches!(phase.as_deref(), Some("Committed" | "Applied")) {
            self.committed_kills += 1;
        }
        check_not_torn(&snapshot(&env.root), &self.old, &self.new)
            .map_err(|e| format!("after the kill: {e}"))?;
        if let Some(k) = kill_recovery_at {
            run_child(&env.dir, "recover", Kill::AtStep(k));
            check_not_torn(&snapshot(&env.root), &self.old, &self.new)
                .map_err(|e| format!("after a killed recovery: {e}"))?;
        }
        let report = recover(&env.state).map_err(|e| format!("recover: {e}"))?;
        let root = std::fs::canonicalize(&env.root).unwrap();
        if kill_recovery_at.is_none() {
            let (fwd, back) = match phase.as_deref() {
                Some("Committed" | "Applied") => (vec![root], vec![]),
                Some(_) => (vec![], vec![root]),
                None => (vec![], vec![]),
            };
            if report.rolled_forward != fwd || report.rolled_back != back {
                return Err(format!("recover report {report:?} for journal {phase:?}"));
            }
        }
        let now = snapshot(&env.root);
        let ok = match phase.as_deref() {
            Some("Committed" | "Applied") => now == self.new,
            Some(_) => now == self.old,
            None => now == self.old || now == self.new,
        };
        if !ok {
            return Err(format!(
                "after recovery (journal {phase:?}) the tree is not the expected state: vs old: {}; vs new: {}",
                first_diff(&now, &self.old),
                first_diff(&now, &self.new)
            ));
        }
        if !killed && now != self.new {
            return Err("a completed accept did not produce the new state".into());
        }
        std::panic::catch_unwind(|| env.assert_clean())
            .map_err(|_| "accept left scratch files or journals".to_string())
    }
}

/// xorshift64*: enough randomness for kill timing without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn crash_harness() {
    let started = Instant::now();
    let old = old_tree();
    let new = model(&old, &changes());
    let mut h = Harness {
        old,
        new,
        trials: 0,
        failures: Vec::new(),
        completed_runs: 0,
        committed_kills: 0,
    };

    // The prepared tree is exactly the old state, and a clean run gives exactly the new one.
    // Three reference runs: each must give exactly the new state; their mean duration sets
    // the window for the random kills.
    let mut full_run = Duration::ZERO;
    for _ in 0..3 {
        let env = h.fresh();
        assert_eq!(snapshot(&env.root), h.old);
        let t0 = Instant::now();
        assert!(!run_child(&env.dir, "apply", Kill::AtStep(u64::MAX)));
        full_run += t0.elapsed() / 3;
        assert_eq!(first_diff(&snapshot(&env.root), &h.new), "equal");
        env.assert_clean();
    }

    let seed = std::env::var("SHADE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let mut rng = Rng(seed);

    // Deterministic: kill at step 1, 1+stride, ... until a run completes; every 4th trial
    // also kills the recovery once.
    let n_ops = changes().len() as u64;
    let stride = (2 * n_ops / 100).max(1);
    let mut step = 1;
    let mut det = 0;
    loop {
        let kill_rec = (det % 4 == 3).then(|| 1 + rng.next() % 40);
        let killed = h.trial(
            format!("kill at step {step} (recovery killed at {kill_rec:?})"),
            Kill::AtStep(step),
            kill_rec,
        );
        det += 1;
        if !killed {
            break;
        }
        step += stride;
    }
    // The steps right around the commit point, one by one.
    let staged = changes()
        .iter()
        .filter(|c| matches!(c, Abs::Write(..) | Abs::Link(..)))
        .count() as u64;
    for s in staged..staged + 6 {
        h.trial(
            format!("kill at step {s} (commit point)"),
            Kill::AtStep(s),
            None,
        );
        det += 1;
    }

    // Random timing over the length of a full run (child start-up included).
    let n_random: usize = std::env::var("SHADE_CRASH_RANDOM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let span = (full_run.as_micros() as u64 * 8 / 10).max(1);
    for _ in 0..n_random {
        let after = Duration::from_micros(rng.next() % span);
        h.trial(
            format!("kill after {after:?} (seed {seed})"),
            Kill::After(after),
            None,
        );
    }

    println!(
        "accept crash harness: trials: {}, failures: {} ({det} deterministic with stride {stride}, {n_random} random, seed {seed}; \
         {} kills after the commit point, {} runs completed; full run {:?}, total {:?})",
        h.trials,
        h.failures.len(),
        h.committed_kills,
        h.completed_runs,
        full_run,
        started.elapsed()
    );
    for f in h.failures.iter().take(10) {
        println!("  FAIL {f}");
    }
    assert!(h.trials >= 100, "only {} trials", h.trials);
    assert!(
        h.failures.is_empty(),
        "{} of {} crash trials failed",
        h.failures.len(),
        h.trials
    );
}

/// Run the fault child on `dir` with `var=value`; returns its outcome line.
fn run_fault_child(dir: &Path, var: &str, value: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_MODE_ENV, "fault")
        .env_remove(KILL_AT_STEP_ENV)
        .env_remove(FAIL_AT_STEP_ENV)
        .env_remove(RUN_AT_STEP_ENV)
        .env(var, value)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fault child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(dir.join("outcome")).unwrap()
}

/// Every step of accept made to fail (ENOSPC, EDQUOT, EMFILE, EIO in turn), and a concurrent
/// rename of a file the accept replaces placed at steps along the way. After each, checked
/// before any recovery: a failure that says "unchanged" left exactly the old tree and
/// nothing of accept's own; one that says "not finished" left every path old or new and its
/// journal, and recovery completes it to exactly the new tree; the rename's file survives
/// with its content, and whatever was not applied because of it is reported.
#[test]
fn fault_harness() {
    let old = old_tree();
    let new = model(&old, &changes());
    let h = Harness {
        old: old.clone(),
        new: new.clone(),
        trials: 0,
        failures: Vec::new(),
        completed_runs: 0,
        committed_kills: 0,
    };
    let mut failures = Vec::new();
    let mut trials = 0;
    let (mut unchanged, mut unfinished) = (0, 0);
    let errnos = ["ENOSPC", "EDQUOT", "EMFILE", "EIO"];
    // Every step up to the commit point is alike (staging); after it each op differs.
    let staged = changes().len() as u64;
    let mut step = 1;
    loop {
        let errno = errnos[(step % 4) as usize];
        trials += 1;
        let env = h.fresh();
        let outcome = run_fault_child(&env.dir, FAIL_AT_STEP_ENV, &format!("{step}:{errno}"));
        let label = format!("{errno} at step {step}: {outcome}");
        let now = snapshot(&env.root);
        let check = || -> Result<(), String> {
            if outcome.starts_with("unchanged") {
                if now != old {
                    return Err(format!("said unchanged, but: {}", first_diff(&now, &old)));
                }
                std::panic::catch_unwind(|| env.assert_clean())
                    .map_err(|_| "said unchanged, but left scratch or a journal".to_string())?;
            } else if outcome.starts_with("unfinished") {
                check_not_torn(&now, &old, &new)?;
                if journal_phase(&env).is_none() {
                    return Err("said not finished, but no journal is left".into());
                }
                let r = recover(&env.state).map_err(|e| format!("recover: {e}"))?;
                if !r.not_applied.is_empty() {
                    return Err(format!("recover left out {:?}", r.not_applied));
                }
                let after = snapshot(&env.root);
                if after != new {
                    return Err(format!("after recover: {}", first_diff(&after, &new)));
                }
                std::panic::catch_unwind(|| env.assert_clean())
                    .map_err(|_| "recover left scratch or a journal".to_string())?;
            } else if outcome == "ok" {
                if now != new {
                    return Err(format!("said ok, but: {}", first_diff(&now, &new)));
                }
            } else {
                return Err("unexpected outcome".into());
            }
            Ok(())
        };
        match outcome.split(' ').next() {
            Some("unchanged") => unchanged += 1,
            Some("unfinished") => unfinished += 1,
            _ => {}
        }
        if let Err(e) = check() {
            failures.push(format!("{label}: {e}"));
        }
        // Past the last step nothing fails: the accept ran to its end (checked above).
        if !(outcome.starts_with("unchanged") || outcome.starts_with("unfinished")) || step > 5000 {
            break;
        }
        step += if step + 8 < staged { 7 } else { 1 };
    }

    // A concurrent rename of a file the accept replaces (d05/f00), at steps along the way.
    let victim = p("d05/f00");
    let moved = p("d05/f00.user");
    let old_bytes = old.get(&victim).cloned();
    let new_bytes = new.get(&victim).cloned();
    let mut renames = 0;
    for step in (1..).step_by(41) {
        trials += 1;
        renames += 1;
        let env = h.fresh();
        let cmd = format!(
            "mv {} {}",
            env.root.join(&victim).display(),
            env.root.join(&moved).display()
        );
        let outcome = run_fault_child(&env.dir, RUN_AT_STEP_ENV, &format!("{step}:{cmd}"));
        let label = format!("rename at step {step}: {outcome}");
        let now = snapshot(&env.root);
        if (outcome == "ok" && !now.contains_key(&moved) && now == new) || step > 5000 {
            // Past the accept's last step: the rename never ran.
            renames -= 1;
            break;
        }
        let check = || -> Result<(), String> {
            let user = now.get(&moved).cloned();
            if user.is_none() {
                return Err("the user's renamed file is gone".into());
            }
            if user != old_bytes && user != new_bytes {
                return Err("the user's renamed file is torn".into());
            }
            let mut rest = now.clone();
            rest.remove(&moved);
            check_not_torn(&rest, &old, &new)?;
            if outcome.starts_with("partial") && !outcome.contains("d05/f00") {
                return Err("left out something else".into());
            }
            if !(outcome == "ok" || outcome.starts_with("partial")) {
                return Err("unexpected outcome".into());
            }
            if journal_phase(&env).is_some() {
                return Err("a journal was left".into());
            }
            Ok(())
        };
        if let Err(e) = check() {
            failures.push(format!("{label}: {e}"));
        }
    }
    println!(
        "accept fault harness: {trials} trials ({unchanged} unchanged, {unfinished} not finished, \
         {renames} concurrent renames), {} failures",
        failures.len()
    );
    for f in failures.iter().take(10) {
        println!("  FAIL {f}");
    }
    assert!(
        failures.is_empty(),
        "{} fault trials failed",
        failures.len()
    );
}

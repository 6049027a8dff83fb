//! Ctrl-C, SIGTERM and SIGHUP sent to `shade run --accept` (and `shade exec --shadow
//! --accept`) while its accept of 2,000 files
//! runs (issue 19): the accept is finished first, so the tree is fully old or fully new with
//! nothing of accept's own left — checked without running `shade recover` — and what shade
//! said is true of it. The real binary; the signal goes at a random point after the journal
//! appears (`SHADE_SIGNAL_SEED` repeats a run).
#![allow(clippy::unwrap_used)]

mod common;

use common::Fixture;
use serde_json::{json, Value};
use shade_testkit::{tool_results_since_user, FakeLlm, Reply};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

const FILES: usize = 2000;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// The random points of a run: from `SHADE_SIGNAL_SEED` (to repeat one), else the clock;
/// said on stderr either way.
fn seeded() -> Lcg {
    let seed = std::env::var("SHADE_SIGNAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("SHADE_SIGNAL_SEED={seed}");
    Lcg(seed)
}

const SCRIPT: &str = "for f in f*; do echo new > $f; done";

/// `shade run --accept`, or the agent (`exec --shadow --accept`) running the same script.
enum Via<'a> {
    Run,
    Exec(&'a FakeLlm),
}

fn trial(sig: i32, rng: &mut Lcg, via: Via) {
    let fx = Fixture::new();
    for i in 0..FILES {
        std::fs::write(fx.project.join(format!("f{i:04}")), "old\n").unwrap();
    }
    let mut cmd = fx.shade();
    match via {
        Via::Run => {
            cmd.args(["run", "--accept", "--", "sh", "-c", SCRIPT]);
        }
        Via::Exec(llm) => {
            let config = fx.tmp.path().join("config.toml");
            std::fs::write(&config, "").unwrap();
            cmd.args(["exec", "--shadow", "--accept", "--approval", "yolo"])
                .arg("--config")
                .arg(&config)
                .arg("rewrite every file")
                .env("OPENAI_BASE_URL", &llm.base_url)
                .env("OPENAI_API_KEY", "test-key")
                .env("SHADE_MODEL", "main-model")
                .env("XDG_CONFIG_HOME", fx.tmp.path());
        }
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let journals = fx.state.journals();
    let started = Instant::now();
    // The accept has begun when its journal exists.
    let mut seen = false;
    while started.elapsed() < Duration::from_secs(120) {
        if std::fs::read_dir(&journals).is_ok_and(|mut d| d.next().is_some()) {
            seen = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let delay = rng.next(40);
    std::thread::sleep(Duration::from_millis(delay));
    // SAFETY: signalling the child we started.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let (mut old, mut new) = (0, 0);
    let mut other = Vec::new();
    for e in std::fs::read_dir(&fx.project).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        match std::fs::read_to_string(e.path()).as_deref() {
            Ok("old\n") => old += 1,
            Ok("new\n") => new += 1,
            _ => other.push(name),
        }
    }
    let what = format!(
        "signal {sig} {delay} ms after the journal (seen: {seen}): status {:?}, {old} old, \
         {new} new, others {other:?}\nstderr:\n{err}",
        o.status
    );
    assert!(other.is_empty(), "accept left its own files: {what}");
    assert!(
        (old == FILES && new == 0) || (new == FILES && old == 0),
        "the tree is mixed: {what}"
    );
    let left: Vec<_> = std::fs::read_dir(&journals)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a journal was left: {left:?}: {what}");
    if err.contains("accepted") {
        assert_eq!(new, FILES, "{what}");
    }
    if new == FILES {
        assert!(err.contains(&format!("accepted {FILES} changes")), "{what}");
        assert!(
            o.status.code() == Some(0) || o.status.code() == Some(128 + sig),
            "{what}"
        );
    }
}

#[test]
fn termination_signals_during_accept_wait_for_it() {
    let mut rng = seeded();
    for _ in 0..2 {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            trial(sig, &mut rng, Via::Run);
        }
    }
}

#[test]
fn termination_signals_during_the_agents_accept_wait_for_it() {
    let mut rng = seeded();
    let llm = FakeLlm::start(Arc::new(|body: &Value| {
        match tool_results_since_user(body) {
            0 => Reply::tool("shell", json!({ "command": SCRIPT })),
            _ => Reply::text("Done."),
        }
    }))
    .unwrap();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        trial(sig, &mut rng, Via::Exec(&llm));
    }
}

/// A signal at any moment of a plain `shade run` — while the branch mounts, while the
/// command runs, while the changes are listed or the branch unmounts — never leaves the
/// branch mounted, and shade's exit says what happened: the command's status, or 128+N
/// with a line saying it stopped for signal N.
#[test]
fn a_signal_at_any_moment_of_a_run_leaves_no_branch_mounted() {
    let mut rng = seeded();
    let fx = Fixture::new();
    std::fs::write(fx.project.join("a"), "a\n").unwrap();
    // How long a whole run takes here, so the signals spread over all of it.
    let t = Instant::now();
    let o = fx.shade().args(["run", "--", "true"]).output().unwrap();
    assert!(o.status.success(), "{}", common::describe(&o));
    let span = (t.elapsed().as_micros() as u64).max(1000);
    let mut by_signal = 0;
    for i in 0..40 {
        let sig = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP][i % 3];
        let child = fx
            .shade()
            .args(["run", "--", "sh", "-c", "echo x > b"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let delay = rng.next(span);
        std::thread::sleep(Duration::from_micros(delay));
        // SAFETY: signalling the child we started.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        let o = child.wait_with_output().unwrap();
        let what = format!(
            "signal {sig} {delay} µs after the start: {}",
            common::describe(&o)
        );
        common::assert_no_shade_mounts(&fx.state);
        let left: Vec<_> = std::fs::read_dir(fx.state.branches())
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        use std::os::unix::process::ExitStatusExt;
        match (o.status.code(), o.status.signal()) {
            (Some(0), _) => {}
            (Some(c), _) if c == 128 + sig => {
                by_signal += 1;
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(
                    err.contains(&format!("signal {sig}")) || err.contains("interrupted"),
                    "exit {c} without saying why: {what}"
                );
            }
            // Before shade set up anything (the process was just starting).
            (None, Some(s)) => {
                assert_eq!(s, sig, "{what}");
                assert!(
                    left.is_empty(),
                    "killed by signal {s} with a branch left: {left:?}: {what}"
                );
            }
            _ => panic!("unexpected exit: {what}"),
        }
        assert_eq!(
            std::fs::read_to_string(fx.project.join("a")).unwrap(),
            "a\n",
            "{what}"
        );
        assert!(!fx.project.join("b").exists(), "{what}");
    }
    eprintln!("{by_signal} of 40 runs stopped by their signal");
}

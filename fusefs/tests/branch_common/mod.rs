//! Helpers of the tests that mount branches and watch the pool (`pool.rs`, `detach.rs`).
#![allow(dead_code, clippy::unwrap_used)]

use shade_fusefs::{BranchOptions, StateDir};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The pool is the process's: tests that drain it take turns.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests mount FUSE branches and must run as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests need /dev/fuse"
    );
}

pub fn opts(state: &Path) -> BranchOptions {
    BranchOptions {
        state: StateDir::at(state.to_path_buf()),
        memory_budget: 1 << 20,
        threads: 2,
        ..BranchOptions::default()
    }
}

/// Run `sh -c script` in `dir` (bounded), its stdout.
pub fn sh(dir: &Path, script: &str) -> String {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`{script}` in {} did not end in 120 s", dir.display());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn git(dir: &Path, args: &str) -> String {
    sh(
        dir,
        &format!("git -c user.name=t -c user.email=t@t -c core.fsmonitor=false {args}"),
    )
}

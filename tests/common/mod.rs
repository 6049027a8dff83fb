//! Shared set-up for tests that mount for real. They need root and /dev/fuse and fail
//! loudly (never skip) where those are missing.
#![allow(dead_code, clippy::unwrap_used)]

use shade_fusefs::{Branch, BranchOptions, StateDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Panic with a clear message unless this test can mount FUSE file systems.
pub fn require_fuse_root() {
    let uid = nix::unistd::geteuid();
    assert!(
        uid.is_root(),
        "this test mounts FUSE branches and must run as root (euid is {uid})"
    );
    assert!(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_ok(),
        "this test needs /dev/fuse (modprobe fuse, or give the container --device /dev/fuse)"
    );
}

/// A project directory plus a private shade state dir, both removed on drop.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub project: PathBuf,
    pub state: StateDir,
}

impl Fixture {
    pub fn new() -> Fixture {
        require_fuse_root();
        let tmp = tempfile::Builder::new()
            .prefix("shade-test-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let project = tmp.path().join("project");
        std::fs::create_dir(&project).unwrap();
        let project = std::fs::canonicalize(project).unwrap();
        let state = StateDir::at(tmp.path().join("state"));
        Fixture {
            tmp,
            project,
            state,
        }
    }

    pub fn write(&self, rel: &str, content: &str) {
        let p = self.project.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.project.join(rel)).unwrap()
    }

    pub fn options(&self) -> BranchOptions {
        BranchOptions {
            state: self.state.clone(),
            ..BranchOptions::default()
        }
    }

    pub fn branch(&self) -> Branch {
        Branch::create(&self.project, &self.options()).unwrap()
    }

    /// The `shade` binary with this fixture's state dir.
    pub fn shade(&self) -> Command {
        // The test's temporary directory is where it meets the commands it starts (flags,
        // outputs): shared with them for real (not layered), and open to the sandbox's
        // root, which is an unprivileged host id when the tests run as root.
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(self.tmp.path(), std::fs::Permissions::from_mode(0o777));
        let mut c = Command::new(env!("CARGO_BIN_EXE_shade"));
        // Branches in-process, as these tests inspect them (mounts and branch directories
        // gone when shade exits); tests/branch_server.rs and isolation.rs use the server.
        c.env("SHADE_STATE_DIR", self.state.root())
            .env("SHADE_BRANCH_SERVER", "0")
            .env("SHADE_SHARE", self.tmp.path())
            .current_dir(&self.project)
            .stdin(std::process::Stdio::null());
        c
    }
}

/// Every file below `dir` with its content (symlinks as "-> target"), for tree equality.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        let rel = p.strip_prefix(root).unwrap().to_path_buf();
        let ft = e.file_type().unwrap();
        if ft.is_symlink() {
            out.push((
                rel,
                format!("-> {}", std::fs::read_link(&p).unwrap().display()),
            ));
        } else if ft.is_dir() {
            out.push((rel.clone(), "<dir>".into()));
            walk(root, &p, out);
        } else {
            use std::os::unix::fs::PermissionsExt;
            let mode = e.metadata().unwrap().permissions().mode() & 0o7777;
            out.push((
                rel,
                format!(
                    "{:o} {}",
                    mode,
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap())
                ),
            ));
        }
    }
}

/// No FUSE mount of shade is left in the mount table.
/// A branch server's pooled connections are its own, by design: it is ended first; so are
/// the warm connections this test process's own dropped branches left in its pool.
pub fn assert_no_shade_mounts(state: &StateDir) {
    // This process's own pooled connections first: they are mounted below the state
    // directory too, and `stop_branch_servers` would wait its whole bound for them.
    shade_fusefs::drain_branch_pool();
    stop_branch_servers(state.root());
    shade_fusefs::drain_branch_pool();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = state.root().to_string_lossy().to_string();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&root)).collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
}
/// End the branch servers of the state directory `state` (`shade run` starts them): their
/// sockets are removed, so each unmounts its pooled connections and exits; waits (bounded)
/// until no mount below `state` is left.
pub fn stop_branch_servers(state: &Path) {
    if let Ok(entries) = std::fs::read_dir(state.join("servers")) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "sock") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    // Mounts below it (the state directory may itself be one).
    let root = format!("{}/", state.to_string_lossy());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if !mounts.lines().any(|l| l.contains(&root)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Poll `cond` every 50 ms until it holds; panic naming `what` after `secs` seconds.
pub fn wait_until(what: &str, secs: u64, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub mod chat;
pub mod cmd;
pub mod plain;
pub mod tty;

/// A finished command's status and output, for a failed assertion's message.
pub fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

//! Warm language servers shared by several branches: one `ruff server` per linter, running
//! in a branch of the linter's own, into which each caller's state is replayed in turn
//! (on disk there, and as document text); idle servers are stopped. Real FUSE branches,
//! real `ruff server`.
#![allow(clippy::unwrap_used)]

use shade_fusefs::{Branch, BranchOptions, StateDir};
use shade_lint::{BranchView, LintConfig, Linter};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn require_fuse_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test mounts FUSE branches and must run as root"
    );
    assert!(Path::new("/dev/fuse").exists(), "this test needs /dev/fuse");
}

const PY: &str = "import os\n\n\ndef add(a, b):\n    return a + b\n";

struct Fixture {
    _tmp: tempfile::TempDir,
    project: PathBuf,
    state: StateDir,
}

fn fixture() -> Fixture {
    require_fuse_root();
    let tmp = tempfile::Builder::new()
        .prefix("shade-lint-share-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let project = tmp.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("calc.py"), PY).unwrap();
    let state = StateDir::at(tmp.path().join("state"));
    Fixture {
        _tmp: tmp,
        project,
        state,
    }
}

impl Fixture {
    fn branch(&self) -> Branch {
        Branch::create(
            &self.project,
            &BranchOptions {
                state: self.state.clone(),
                id_shift: shade_fusefs::sandbox::branch_id_shift(&Default::default()),
                ..BranchOptions::default()
            },
        )
        .unwrap()
    }

    fn linter(&self, server_idle_secs: u64) -> Linter {
        let cfg = LintConfig {
            server_idle_secs: Some(server_idle_secs),
            ..Default::default()
        };
        Linter::new(&self.project, self.state.clone(), &cfg, Some("ruff-server")).unwrap()
    }

    /// Pids of the language servers this process started for this project (their working
    /// directory is the project path, inside their own mount namespace).
    /// The language servers this test process started: descendants (the server runs in a
    /// sandbox, under bubblewrap's processes) at the project path, other than bubblewrap.
    fn servers(&self) -> Vec<u32> {
        let me = std::process::id();
        let mut procs = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let comm = stat
                .split_once('(')
                .and_then(|(_, r)| r.rsplit_once(')'))
                .map(|(c, _)| c.to_string())
                .unwrap_or_default();
            let ppid: u32 = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            procs.push((pid, ppid, comm));
        }
        let parent: std::collections::HashMap<u32, u32> =
            procs.iter().map(|(pid, ppid, _)| (*pid, *ppid)).collect();
        let descends = |mut pid: u32| {
            for _ in 0..16 {
                match parent.get(&pid) {
                    Some(&p) if p == me => return true,
                    Some(&p) if p > 1 => pid = p,
                    _ => return false,
                }
            }
            false
        };
        procs
            .iter()
            .filter(|(pid, _, comm)| comm != "bwrap" && descends(*pid))
            .filter(|(pid, _, _)| {
                std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default() == self.project
            })
            .map(|(pid, _, _)| *pid)
            .collect()
    }

    /// `calc.py` as the server `pid` reads it from the disk (through its own mount
    /// namespace, where its branch is bound over the project path).
    fn seen_by(&self, pid: u32) -> String {
        let p = format!("/proc/{pid}/root{}/calc.py", self.project.display());
        std::fs::read_to_string(p).unwrap()
    }

    /// Mounts of this fixture's branches.
    /// Mounts of the state dir left (the warm connections this process's dropped branches
    /// left in its pool, by design, let go first).
    fn mounts(&self) -> usize {
        shade_fusefs::drain_branch_pool();
        let root = self.state.root().to_string_lossy().to_string();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&root))
            .count()
    }
}

/// Write `text` as calc.py in `branch`, and ask the linter for its new diagnostics.
fn edit(linter: &Linter, branch: &Branch, text: &str) -> Vec<String> {
    std::fs::write(branch.mountpoint().join("calc.py"), text).unwrap();
    linter
        .new_diagnostics(
            &BranchView::of(branch),
            &["calc.py".into()],
            Duration::from_secs(60),
        )
        .unwrap()
        .iter()
        .map(|d| d.to_string())
        .collect()
}

fn undefined(name: &str) -> Vec<String> {
    vec![format!(
        "calc.py:5:16: error: Undefined name `{name}` [F821] (ruff-server)"
    )]
}

#[test]
fn branches_take_turns_on_one_server() {
    let fx = fixture();
    let linter = fx.linter(600);
    let (a, b) = (fx.branch(), fx.branch());
    let a_text = PY.replace("a + b", "a + x");
    let b_text = PY.replace("a + b", "a + y");

    assert_eq!(edit(&linter, &a, &a_text), undefined("x"));
    let server = fx.servers();
    assert_eq!(server.len(), 1, "one server");
    assert_eq!(
        fx.seen_by(server[0]),
        a_text,
        "A's state on the server's disk"
    );

    assert_eq!(edit(&linter, &b, &b_text), undefined("y"));
    assert_eq!(fx.seen_by(server[0]), b_text, "then B's");
    // A again: its own state comes back, not B's.
    assert_eq!(edit(&linter, &a, &a_text), undefined("x"));
    assert_eq!(fx.seen_by(server[0]), a_text);

    // A third branch asking about another file: calc.py goes back to that branch's
    // (unedited) state, on disk and in the server's open document.
    let c = fx.branch();
    std::fs::write(c.mountpoint().join("util.py"), "def f():\n    return z\n").unwrap();
    let found: Vec<String> = linter
        .new_diagnostics(
            &BranchView::of(&c),
            &["util.py".into()],
            Duration::from_secs(60),
        )
        .unwrap()
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert_eq!(
        found,
        ["util.py:2:12: error: Undefined name `z` [F821] (ruff-server)"]
    );
    assert_eq!(fx.seen_by(server[0]), PY);
    assert_eq!(fx.servers(), server, "the same server served every branch");

    // None of it reached the project.
    assert_eq!(
        std::fs::read_to_string(fx.project.join("calc.py")).unwrap(),
        PY
    );
    assert!(!fx.project.join("util.py").exists());
    drop(linter);
    assert!(
        fx.servers().is_empty(),
        "dropping the linter stops its server"
    );
}

#[test]
fn an_idle_server_is_stopped_and_its_branch_unmounted() {
    let fx = fixture();
    let linter = fx.linter(1);
    let a = fx.branch();
    let before = fx.mounts();
    assert_eq!(
        edit(&linter, &a, &PY.replace("a + b", "a + x")),
        undefined("x")
    );
    let first = fx.servers();
    assert_eq!(first.len(), 1);
    assert_eq!(fx.mounts(), before + 1, "the servers' own branch");
    // Nobody asks for a second: the server is stopped, its branch unmounted.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fx.servers().is_empty() || fx.mounts() > before {
        assert!(
            Instant::now() < deadline,
            "the idle server is still running"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The next request starts a fresh one.
    assert_eq!(
        edit(&linter, &a, &PY.replace("a + b", "a + w")),
        undefined("w")
    );
    let second = fx.servers();
    assert_eq!(second.len(), 1);
    assert_ne!(second, first);
}

/// An agent session's linter ([`Linter::confine_servers`]) starts its language servers in
/// the speculation sandbox (issue 28, item 4): the server (here `ruff server` behind a
/// probe that tries the ways out first) reaches no network, no unix socket outside, writes
/// nothing outside its branch and has a /tmp of its own — and still answers.
#[test]
fn confined_servers_get_the_speculation_sandbox() {
    let fx = fixture();
    let out = fx._tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    let sock = fx._tmp.path().join("listen.sock");
    let unix = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    unix.set_nonblocking(true).unwrap();
    let tmp_mark = format!("/tmp/shade-lsp-probe-{}", std::process::id());
    let probe = format!(
        "touch {o}/rest-writable; touch {tmp_mark}; \
         /usr/bin/python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 5)'; \
         /usr/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{s}\")'; \
         exec ruff server",
        o = out.display(),
        s = sock.display(),
    );
    let cfg = LintConfig {
        lsp: Some(shade_lint::checker::LspConfig {
            name: "probed-ruff".into(),
            command: vec!["sh".into(), "-c".into(), probe],
            extensions: vec!["py".into()],
        }),
        ..Default::default()
    };
    let linter = Linter::new(&fx.project, fx.state.clone(), &cfg, Some("probed-ruff"))
        .unwrap()
        .confine_servers();
    let a = fx.branch();
    let found = edit(&linter, &a, &PY.replace("a + b", "a + x"));
    assert_eq!(
        found,
        ["calc.py:5:16: error: Undefined name `x` [F821] (probed-ruff)"],
        "the confined server did not answer"
    );
    assert!(
        matches!(tcp.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the language server reached the host's network"
    );
    assert!(
        matches!(unix.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the language server connected to a unix socket outside"
    );
    let left: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "the language server wrote outside: {left:?}"
    );
    let shared_tmp = Path::new(&tmp_mark).exists();
    let _ = std::fs::remove_file(&tmp_mark);
    assert!(!shared_tmp, "the language server wrote to the shared /tmp");
    drop(linter);
    drop(a);
    assert_eq!(
        fx.mounts(),
        0,
        "the servers' branch and cache branches are unmounted"
    );
}

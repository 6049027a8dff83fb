//! `shade exec --shadow` with its branch from the per-project branch server (issue 31), end
//! to end through the real binary and a replayed cassette: the shadow is served (on a warm,
//! reused connection from the second run on), shows and accepts the same changes as an
//! in-process one, keeps accept's conflict base (a concurrent edit of a file the branch read
//! refuses the accept), and `SHADE_BRANCH_SERVER=0` falls back to an in-process branch.
//! Reuse is refused while another session's sandbox holds copies of our mounts: run the
//! binary in a private mount namespace (`unshare -m --propagation private`), as the bench
//! and CI do for `tests/branch_server.rs`. Needs root and /dev/fuse (fails loudly without).
#![allow(clippy::unwrap_used)]

mod common;

use common::{assert_no_shade_mounts, snapshot, stop_branch_servers, Fixture};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const PROMPT: &str = "add.sh should print the sum of its two arguments, but test.sh fails. Fix it.";

/// One test at a time: a command running in another test's sandbox holds copies of our
/// mounts, and the server then rightly does not reuse a connection.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("agent/tests/fixtures")
}

struct Shadowed {
    fx: Fixture,
    config: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn project() -> Shadowed {
    let serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fx = Fixture::new();
    for f in ["add.sh", "test.sh"] {
        std::fs::copy(fixtures().join("add_project").join(f), fx.project.join(f)).unwrap();
    }
    Shadowed {
        fx,
        config: tempfile::tempdir().unwrap(),
        _serial: serial,
    }
}

impl Shadowed {
    /// `shade exec --shadow ARGS` of the cassette, the branch server on (the common
    /// fixture turns it off), its client's debug lines on stderr.
    fn exec(&self, args: &[&str]) -> Command {
        let mut c = self.fx.shade();
        c.env_remove("SHADE_BRANCH_SERVER")
            .env(
                "SHADE_LOG",
                "shade_fusefs::served=debug,shade_fusefs::pool=debug",
            )
            .env("NO_COLOR", "1")
            .arg("exec")
            .args(["--approval", "yolo", "--llm"])
            .arg(format!(
                "replay:{}",
                fixtures().join("shadow_fix.jsonl").display()
            ))
            .arg("--shadow")
            .args(args)
            .arg(PROMPT)
            .env("XDG_CONFIG_HOME", self.config.path())
            .env_remove("SHADE_MODEL")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> (Output, Option<bool>) {
        let o = self.exec(args).output().unwrap();
        let v = served(&o);
        (o, v)
    }

    /// Runs until one's branch is served on a reused connection (at most 8): an instant
    /// after a command ends, its stage's mount namespace may still hold the connection.
    fn run_reused(&self, args: &[&str]) -> Output {
        let mut seen = Vec::new();
        for _ in 0..8 {
            let (o, v) = self.run(args);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
            if v == Some(true) {
                return o;
            }
            let why: Vec<String> = text(&o.stderr)
                .lines()
                .filter(|l| l.contains("not pooling") || l.contains("not to be reused"))
                .map(str::to_string)
                .collect();
            seen.push(format!("{v:?} {why:?}"));
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("no exec --shadow reused a connection: {seen:#?}");
    }

    /// Stop the fixture's servers (their pooled connections unmount), then check nothing
    /// of any branch is left.
    fn assert_clean(&self) {
        stop_branch_servers(self.fx.state.root());
        assert_no_shade_mounts(&self.fx.state);
        common::wait_until("the branch stores to go", 20, || {
            std::fs::read_dir(self.fx.state.branches())
                .map(|d| d.count())
                .unwrap_or(0)
                == 0
        });
    }
}

/// `c` run as the plain test user instead (same arguments, environment and directory).
fn as_plain(c: &Command) -> Command {
    let argv = common::plain::argv(&c.get_program().to_string_lossy());
    let mut out = Command::new(&argv[0]);
    out.args(&argv[1..]).args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    if let Some(d) = c.get_current_dir() {
        out.current_dir(d);
    }
    out.stdin(Stdio::null());
    out
}

impl Drop for Shadowed {
    fn drop(&mut self) {
        stop_branch_servers(self.fx.state.root());
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `Some(reused)` when the client's debug log says the branch was served, else `None`.
fn served(o: &Output) -> Option<bool> {
    let err = text(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("branch served by the branch server"))?;
    Some(line.contains("reused_connection=true"))
}

#[test]
fn exec_shadow_branches_are_served_warm_and_show_the_same_changes() {
    let p = project();
    let before = snapshot(&p.fx.project);
    let (o, v) = p.run(&[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert_eq!(v, Some(false), "the first branch is a new server's: {err}");
    assert!(
        out.ends_with("The test passes; its output is in result.txt.\nM add.sh\nA result.txt\n"),
        "the transcript does not end with the changeset: {out:?}"
    );
    assert!(err.contains("the shadow branch was dropped"), "{err}");
    assert_eq!(snapshot(&p.fx.project), before);
    // The next run's branch comes on the first one's connection, reset: it sees the
    // pristine project (add.sh unfixed: the cassette's edit applies again) and makes the
    // same changes.
    let o = p.run_reused(&[]);
    let out = text(&o.stdout);
    assert!(
        out.contains("  ✓ Edited add.sh (1 replacement, -1 +1 lines)"),
        "{out}"
    );
    assert!(
        out.ends_with("The test passes; its output is in result.txt.\nM add.sh\nA result.txt\n"),
        "{out:?}"
    );
    assert_eq!(snapshot(&p.fx.project), before);
    // And a served, warm branch accepts into the project.
    let o = p.run_reused(&["--accept"]);
    let err = text(&o.stderr);
    assert!(err.contains("shade: accepted 2 changes"), "{err}");
    assert!(p.fx.read("add.sh").contains("echo $(( $1 + $2 ))"));
    assert_eq!(p.fx.read("result.txt"), "PASS\n");
    p.assert_clean();
}

/// The plain user's `exec --shadow` is served too, by a server of that user's.
#[test]
fn a_plain_users_exec_shadow_is_served_and_reused() {
    let p = project();
    common::plain::require_fuse();
    std::fs::create_dir_all(p.fx.state.root()).unwrap();
    common::plain::chown_tree(p.fx.tmp.path());
    common::plain::chown_tree(p.config.path());
    let before = snapshot(&p.fx.project);
    let mut seen = Vec::new();
    for _ in 0..8 {
        let o = as_plain(&p.exec(&[])).output().unwrap();
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        assert!(out.ends_with("M add.sh\nA result.txt\n"), "{out:?}");
        let v = served(&o);
        assert!(v.is_some(), "not served: {err}");
        if v == Some(true) {
            break;
        }
        seen.push(err);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(seen.len() < 8, "never reused: {seen:#?}");
    // The server is the plain user's.
    let (uid, _) = common::plain::ids();
    let servers = p.fx.state.root().join("servers");
    let socks: Vec<_> = std::fs::read_dir(&servers)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sock"))
        .collect();
    assert_eq!(socks.len(), 1);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(socks[0].metadata().unwrap().uid(), uid);
    assert_eq!(snapshot(&p.fx.project), before);
    p.assert_clean();
}

#[test]
fn a_served_branch_keeps_the_conflict_base() {
    let p = project();
    // Warm the server first, so the branch under test is a reused connection's.
    let _ = p.run_reused(&[]);
    // The server resets the warm-up's branch after answering it: until then its mount
    // still shows the warm-up's result.txt, which the wait below would take for this run's
    // (CI16: the user's edit then came before the command read add.sh).
    let branches = p.fx.state.branches();
    let any_result = || {
        std::fs::read_dir(&branches).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path().join("mnt/result.txt"))
                .find(|r| r.exists())
        })
    };
    common::wait_until("the warm-up branch to be reset", 20, || {
        any_result().is_none()
    });
    let gate = p.fx.tmp.path().join("gate");
    std::fs::create_dir_all(p.config.path().join("shade")).unwrap();
    std::fs::write(
        p.config.path().join("shade/config.toml"),
        "[sandbox]\npass_env = [\"SHADE_TEST_GATE\"]\n",
    )
    .unwrap();
    let mut child = p
        .exec(&["--accept"])
        .env("SHADE_TEST_GATE", &gate)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command holds at the gate once it wrote result.txt (after the edit of add.sh):
    // find it in the served mount, then change add.sh in the real tree and open the gate.
    loop {
        if any_result().is_some() {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "shade ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    p.fx.write(
        "add.sh",
        "#!/bin/sh\n# the user's own fix\necho $(( $1 + $2 ))\n",
    );
    let before = snapshot(&p.fx.project);
    std::fs::write(&gate, "").unwrap();
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    // Served; usually on the warmed connection, but reuse is the server's call (a
    // connection something may still hold is not pooled): the conflict base holds either way.
    assert!(served(&o).is_some(), "{err}");
    assert_eq!(o.status.code(), Some(124), "{}\n{err}", text(&o.stdout));
    assert!(err.contains("not accepted: 1 path changed"), "{err}");
    assert!(err.contains("add.sh"), "{err}");
    assert_eq!(snapshot(&p.fx.project), before, "something was written");
    assert!(!p.fx.project.join("result.txt").exists());
    p.assert_clean();
}

#[test]
fn branch_server_off_makes_the_shadow_in_process() {
    let p = project();
    let o = p
        .exec(&[])
        .env("SHADE_BRANCH_SERVER", "0")
        .output()
        .unwrap();
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert_eq!(served(&o), None, "{err}");
    assert!(out.ends_with("M add.sh\nA result.txt\n"), "{out:?}");
    assert!(
        !p.fx.state.root().join("servers").exists() || {
            std::fs::read_dir(p.fx.state.root().join("servers"))
                .unwrap()
                .flatten()
                .all(|e| e.path().extension().is_none_or(|x| x != "sock"))
        }
    );
    p.assert_clean();
}

/// A tracing instance of our own counting the FUSE requests the kernel sends
/// (`fuse:fuse_request_send`), per connection. Needs root and tracefs: fails loudly without.
struct FuseTrace {
    dir: PathBuf,
}

impl FuseTrace {
    fn start() -> FuseTrace {
        let root = Path::new("/sys/kernel/tracing");
        assert!(
            root.join("events/fuse/fuse_request_send").exists(),
            "tracefs with the fuse events is needed at {}",
            root.display()
        );
        let dir = root.join(format!(
            "instances/shade-served-shadow-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("buffer_size_kb"), "32768").unwrap();
        std::fs::write(dir.join("trace"), "").unwrap();
        std::fs::write(dir.join("events/fuse/fuse_request_send/enable"), "1").unwrap();
        FuseTrace { dir }
    }

    /// Stop and return how many requests went to the connection of device `dev` (a
    /// `stat` st_dev), with the connection numbers the kernel prints.
    fn stop(self, dev: u64) -> usize {
        std::fs::write(self.dir.join("events/fuse/fuse_request_send/enable"), "0").unwrap();
        // The kernel's dev_t (major << 20 | minor) of glibc's st_dev encoding.
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        let conn = (major << 20) | minor;
        let trace = std::fs::read_to_string(self.dir.join("trace")).unwrap();
        let lost = trace.lines().any(|l| l.contains("LOST"));
        assert!(!lost, "the trace buffer overflowed");
        let needle = format!("connection {conn} ");
        let mut ops = std::collections::BTreeMap::new();
        for l in trace.lines().filter(|l| l.contains(&needle)) {
            if let Some(op) = l.split(['(', ')']).nth(1) {
                *ops.entry(op.to_string()).or_insert(0usize) += 1;
            }
        }
        eprintln!("requests to connection {conn}: {ops:?}");
        trace
            .lines()
            .filter(|l| l.contains(&needle) && l.contains("FUSE_"))
            .count()
    }
}

impl Drop for FuseTrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("events/fuse/fuse_request_send/enable"), "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The agent's one command: the branch's device, then every file's contents read (the page
/// cache is per connection: a fresh mount reads each file from the daemon, a warm one has
/// them; an in-process shadow's warm-up walk lists, it does not read).
const STATUS: &str = "stat -c %d .; cat d*/* | wc -c";

fn status_router(body: &serde_json::Value) -> shade_testkit::Reply {
    use shade_testkit::{last_tool_result, Reply};
    if last_tool_result(body).is_some() {
        Reply::text("Done.")
    } else {
        Reply::tool("shell", serde_json::json!({ "command": STATUS }))
    }
}

/// `exec --shadow` whose agent runs [`STATUS`]: the FUSE requests its branch's connection
/// got over the whole run (branch creation, the in-process warm-up walk, the command), and
/// whether it was served on a reused connection. `bytes`: what the command must count.
fn status_run(p: &Shadowed, server: bool, bytes: usize) -> (usize, Option<bool>) {
    let llm = shade_testkit::FakeLlm::start(std::sync::Arc::new(status_router)).unwrap();
    let trace = FuseTrace::start();
    let mut c = p.fx.shade();
    c.env_remove("SHADE_BRANCH_SERVER")
        .env("SHADE_LOG", "shade_fusefs::served=debug")
        .env("NO_COLOR", "1")
        .args(["exec", "--shadow", "--approval", "yolo", "status"])
        .env("XDG_CONFIG_HOME", p.config.path())
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("SHADE_MODEL", "main-model")
        .env_remove("SHADE_CONFIG")
        .stdin(Stdio::null());
    if !server {
        c.env("SHADE_BRANCH_SERVER", "0");
    }
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let requests = llm.requests();
    let result = shade_testkit::last_tool_result(requests.last().unwrap()).unwrap();
    // "Exit code: 0\nStdout:\nDEV\nBYTES\n…": the numbers alone on their lines.
    let numbers: Vec<u64> = result
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let [dev, read] = numbers[..] else {
        panic!("no device and byte count in {result}")
    };
    assert_eq!(read, bytes as u64, "{result}");
    (trace.stop(dev), served(&o))
}

#[test]
fn a_served_warm_branchs_first_command_sends_far_fewer_fuse_requests() {
    let p = project();
    // 2,000 files in 40 directories.
    let mut bytes = 0;
    for d in 0..40 {
        let dir = p.fx.project.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            let text = format!("{d} {f}\n");
            bytes += text.len();
            std::fs::write(dir.join(format!("f{f:02}.txt")), text).unwrap();
        }
    }
    let (fresh, via) = status_run(&p, false, bytes);
    assert_eq!(via, None, "SHADE_BRANCH_SERVER=0 makes it in-process");
    assert!(
        fresh > 2_000,
        "a fresh mount sends one request a file read at least: {fresh}"
    );
    // The server's first branch warms its connection; later ones reuse it. The first
    // reuse still revalidates each file's attributes once (the first branch's were handed
    // out before the lower watcher let the overlay cache them: TTL 0); from the second on
    // the connection is warm throughout: measured there.
    let mut reused = Vec::new();
    for _ in 0..10 {
        let (n, via) = status_run(&p, true, bytes);
        assert!(via.is_some(), "the branch was not served");
        if via == Some(true) {
            reused.push(n);
            if reused.len() == 2 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        reused.len(),
        2,
        "exec --shadow did not reuse a connection twice"
    );
    let warm = reused[1];
    assert!(
        warm * 10 < fresh,
        "served warm: {warm} FUSE requests, in-process fresh: {fresh}"
    );
    eprintln!(
        "FUSE requests of exec --shadow reading 2,000 files: in-process {fresh}, served warm {warm}"
    );
    p.assert_clean();
}

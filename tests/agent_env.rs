//! Secrets stay home: commands the agent runs (`shade exec --shadow`'s shell tool, `shade
//! mcp`'s `run_command`, which runs in the speculation sandbox) get shade's environment
//! without anything that looks like a secret or is shade's own, and cannot read the home's
//! credential files; `[sandbox] pass_env` passes a chosen variable. What the user runs with
//! `shade run` keeps both, unless `[sandbox] hide_credentials`. As root and as the plain
//! user. Needs root and /dev/fuse (fails loudly without).
#![allow(clippy::unwrap_used)]

mod common;

use common::plain::{copy_of as plain_copy, ids as plain_ids};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Root,
    Plain,
}

/// Secret variables set for shade, with values that must not show up in a command's output.
const SECRETS: &[(&str, &str)] = &[
    ("GITHUB_TOKEN", "leak-github-7f3a"),
    ("AWS_SECRET_ACCESS_KEY", "leak-aws-9c1d"),
    ("MY_API_KEY", "leak-myapi-2b8e"),
    ("SHADE_MCP_TOKEN", "leak-mcp-5e44"),
    ("DATABASE_PASSWORD", "leak-db-0a6c"),
];

/// Looks secret, but the config's `pass_env` passes it.
const PASSED: (&str, &str) = ("PASSED_TOKEN", "passed-value-31d0");

/// What the fixture's private key and shade's config file hold.
const KEY: &str = "KEYDATA-private-8d2f";
const CONFIG_MARK: &str = "CONFIG-MARK-61e7";

/// What every probe command prints: its environment, then the key, shade's config and
/// the stand-in for an ssh-agent socket in `agent` (this test's own directory in /tmp).
fn probe(agent: &std::path::Path) -> String {
    format!(
        "env; echo ---; cat ~/.ssh/id_x; echo key=$?; \
         cat \"$XDG_CONFIG_HOME/shade/config.toml\"; echo config=$?; \
         cat {}/agent.1; echo agent=$?",
        agent.display()
    )
}

/// What stands in for an ssh-agent's socket in /tmp (a file: its directory is what is hidden).
const AGENT: &str = "AGENT-SOCKET-5a90";

/// A project, a state dir and a home (with `~/.ssh/id_x` and shade's config), owned by the
/// user the test runs as, under /var/tmp.
struct Env {
    who: Who,
    _tmp: tempfile::TempDir,
    /// This test's stand-in for an ssh-agent's directory, in /tmp.
    agent: tempfile::TempDir,
    project: PathBuf,
    state: PathBuf,
    home: PathBuf,
}

fn env(who: Who, config: &str) -> Env {
    common::require_fuse_root();
    let tmp = tempfile::Builder::new()
        .prefix("shade-agentenv-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (project, state, home) = (root.join("project"), root.join("state"), root.join("home"));
    for d in [&project, &state, &home] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(project.join("file"), "orig\n").unwrap();
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_x"), format!("{KEY}\n")).unwrap();
    std::fs::create_dir_all(home.join(".config/shade")).unwrap();
    std::fs::write(
        home.join(".config/shade/config.toml"),
        format!("# {CONFIG_MARK}\n{config}"),
    )
    .unwrap();
    let agent = tempfile::Builder::new()
        .prefix("ssh-shadeagentenv")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(agent.path().join("agent.1"), format!("{AGENT}\n")).unwrap();
    if who == Who::Plain {
        common::plain::require_fuse();
        common::plain::chown_tree(agent.path());
        common::plain::chown_tree(&project);
        common::plain::chown_tree(&state);
        common::plain::chown_tree(&home);
    }
    Env {
        who,
        _tmp: tmp,
        agent,
        project,
        state,
        home,
    }
}

impl Env {
    /// `shade` as this test's user in the project: its own state dir and home, the secrets
    /// set, the caller's model settings gone.
    fn shade(&self) -> Command {
        let bin = env!("CARGO_BIN_EXE_shade");
        let mut c = match self.who {
            Who::Root => Command::new(bin),
            Who::Plain => {
                let (uid, gid) = plain_ids();
                let mut c = Command::new("/usr/bin/setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .args(["--init-groups", "--"])
                    .arg(plain_copy(bin));
                c
            }
        };
        c.current_dir(&self.project)
            .env("SHADE_STATE_DIR", &self.state)
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env_remove("SHADE_CONFIG")
            .env_remove("SHADE_MODEL")
            .env_remove("SHADE_FAST_MODEL")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .env_remove("CARGO_TARGET_DIR")
            .envs(SECRETS.iter().copied())
            .env(PASSED.0, PASSED.1)
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Env {
    /// Whatever a killed or failed shade left mounted under the state dir is unmounted, so
    /// that a failing test leaves no mount behind.
    fn drop(&mut self) {
        let state = self.state.display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut left: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&state))
            .collect();
        left.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in left {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A child killed when dropped, so a failed test leaves nothing.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end within `secs`, or kills it and fails.
fn output_within(cmd: &mut Command, secs: u64, what: &str) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SIGTERM first: shade drops its branches on it. Then SIGKILL; the Env's drop
            // unmounts what is left.
            // SAFETY: kill(2) on a child of ours that has not been reaped yet.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            if rx.recv_timeout(Duration::from_secs(20)).is_err() {
                // SAFETY: as above.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                let _ = rx.recv_timeout(Duration::from_secs(20));
            }
            panic!("{what} did not finish within {secs} s");
        }
    }
}

/// The agent's command saw no secret, no shade variable and no credential file, but PATH,
/// HOME and the passed variable.
fn assert_filtered(seen: &str, who: Who) {
    for (name, value) in SECRETS {
        assert!(
            !seen.contains(value) && !seen.contains(&format!("{name}=")),
            "{name} reached the agent's command ({who:?}):\n{seen}"
        );
    }
    for shades in ["SHADE_STATE_DIR=", "SHADE_MODEL=", "OPENAI_BASE_URL="] {
        assert!(
            !seen.contains(shades),
            "{shades} reached the agent's command ({who:?}):\n{seen}"
        );
    }
    assert!(
        seen.contains("\nPATH=") || seen.starts_with("PATH="),
        "{seen}"
    );
    assert!(seen.contains("HOME="), "{seen}");
    assert!(
        seen.contains(&format!("{}={}", PASSED.0, PASSED.1)),
        "pass_env did not pass {} ({who:?}):\n{seen}",
        PASSED.0
    );
    assert!(
        !seen.contains(KEY) && seen.contains("key=1"),
        "the agent's command read ~/.ssh/id_x ({who:?}):\n{seen}"
    );
    assert!(
        !seen.contains(CONFIG_MARK) && seen.contains("config=1"),
        "the agent's command read shade's config ({who:?}):\n{seen}"
    );
    assert!(
        !seen.contains(AGENT) && seen.contains("agent=1"),
        "the agent's command reached an ssh-agent directory in /tmp ({who:?}):\n{seen}"
    );
}

const PASS_CONFIG: &str = "[sandbox]\npass_env = [\"PASSED_TOKEN\"]\n";

/// `shade exec --shadow`: the model's shell tool runs the probe in the branch.
fn exec_shadow(who: Who) {
    let e = env(who, PASS_CONFIG);
    let command = probe(e.agent.path());
    let router = move |body: &serde_json::Value| {
        use shade_testkit::{last_tool_result, Reply};
        if last_tool_result(body).is_some() {
            Reply::text("Done.")
        } else {
            Reply::tool("shell", serde_json::json!({ "command": command }))
        }
    };
    let llm = shade_testkit::FakeLlm::start(std::sync::Arc::new(router)).unwrap();
    let o = output_within(
        e.shade()
            .args(["exec", "--shadow", "--approval", "yolo"])
            .arg("print the environment")
            .env("OPENAI_BASE_URL", &llm.base_url)
            .env("SHADE_MODEL", "main-model"),
        300,
        "shade exec --shadow",
    );
    assert_eq!(o.status.code(), Some(0), "{}", common::describe(&o));
    let requests = llm.requests();
    let seen = requests
        .iter()
        .find_map(shade_testkit::last_tool_result)
        .unwrap_or_else(|| panic!("no tool result: {}", common::describe(&o)));
    assert_filtered(&seen, who);
    common::assert_no_shade_mounts(&shade_fusefs::StateDir::at(e.state.clone()));
}

#[test]
fn exec_shadow_command_gets_no_secrets_as_root() {
    exec_shadow(Who::Root);
}

#[test]
fn exec_shadow_command_gets_no_secrets_as_plain_user() {
    exec_shadow(Who::Plain);
}

/// `shade mcp` over stdio, spoken to line by line; every read bounded.
struct Mcp {
    child: Reaped,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl Mcp {
    fn start(e: &Env) -> Mcp {
        let mut child = e
            .shade()
            .args(["mcp", "--no-lint"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut mcp = Mcp {
            child: Reaped(child),
            lines,
            next_id: 1,
        };
        mcp.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "agent-env-test", "version": "1"}
            }),
        );
        mcp.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, msg: &serde_json::Value) {
        let stdin = self.child.0.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends a request and waits (bounded) for its answer's `result`.
    fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(300))
                .unwrap_or_else(|e| panic!("no answer to {method} from shade mcp: {e}"));
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if msg["id"] == id && msg.get("method").is_none() {
                assert!(msg.get("error").is_none(), "{method} failed: {msg}");
                return msg["result"].clone();
            }
        }
    }

    /// Calls a tool; returns its text.
    fn call(&mut self, name: &str, args: serde_json::Value) -> String {
        let result = self.request(
            "tools/call",
            serde_json::json!({"name": name, "arguments": args}),
        );
        result["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Closes stdin (as clients do) and waits, bounded, for the server to exit.
    fn finish(mut self) {
        drop(self.child.0.stdin.take());
        for _ in 0..600 {
            if self.child.0.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("shade mcp did not exit within 60 s of its stdin closing");
    }
}

/// `shade mcp`'s `run_command` (the speculation sandbox) runs the probe in a branch.
fn mcp_run_command(who: Who) {
    let e = env(who, PASS_CONFIG);
    let mut mcp = Mcp::start(&e);
    let created = mcp.call("create_branch", serde_json::json!({}));
    let id = created
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_end_matches(|c: char| !c.is_alphanumeric())
        .to_string();
    assert!(id.starts_with('b'), "{created}");
    let seen = mcp.call(
        "run_command",
        serde_json::json!({"branch": id, "command": probe(e.agent.path())}),
    );
    assert!(seen.contains("---"), "the probe did not run: {seen}");
    assert_filtered(&seen, who);
    mcp.finish();
    common::assert_no_shade_mounts(&shade_fusefs::StateDir::at(e.state.clone()));
}

#[test]
fn mcp_run_command_gets_no_secrets_as_root() {
    mcp_run_command(Who::Root);
}

#[test]
fn mcp_run_command_gets_no_secrets_as_plain_user() {
    mcp_run_command(Who::Plain);
}

/// `shade run`: the user's command keeps the environment and the home; with
/// `hide_credentials` the home's credentials are hidden, the environment still kept.
fn user_run(who: Who) {
    let e = env(who, "");
    let o = output_within(
        e.shade()
            .args(["run", "--", "sh", "-c"])
            .arg(probe(e.agent.path())),
        120,
        "shade run",
    );
    assert_eq!(o.status.code(), Some(0), "{}", common::describe(&o));
    let seen = String::from_utf8_lossy(&o.stdout).into_owned();
    for (name, value) in SECRETS.iter().chain([&PASSED]) {
        assert!(
            seen.contains(&format!("{name}={value}")),
            "`shade run` lost {name} ({who:?}):\n{seen}"
        );
    }
    assert!(seen.contains("SHADE_STATE_DIR="), "{seen}");
    assert!(seen.contains(KEY) && seen.contains("key=0"), "{seen}");
    assert!(seen.contains(AGENT) && seen.contains("agent=0"), "{seen}");

    std::fs::write(
        e.home.join(".config/shade/config.toml"),
        "[sandbox]\nhide_credentials = true\n",
    )
    .unwrap();
    let o = output_within(
        e.shade()
            .args(["run", "--", "sh", "-c"])
            .arg(probe(e.agent.path())),
        120,
        "shade run",
    );
    assert_eq!(o.status.code(), Some(0), "{}", common::describe(&o));
    let seen = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(seen.contains("GITHUB_TOKEN=leak-github-7f3a"), "{seen}");
    assert!(
        !seen.contains(KEY) && seen.contains("key=1"),
        "hide_credentials did not hide ~/.ssh ({who:?}):\n{seen}"
    );
    assert!(seen.contains("config=1"), "{seen}");
    common::assert_no_shade_mounts(&shade_fusefs::StateDir::at(e.state.clone()));
}

#[test]
fn shade_run_keeps_the_users_environment_as_root() {
    user_run(Who::Root);
}

#[test]
fn shade_run_keeps_the_users_environment_as_plain_user() {
    user_run(Who::Plain);
}

/// `shade doctor` names what the agent's commands do not get, never the values.
#[test]
fn doctor_names_withheld_variables_and_hidden_files() {
    let e = env(Who::Root, "");
    let o = output_within(e.shade().arg("doctor"), 120, "shade doctor");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    for (name, value) in SECRETS {
        assert!(out.contains(name), "doctor does not name {name}:\n{out}");
        assert!(!out.contains(value), "doctor shows {name}'s value:\n{out}");
    }
    let ssh = e.home.join(".ssh");
    assert!(
        out.contains(&ssh.display().to_string()),
        "doctor does not name {}:\n{out}",
        ssh.display()
    );
}

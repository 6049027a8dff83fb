//! Best of N (`shade exec --attempts N`), end to end: the real binary, real branch mounts,
//! the scripted OpenAI-compatible stand-in answering each attempt by its temperature.
#![allow(clippy::unwrap_used)]

mod common;

use common::tty::Tty;
use common::{assert_no_shade_mounts, Fixture};
use serde_json::{json, Value};
use shade_testkit::{last_tool_result, tool_results_since_user, FakeLlm, Reply};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What each of the 4 attempts (by temperature 0.2, 0.53, 0.87, 1.2) writes to answer.txt:
/// attempts 2 and 3 pass the check (first line 42), 3 with the smaller diff.
const WRITES: [&str; 4] = [
    "forty-one\n",
    "42\nsecond\nattempt\n",
    "42\n",
    "nope\nnope\n",
];
/// A word only that attempt writes (42: attempts 2 and 3).
const MARKS: [&str; 4] = ["forty-one", "second", "42", "nope"];
const CHECK: &str = "test \"$(head -n 1 answer.txt)\" = 42";

/// The attempt (0-based) a request belongs to, from its temperature.
fn attempt_of(body: &Value) -> usize {
    let t = body["temperature"].as_f64().unwrap_or(0.2);
    (((t - 0.2) * 3.0).round() as usize).min(3)
}

/// Each attempt writes its answer.txt, then (once `meet` attempts have written, or after a
/// minute) reads it back with `cat`, then ends.
fn scripted(meet: usize) -> FakeLlm {
    FakeLlm::start(router(meet)).unwrap()
}

/// [`scripted`]'s answers; `cat` waits for `meet` attempts to have written.
fn router(meet: usize) -> shade_testkit::Router {
    let written = Arc::new(AtomicUsize::new(0));
    Arc::new(move |body: &Value| {
        if shade_testkit::last_real_user(body) == "what did you write?" {
            return Reply::text("I wrote 42.");
        }
        let i = attempt_of(body);
        if tool_results_since_user(body) == 0 {
            return Reply::tool(
                "write_file",
                json!({"path": "answer.txt", "content": WRITES[i]}),
            );
        }
        if tool_results_since_user(body) == 1 {
            written.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(60);
            while written.load(Ordering::SeqCst) < meet && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            return Reply::tool("shell", json!({"command": "cat answer.txt"}));
        }
        Reply::text("done")
    })
}

fn exec(fx: &Fixture, llm: &FakeLlm, args: &[&str]) -> Command {
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let mut c = fx.shade();
    c.args(["exec", "--approval", "yolo", "--config"])
        .arg(&config)
        .args(args)
        .arg("write the answer to answer.txt")
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("XDG_CONFIG_HOME", fx.tmp.path())
        .env("HOME", fx.tmp.path());
    c
}

/// Waits for `child` at most `secs`; on expiry stops its process group (SIGTERM, so shade
/// unmounts its branches; SIGKILL after 30 s more) and fails.
fn finish(mut child: Child, secs: u64) -> Output {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            stop(&mut child);
            let o = child.wait_with_output().unwrap();
            panic!("shade did not finish in {secs} s: {}", common::describe(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// SIGTERM to `child`'s process group, then SIGKILL if it is still there after 30 s.
fn stop(child: &mut Child) {
    let group = -(child.id() as i32);
    // SAFETY: signalling the process group of a child we started.
    unsafe { libc::kill(group, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: as above.
    unsafe { libc::kill(group, libc::SIGKILL) };
}

fn run(mut cmd: Command, secs: u64) -> Output {
    let child = cmd
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child, secs)
}

fn assert_clean(fx: &Fixture) {
    assert_no_shade_mounts(&fx.state);
    let left = std::fs::read_dir(fx.state.branches())
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "a branch store was left behind");
}

#[test]
fn four_attempts_two_pass_the_best_is_accepted_and_each_saw_only_its_own_file() {
    let fx = Fixture::new();
    let llm = scripted(1);
    let o = run(
        exec(
            &fx,
            &llm,
            &[
                "--attempts",
                "4",
                "--jobs",
                "4",
                "--check",
                CHECK,
                "--pick",
                "best",
                "--json",
            ],
        ),
        300,
    );
    let what = common::describe(&o);
    assert_eq!(o.status.code(), Some(0), "{what}");
    let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let attempts: Vec<&Value> = lines.iter().filter(|l| l["type"] == "attempt").collect();
    assert_eq!(attempts.len(), 4, "{what}");
    // Ranked: the two that passed first, the smaller diff (attempt 3) ahead; then the failed.
    let order: Vec<u64> = attempts
        .iter()
        .map(|a| a["index"].as_u64().unwrap())
        .collect();
    assert_eq!(order, vec![3, 2, 1, 4], "{what}");
    let passed: Vec<bool> = attempts
        .iter()
        .map(|a| a["check"]["passed"].as_bool().unwrap())
        .collect();
    assert_eq!(passed, vec![true, true, false, false], "{what}");
    assert_eq!(attempts[2]["check"]["exit"], 1, "{what}");
    for a in &attempts {
        assert_eq!(a["stop"], "completed", "{what}");
        assert_eq!(a["changes"].as_array().unwrap().len(), 1, "{what}");
        assert!(a["tokens"].as_u64().unwrap() > 0, "{what}");
    }
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "best_of", "{what}");
    assert_eq!(last["accepted"], 3, "{what}");
    assert_eq!(last["ranking"], json!([3, 2, 1, 4]), "{what}");
    assert_eq!(fx.read("answer.txt"), "42\n");
    // Each attempt's `cat`, run once all four had written, read its own version only.
    let mut seen = 0;
    for body in llm.requests() {
        if tool_results_since_user(&body) == 2 {
            let out = last_tool_result(&body).unwrap();
            let i = attempt_of(&body);
            for (j, mark) in MARKS.iter().enumerate() {
                if !WRITES[i].contains(mark) {
                    assert!(
                        !out.contains(mark),
                        "attempt {} saw attempt {}'s answer: {out}",
                        i + 1,
                        j + 1
                    );
                }
            }
            assert!(out.contains(MARKS[i]), "attempt {}: {out}", i + 1);
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
    assert_clean(&fx);
}

#[test]
fn without_pick_or_a_terminal_every_attempt_is_reported_and_dropped() {
    let fx = Fixture::new();
    let llm = scripted(1);
    let o = run(exec(&fx, &llm, &["--attempts", "4", "--check", CHECK]), 300);
    let what = common::describe(&o);
    assert_eq!(o.status.code(), Some(0), "{what}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("1. attempt 3 "), "{what}");
    assert!(
        out.contains("2. attempt 2 ") && out.contains("check passed"),
        "{what}"
    );
    assert!(out.contains("check failed (exit 1)"), "{what}");
    assert!(!fx.project.join("answer.txt").exists(), "{what}");
    assert_clean(&fx);
}

#[test]
fn none_passing_accepts_nothing() {
    let fx = Fixture::new();
    let llm = scripted(1);
    let o = run(
        exec(
            &fx,
            &llm,
            &["--attempts", "4", "--check", "false", "--pick", "best"],
        ),
        300,
    );
    let what = common::describe(&o);
    assert_eq!(o.status.code(), Some(1), "{what}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no attempt passed"),
        "{what}"
    );
    assert!(!fx.project.join("answer.txt").exists(), "{what}");
    assert_clean(&fx);
}

/// Processes whose command line contains `token`.
fn processes_with(token: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(token) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn ctrl_c_while_attempts_run_leaves_no_mount_and_no_process() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let fx = Fixture::new();
        let share = fx.tmp.path().to_path_buf();
        let token = format!("4242.{}{sig}", std::process::id());
        let started = share.join("started");
        std::fs::create_dir_all(&started).unwrap();
        // Open to the sandbox's root, an unprivileged host id when the tests run as root.
        std::fs::set_permissions(&started, std::fs::Permissions::from_mode(0o777)).unwrap();
        let command = format!(
            "touch {}/$(cat /proc/sys/kernel/random/uuid); sleep {token} & sleep {token}",
            started.display()
        );
        let llm = FakeLlm::start(Arc::new(move |body: &Value| {
            if tool_results_since_user(body) == 0 {
                Reply::tool("shell", json!({"command": command}))
            } else {
                Reply::text("done")
            }
        }))
        .unwrap();
        let child = exec(
            &fx,
            &llm,
            &["--attempts", "4", "--jobs", "2", "--check", "true"],
        )
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let count = || std::fs::read_dir(&started).map(|d| d.count()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(120);
        while count() < 2 {
            if Instant::now() > deadline {
                let mut child = child;
                stop(&mut child);
                let o = finish(child, 60);
                panic!(
                    "the attempts' commands never started: {}",
                    common::describe(&o)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Two at a time: the other two wait for a slot.
        assert_eq!(count(), 2);
        assert!(!processes_with(&token).is_empty());
        // SAFETY: signalling the child we started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let o = finish(child, 120);
        let what = common::describe(&o);
        assert_eq!(o.status.code(), Some(128 + sig), "{what}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("dropped every attempt"),
            "{what}"
        );
        assert_eq!(processes_with(&token), Vec::<String>::new(), "{what}");
        assert_eq!(count(), 2, "an attempt started after the signal: {what}");
        assert_clean(&fx);
    }
}

/// `shade exec --attempts 4` on a terminal: the screen ranks them; the shell says the status.
fn screen(fx: &Fixture, llm: &FakeLlm) -> Tty {
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let shell = format!(
        "{} exec --approval yolo --config {} --attempts 4 --check '{CHECK}' 'write the answer'; echo exit=$?",
        env!("CARGO_BIN_EXE_shade"),
        config.display()
    );
    let env = [
        ("SHADE_STATE_DIR", fx.state.root().display().to_string()),
        ("SHADE_SHARE", fx.tmp.path().display().to_string()),
        ("OPENAI_BASE_URL", llm.base_url.clone()),
        ("OPENAI_API_KEY", "test-key".into()),
        ("SHADE_MODEL", "main-model".into()),
        ("XDG_CONFIG_HOME", fx.tmp.path().display().to_string()),
        ("HOME", fx.tmp.path().display().to_string()),
    ];
    let tty = Tty::start(&["sh", "-c", &shell], &fx.project, &env);
    tty.wait_text("4 attempts, 2 passed", 240);
    tty
}

#[test]
fn the_screen_compares_then_drops_all() {
    let fx = Fixture::new();
    let llm = scripted(1);
    let tty = screen(&fx, &llm);
    let s = tty.screen();
    assert!(
        s.contains("> 1. attempt 3 "),
        "the best first, under the cursor: {s}"
    );
    assert!(s.contains("diff of attempt 3") && s.contains("+42"), "{s}");
    tty.keys(&["Tab"]);
    tty.wait_text("check output of attempt 3", 10);
    tty.keys(&["m", "j"]);
    let s = tty.wait_text("attempt 3 → attempt 2", 10);
    assert!(s.contains("+second") && s.contains("+attempt"), "{s}");
    tty.keys(&["d"]);
    tty.wait_text("drop every attempt?", 10);
    tty.keys(&["y"]);
    let s = tty.wait_text("exit=", 60);
    assert!(s.contains("exit=0"), "{s}");
    assert!(
        tty.history().contains("dropped every attempt"),
        "{}",
        tty.history()
    );
    assert!(!fx.project.join("answer.txt").exists());
    assert_clean(&fx);
}

#[test]
fn the_screen_picks_an_attempt_and_accepts_part_of_it() {
    let fx = Fixture::new();
    fx.write("keep.txt", "old\n");
    // Every attempt also rewrites keep.txt; the person takes only answer.txt.
    let llm = FakeLlm::start(Arc::new(move |body: &Value| {
        if tool_results_since_user(body) == 0 {
            Reply::tool(
                "write_file",
                json!({"path": "answer.txt", "content": WRITES[attempt_of(body)]}),
            )
            .and_tool(
                "write_file",
                json!({"path": "keep.txt", "content": "new\n"}),
            )
        } else {
            Reply::text("done")
        }
    }))
    .unwrap();
    let tty = screen(&fx, &llm);
    // The second-ranked attempt (2) goes to the per-file review.
    tty.keys(&["j", "Enter"]);
    let s = tty.wait_text("[x] M keep.txt", 30);
    assert!(s.contains("attempt 2"), "{s}");
    // answer.txt is first (sorted); keep.txt second: unpick it.
    tty.keys(&["j", "Space"]);
    tty.wait_text("[ ] M keep.txt", 10);
    tty.keys(&["Enter"]);
    let s = tty.wait_text("exit=", 60);
    assert!(s.contains("exit=0"), "{s}");
    assert_eq!(fx.read("answer.txt"), WRITES[1]);
    assert_eq!(fx.read("keep.txt"), "old\n");
    assert_clean(&fx);
}

#[test]
fn try_in_chat_accepts_the_best_into_the_session_and_goes_on_from_it() {
    let fx = Fixture::new();
    let llm = FakeLlm::start(router(1)).unwrap();
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let mut c = fx.shade();
    c.args(["chat", "--shadow", "--approval", "yolo", "--config"])
        .arg(&config)
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("XDG_CONFIG_HOME", fx.tmp.path())
        .env("HOME", fx.tmp.path())
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let input =
        format!("/try 4 --check {CHECK} -- write the answer\nwhat did you write?\n/accept\n");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let o = finish(child, 300);
    let what = common::describe(&o);
    assert_eq!(o.status.code(), Some(0), "{what}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("continuing from attempt 3"), "{what}");
    assert!(out.contains("I wrote 42."), "{what}");
    // The turn after /try went on from attempt 3's conversation: its prompt, its `cat`.
    let after = llm
        .requests()
        .into_iter()
        .find(|b| shade_testkit::last_real_user(b) == "what did you write?")
        .unwrap();
    let msgs = after["messages"].as_array().unwrap();
    let texts: Vec<String> = msgs.iter().map(shade_testkit::content_text).collect();
    assert!(texts.iter().any(|t| t == "write the answer"), "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("42") && !t.contains("second")),
        "{texts:?}"
    );
    assert!(
        after.get("temperature").is_none(),
        "the session's own settings again"
    );
    // Accepted into the session's branch, then /accept wrote it into the project.
    assert_eq!(fx.read("answer.txt"), "42\n");
    assert_clean(&fx);
}

#[test]
fn models_go_round_the_attempts() {
    let fx = Fixture::new();
    let llm = scripted(1);
    let o = run(
        exec(
            &fx,
            &llm,
            &["--models", "small,big", "--attempts", "4", "--json"],
        ),
        300,
    );
    let what = common::describe(&o);
    assert_eq!(o.status.code(), Some(0), "{what}");
    let mut models: Vec<(u64, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["type"] == "attempt")
        .map(|a| {
            (
                a["index"].as_u64().unwrap(),
                a["model"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    models.sort();
    let names: Vec<&str> = models.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(names, ["small", "big", "small", "big"], "{what}");
    // Each attempt's calls went to its own model.
    for body in llm.requests() {
        let expected = if attempt_of(&body).is_multiple_of(2) {
            "small"
        } else {
            "big"
        };
        assert_eq!(body["model"], expected);
    }
    assert_clean(&fx);
}

#[test]
fn ctrl_c_on_the_screen_drops_every_attempt() {
    let fx = Fixture::new();
    let llm = scripted(1);
    let tty = screen(&fx, &llm);
    tty.keys(&["C-c"]);
    let s = tty.wait_text("exit=", 60);
    assert!(s.contains("exit=130"), "{s}");
    assert!(
        tty.history().contains("interrupted by signal 2"),
        "{}",
        tty.history()
    );
    assert!(!fx.project.join("answer.txt").exists());
    assert_clean(&fx);
}

/// Two attempts at once bind the same loopback port and write the same /tmp file: each has
/// its own, so both binds succeed and each reads back only its own file.
#[test]
fn attempts_have_their_own_ports_and_tmp() {
    let fx = Fixture::new();
    let meet = fx.tmp.path().join("bound");
    std::fs::create_dir_all(&meet).unwrap();
    std::fs::set_permissions(&meet, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = format!(
        "import os, socket, time\n\
         s = socket.socket()\n\
         s.bind(('127.0.0.1', 47123))\n\
         s.listen()\n\
         open(os.path.join({meet:?}, os.urandom(8).hex()), 'w').close()\n\
         end = time.time() + 60\n\
         while len(os.listdir({meet:?})) < 2 and time.time() < end:\n    time.sleep(0.05)\n\
         print('bound while', len(os.listdir({meet:?})), 'were')\n",
        meet = meet.display().to_string()
    );
    std::fs::write(fx.tmp.path().join("bind.py"), &script).unwrap();
    let bind = fx.tmp.path().join("bind.py").display().to_string();
    let llm = FakeLlm::start(Arc::new(move |body: &Value| {
        let i = attempt_of(body);
        if tool_results_since_user(body) == 0 {
            let command = format!(
                "echo mine-{i} > /tmp/shared && /usr/bin/python3 {bind} && cat /tmp/shared"
            );
            Reply::tool("shell", json!({ "command": command }))
        } else {
            Reply::text("done")
        }
    }))
    .unwrap();
    let o = run(
        exec(&fx, &llm, &["--attempts", "2", "--jobs", "2", "--json"]),
        300,
    );
    let what = common::describe(&o);
    assert_eq!(o.status.code(), Some(0), "{what}");
    let mut seen = 0;
    for body in llm.requests() {
        if tool_results_since_user(&body) == 1 {
            let i = attempt_of(&body);
            let out = last_tool_result(&body).unwrap();
            assert!(out.contains("bound while 2 were"), "attempt {i}: {out}");
            assert!(out.contains(&format!("mine-{i}")), "attempt {i}: {out}");
            assert!(
                !out.contains(&format!("mine-{}", 3 - i)),
                "attempt {i}: {out}"
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 2, "{what}");
    assert_clean(&fx);
}

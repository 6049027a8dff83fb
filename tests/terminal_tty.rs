//! The user's terminal belongs to the user: a command nobody watches (a speculation, an MCP
//! `run_command`, a `shade run` in the background or with stdin not a terminal) runs without
//! it and cannot open `/dev/tty`; what shade prints from a model is shown, never obeyed by the
//! terminal; closing the terminal at a question, or losing it without a SIGHUP, ends the chat
//! with no branch left mounted and no process left running. Real terminals (tmux, bare ptys),
//! the real binary, root and /dev/fuse (fails loudly without). Every wait is bounded; every
//! terminal and process a test makes is killed by a guard.
//!
//! `SHADE_TEST_BIN` runs the tests against another shade binary (one built from an older
//! commit, to see them fail there).
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::chat::{exchange, wait_ghost, wait_prompt, Chat};
use common::tty::Tty;
use common::wait_until;
use serde_json::{json, Value};
use shade_testkit::{
    is_suggestion_request, last_real_user, last_tool_result, tool_results_since_user, Reply,
};

/// The shade binary under test.
fn shade_bin() -> String {
    std::env::var("SHADE_TEST_BIN")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_shade").to_string())
}

/// `shade chat` of `chat` in a tmux terminal, with `extra` arguments, at its first prompt.
fn start_chat(chat: &Chat, extra: &[&str]) -> Tty {
    let bin = shade_bin();
    let mut argv = vec![bin.as_str(), "chat"];
    argv.extend_from_slice(extra);
    let tty = Tty::start(&argv, &chat.project, &chat.env());
    tty.wait_text("/help for commands", 60);
    wait_prompt(&tty);
    tty
}

/// What a command prints about the terminal it can reach: `NO-TTY` when /dev/tty cannot be
/// opened, else whether it could make itself the foreground group and the line it read.
/// Bounded: it gives up reading after 8 s.
const PROBE: &str = r#"perl -MPOSIX -e '
  if (!open(T, "+<", "/dev/tty")) { print "NO-TTY: $!\n"; exit 0 }
  print "TTY-OPEN\n";
  $SIG{TTOU} = "IGNORE";
  print tcsetpgrp(fileno(T), getpgrp()) ? "FOREGROUND\n" : "NO-FOREGROUND: $!\n";
  $SIG{ALRM} = sub { print "READ-NOTHING\n"; exit 0 }; alarm 8;
  my $l = <T>; print "READ: $l";'"#;

/// The model: two plain turns, then the suggestion "probe the terminal", whose turn runs
/// [`PROBE`] in the shell.
fn probe_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        return Reply::text(if user == "what now?" {
            "probe the terminal"
        } else {
            ""
        });
    }
    let reply = match (user.as_str(), tool_results_since_user(body)) {
        ("hello", _) => Reply::text("Hello."),
        ("what now?", _) => Reply::text("Nothing yet."),
        ("probe the terminal", 0) => Reply::tool("shell", json!({ "command": PROBE })),
        ("probe the terminal", _) => Reply::text("Probed."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    };
    reply.after(Duration::from_millis(200))
}

/// The speculation's tool result for "probe the terminal", once the fast model got it.
fn speculated_probe(chat: &Chat) -> Option<String> {
    chat.llm
        .requests()
        .iter()
        .find(|r| {
            !is_suggestion_request(r)
                && last_real_user(r) == "probe the terminal"
                && tool_results_since_user(r) == 1
                && r["model"] == "fast-model"
        })
        .and_then(last_tool_result)
}

#[test]
fn a_speculated_command_gets_no_terminal_and_the_users_keys_reach_the_chat() {
    common::require_fuse_root();
    let chat = Chat::new(probe_model);
    let tty = start_chat(&chat, &["--approval", "yolo"]);
    exchange(&tty, "hello", "Hello.");
    exchange(&tty, "what now?", "Nothing yet.");
    wait_ghost(&tty, "probe the terminal");
    // Where the command could read the terminal, it waits for the user's next line: type
    // one while it may (it gives up after 8 s), without taking the suggestion.
    std::thread::sleep(Duration::from_secs(2));
    tty.type_text("x");
    tty.keys(&["BSpace"]);
    wait_until("the speculated command's result", 60, || {
        speculated_probe(&chat).is_some()
    });
    let result = speculated_probe(&chat).unwrap();
    assert!(
        result.contains("NO-TTY") && !result.contains("TTY-OPEN"),
        "the speculated command reached the terminal: {result}"
    );
    // The chat still has the keyboard.
    tty.say("are you there?");
    tty.wait_text("You said: are you there?", 60);
    wait_prompt(&tty);
    // The user's own command (`!cmd`) may open the terminal (a password prompt).
    tty.say("!if exec 3</dev/tty; then echo USER-TTY-$((40 + 2)); fi");
    tty.wait_text("USER-TTY-42", 60);
    wait_prompt(&tty);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// A child process killed (and reaped) when dropped, so a failing test leaves nothing.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: signalling the process group our child leads (and the child itself).
        unsafe {
            libc::kill(-(self.0.id() as i32), libc::SIGKILL);
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `secs` for `child` to exit; panics (the guard kills it) otherwise.
fn wait_exit(child: &mut Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not end within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A new pty pair: (master, slave), both close-on-exec.
fn pty() -> (OwnedFd, OwnedFd) {
    let pair = nix::pty::openpty(None, None).unwrap();
    for fd in [&pair.master, &pair.slave] {
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .unwrap();
    }
    (pair.master, pair.slave)
}

/// `cmd` in a session of its own whose controlling terminal is `slave` (as a terminal
/// emulator starts its shell); its stdio is left to the caller.
fn with_controlling_tty(cmd: &mut Command, slave: &OwnedFd) {
    let fd = slave.as_raw_fd();
    // SAFETY: setsid and ioctl on an fd we keep open across the spawn.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() == -1 || libc::ioctl(fd, libc::TIOCSCTTY, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The master side of a pty, read on a thread into a buffer (so the program writing to the
/// terminal never blocks) until [`Screen::close`] or drop closes it.
struct Screen {
    buf: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Screen {
    /// Takes `master`: the reader thread owns the only copy, and closes it when told.
    fn read(master: OwnedFd) -> Screen {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (out, halt) = (buf.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut file = std::fs::File::from(master);
            let mut chunk = [0u8; 4096];
            while !halt.load(std::sync::atomic::Ordering::SeqCst) {
                let mut fds = [libc::pollfd {
                    fd: file.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                // SAFETY: poll(2) on one fd we own, with a timeout.
                if unsafe { libc::poll(fds.as_mut_ptr(), 1, 100) } <= 0 {
                    continue;
                }
                match file.read(&mut chunk) {
                    Ok(n) if n > 0 => out.lock().unwrap().extend_from_slice(&chunk[..n]),
                    _ => break,
                }
            }
        });
        Screen {
            buf,
            stop,
            reader: Some(reader),
        }
    }

    fn shows(&self, text: &str) -> bool {
        String::from_utf8_lossy(&self.buf.lock().unwrap()).contains(text)
    }

    /// Closes the master: the terminal is gone.
    fn close(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.close();
    }
}

#[test]
fn an_mcp_run_command_gets_no_terminal() {
    let fx = common::Fixture::new();
    fx.write("README", "a project\n");
    // shade mcp started from a terminal (its controlling one), speaking over pipes.
    let (master, slave) = pty();
    let _screen = Screen::read(master);
    let mut cmd = Command::new(shade_bin());
    cmd.arg("mcp")
        .current_dir(&fx.project)
        .env("SHADE_STATE_DIR", fx.state.root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    with_controlling_tty(&mut cmd, &slave);
    let mut child = Reaped(cmd.spawn().unwrap());
    drop(slave);
    let mut stdin = child.0.stdin.take().unwrap();
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    let mut send = move |v: Value| {
        use std::io::Write;
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    let reply = |id: u64| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no reply to request {id} within 60 s"));
            if v["id"] == id {
                return v;
            }
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "shade-test", "version": "1"}}}),
    );
    reply(1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = |id: u64, name: &str, args: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": args}})
    };
    send(call(2, "create_branch", json!({})));
    let created = reply(2).to_string();
    let id = created
        .split(|c: char| !c.is_alphanumeric())
        .find(|w| w.starts_with('b') && w.len() > 1 && w[1..].chars().all(|c| c.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no branch id in {created}"))
        .to_string();
    send(call(
        3,
        "run_command",
        json!({"branch": id, "command": PROBE}),
    ));
    let result = reply(3).to_string();
    assert!(
        result.contains("NO-TTY") && !result.contains("TTY-OPEN"),
        "the MCP command reached the terminal: {result}"
    );
    drop(send);
    let status = wait_exit(&mut child.0, 30, "shade mcp after its client left");
    assert!(status.code().is_some(), "{status:?}");
    common::assert_no_shade_mounts(&fx.state);
}

#[test]
fn a_model_reply_cannot_set_the_title_or_the_clipboard() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        if is_suggestion_request(body) {
            return Reply::text("");
        }
        Reply::text("before \x1b]0;PWNED-TITLE\x07 middle \x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07 after \x1b]8;;http://evil/\x07link\x1b]8;;\x07 ZZEND")
    });
    let tty = start_chat(&chat, &[]);
    let title = || {
        let out = Command::new("tmux")
            .args(["-L", &tty_socket(&tty), "display-message", "-p", "-t", "0"])
            .arg("#{pane_title}")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Applications may set tmux's clipboard (OSC 52), as many terminals allow.
    let _ = Command::new("tmux")
        .args([
            "-L",
            &tty_socket(&tty),
            "set-option",
            "-g",
            "set-clipboard",
            "on",
        ])
        .output();
    let before = title();
    tty.say("say something");
    let screen = tty.wait_text("ZZEND", 60);
    assert!(
        screen.contains("^[]0;PWNED-TITLE^G") && screen.contains("^[]52;c;"),
        "the escapes are not shown:\n{screen}"
    );
    assert!(!title().contains("PWNED"), "the title changed: {}", title());
    assert_eq!(title(), before);
    let buffers = Command::new("tmux")
        .args(["-L", &tty_socket(&tty), "list-buffers"])
        .output()
        .unwrap();
    assert!(
        buffers.stdout.is_empty(),
        "the clipboard got: {}",
        String::from_utf8_lossy(&buffers.stdout)
    );
    // The turn's end first: keys typed before the prompt is back are not the prompt's
    // (CI19 lost this Ctrl-D on a loaded machine).
    wait_prompt(&tty);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
}

/// The tmux socket name of `tty` (see common/tty.rs).
fn tty_socket(tty: &Tty) -> String {
    tty.socket().to_string()
}

const BUGGY: &str = "#!/bin/sh\necho $(( $1 - $2 ))\n";

/// The model for the accept question: its suggestion "fix it" edits add.sh, which in the
/// default approval mode makes accept ask before writing.
fn fixing_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        return Reply::text(if user == "what is wrong?" {
            "fix it"
        } else {
            ""
        });
    }
    let reply = match (user.as_str(), tool_results_since_user(body)) {
        ("hello", _) => Reply::text("Hello."),
        ("what is wrong?", _) => Reply::text("add.sh subtracts."),
        ("fix it", 0) => Reply::tool(
            "edit",
            json!({"path": "add.sh", "old_string": "$1 - $2", "new_string": "$1 + $2"}),
        ),
        ("fix it", _) => Reply::text("Fixed add.sh."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    };
    reply.after(Duration::from_millis(200))
}

/// Processes whose command line names `dir` (a sandbox binds its branch from there).
fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && !cmdline.starts_with("tmux ") {
            found.push(format!("{name}: {cmdline}"));
        }
    }
    found
}

/// The shade mounts of `chat`'s state directory.
fn mounts_of(chat: &Chat) -> Vec<String> {
    let state = chat.state.display().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&state))
        .map(str::to_string)
        .collect()
}

#[test]
fn sighup_at_the_speculations_question_leaves_no_mount_and_no_process() {
    common::require_fuse_root();
    let chat = Chat::new(fixing_model);
    std::fs::write(chat.project.join("add.sh"), BUGGY).unwrap();
    let tty = start_chat(&chat, &[]);
    exchange(&tty, "hello", "Hello.");
    exchange(&tty, "what is wrong?", "add.sh subtracts.");
    wait_ghost(&tty, "fix it");
    wait_until("the speculated answer", 60, || {
        chat.llm.requests().iter().any(|r| {
            last_real_user(r) == "fix it"
                && tool_results_since_user(r) == 1
                && r["model"] == "fast-model"
        })
    });
    tty.keys(&["Enter"]);
    tty.wait_text("write these changes into the project?", 60);
    assert!(
        !mounts_of(&chat).is_empty(),
        "no branch mounted at the question"
    );
    let pid = tty.pane_pid();
    // SAFETY: signalling the program in our own terminal.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while tty.alive() || !mounts_of(&chat).is_empty() {
        assert!(
            Instant::now() < deadline,
            "10 s after SIGHUP: alive {}, mounts {:?}",
            tty.alive(),
            mounts_of(&chat)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(tty.exit_status(10), Ok(128 + libc::SIGHUP));
    assert!(mounts_of(&chat).is_empty(), "{:?}", mounts_of(&chat));
    // The speculation's branch came from the project's branch server, a daemon of its own
    // that outlives the chat by design (it exits when idle): ended first, and it must go.
    common::stop_branch_servers(&chat.state);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_naming(&chat.state).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes left 10 s after SIGHUP: {:?}",
            processes_naming(&chat.state)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read_to_string(chat.project.join("add.sh")).unwrap(),
        BUGGY
    );
}

#[test]
fn a_chat_whose_terminal_vanishes_without_sighup_ends_and_leaves_no_mount() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        if is_suggestion_request(body) {
            return Reply::text("");
        }
        Reply::text("Hello.")
    });
    // A terminal that is not the chat's controlling one: closing it sends no SIGHUP, reads
    // on it fail (EIO).
    let (master, slave) = pty();
    let mut screen = Screen::read(master);
    let mut cmd = Command::new(shade_bin());
    cmd.args(["chat", "--shadow"])
        .current_dir(&chat.project)
        .env("TERM", "xterm-256color")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    for (k, v) in chat.env() {
        cmd.env(k, v);
    }
    // SAFETY: setsid(2) only: a session without a controlling terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = Reaped(cmd.spawn().unwrap());
    drop(slave);
    wait_until("the chat's first prompt", 60, || {
        screen.shows("/help for commands")
    });
    wait_until("the session's branch", 60, || !mounts_of(&chat).is_empty());
    std::thread::sleep(Duration::from_millis(500));
    screen.close();
    let status = wait_exit(&mut child.0, 10, "the chat after its terminal vanished");
    assert_eq!(status.code(), Some(128 + libc::SIGHUP), "{status:?}");
    assert!(mounts_of(&chat).is_empty(), "{:?}", mounts_of(&chat));
}

/// `shade run -- PROBE` in a tmux terminal, started by `shell` (a bash line where `SHADE`
/// names the binary); returns what PROBE printed into `out`.
fn run_probe_in_terminal(fx: &common::Fixture, shell: &str) -> String {
    let out = fx.tmp.path().join("probe.out");
    let script = fx.tmp.path().join("probe.sh");
    std::fs::write(&script, format!("{PROBE}\n")).unwrap();
    let line = format!(
        "SHADE={}; OUT={}; PROBE='sh {}'; {shell}; echo FINISHED >> $OUT; sleep 60",
        shade_bin(),
        out.display(),
        script.display()
    );
    let env = [("SHADE_STATE_DIR", fx.state.root().display().to_string())];
    let tty = Tty::start(&["bash", "-c", &line], &fx.project, &env);
    // The probe gives up reading after 8 s; send it a line so it need not wait that long.
    std::thread::sleep(Duration::from_secs(1));
    tty.say("typed-line");
    wait_until("the probe to finish", 60, || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("FINISHED"))
    });
    drop(tty);
    std::fs::read_to_string(&out).unwrap()
}

#[test]
fn shade_run_hands_the_terminal_only_to_its_foreground_job() {
    let fx = common::Fixture::new();
    fx.write("README", "a project\n");
    // stdin not a terminal: no terminal.
    let got = run_probe_in_terminal(&fx, "$SHADE run -- $PROBE </dev/null >$OUT 2>&1");
    assert!(
        got.contains("NO-TTY") && !got.contains("TTY-OPEN"),
        "stdin /dev/null: {got}"
    );
    // A background job (its own process group, job control on): no terminal, and not the
    // keys typed meanwhile either.
    let got = run_probe_in_terminal(&fx, "set -m; $SHADE run -- $PROBE >$OUT 2>&1 & wait");
    assert!(
        got.contains("NO-TTY") && !got.contains("TTY-OPEN"),
        "in the background: {got}"
    );
    // The terminal's foreground job: the user's own command gets it.
    let got = run_probe_in_terminal(&fx, "$SHADE run -- $PROBE >$OUT 2>&1");
    assert!(
        got.contains("TTY-OPEN") && got.contains("READ: typed-line"),
        "in the foreground: {got}"
    );
    common::assert_no_shade_mounts(&fx.state);
}

/// A command given the user's terminal leaves it as it found it: its modes (`stty -echo`)
/// are put back when it ends, and it cannot change the terminal's line discipline at all
/// (TIOCSETD: N_NULL would leave the user's shell deaf after the command; red team round 9).
#[test]
fn a_command_leaves_the_users_terminal_as_it_found_it() {
    let fx = common::Fixture::new();
    fx.write("README", "a project\n");
    let dir = fx.tmp.path();
    let out = dir.join("tty.out");
    let cmd = dir.join("cmd.sh");
    std::fs::write(
        &cmd,
        "stty -echo\n\
         python3 -c '\n\
import errno, fcntl, struct, termios\n\
try:\n    fcntl.ioctl(0, 0x5423, struct.pack(\"i\", 27))\n    print(\"SETD allowed\")\n\
except OSError as e:\n    print(\"SETD\", errno.errorcode[e.errno])\n\
termios.tcflow(0, termios.TCOOFF)\n\
fcntl.ioctl(0, termios.TIOCEXCL)\n'\n",
    )
    .unwrap();
    let after = dir.join("after.sh");
    std::fs::write(
        &after,
        "stty -a | tr ' ;' '\\n\\n' | grep -x -e echo -e -echo | sed 's/^/MODE /'\n\
         python3 -c 'import fcntl, struct; print(\"LDISC\", struct.unpack(\"i\", fcntl.ioctl(0, 0x5424, bytes(4)))[0])'\n",
    )
    .unwrap();
    // After the command: its output must reach the terminal (not suspended), and the
    // plain user must be able to open it (not exclusive).
    let line = format!(
        "{} run -- sh {} >{out} 2>&1; sh {} >>{out} 2>&1; echo TERMINAL-WRITES; \
         setpriv --reuid=shadetest --regid=shadetest --clear-groups sh -c ': </dev/tty' \
         && echo OPEN-OK >>{out}; echo FINISHED >>{out}; sleep 60",
        shade_bin(),
        cmd.display(),
        after.display(),
        out = out.display()
    );
    let env = [("SHADE_STATE_DIR", fx.state.root().display().to_string())];
    let tty = Tty::start(&["bash", "-c", &line], &fx.project, &env);
    wait_until("the command and the check to finish", 60, || {
        std::fs::read_to_string(&out).is_ok_and(|s| s.contains("FINISHED"))
    });
    tty.wait_text("TERMINAL-WRITES", 30);
    drop(tty);
    let got = std::fs::read_to_string(&out).unwrap();
    assert!(got.contains("SETD EPERM"), "the line discipline: {got}");
    assert!(got.contains("MODE echo\n"), "echo was left off: {got}");
    assert!(
        got.contains("LDISC 0"),
        "the terminal's line discipline: {got}"
    );
    assert!(
        got.contains("OPEN-OK"),
        "the terminal was left exclusive: {got}"
    );
    common::assert_no_shade_mounts(&fx.state);
}

#[test]
fn shade_run_diff_shows_a_files_escapes_instead_of_sending_them() {
    let fx = common::Fixture::new();
    fx.write("README", "a project\n");
    let line = format!(
        "{} run --diff -- sh -c 'printf \"title \\033]0;PWNED-TITLE\\007 clip \\033]52;c;eA==\\007 ZZEND\\n\" > note.txt'; sleep 60",
        shade_bin()
    );
    let env = [("SHADE_STATE_DIR", fx.state.root().display().to_string())];
    let tty = Tty::start(&["bash", "-c", &line], &fx.project, &env);
    let _ = Command::new("tmux")
        .args([
            "-L",
            tty.socket(),
            "set-option",
            "-g",
            "set-clipboard",
            "on",
        ])
        .output();
    let screen = tty.wait_text("ZZEND", 60);
    assert!(
        screen.contains("^[]0;PWNED-TITLE^G") && screen.contains("^[]52;c;"),
        "the diff's escapes are not shown:\n{screen}"
    );
    let title = Command::new("tmux")
        .args(["-L", tty.socket(), "display-message", "-p", "-t", "0"])
        .arg("#{pane_title}")
        .output()
        .unwrap();
    let title = String::from_utf8_lossy(&title.stdout);
    assert!(!title.contains("PWNED"), "the title changed: {title}");
    drop(tty);
    common::assert_no_shade_mounts(&fx.state);
}

#[test]
fn a_command_inherits_no_fd_of_shades_or_its_parents() {
    let fx = common::Fixture::new();
    fx.write("README", "a project\n");
    // A parent that leaks an fd (opened without close-on-exec) to shade.
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 7</etc/hostname; exec {} run -- ls -l /proc/self/fd/",
            shade_bin()
        ))
        .current_dir(&fx.project)
        .env("SHADE_STATE_DIR", fx.state.root())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", common::describe(&out));
    assert!(listing.contains(" 0 -> "), "{listing}");
    assert!(
        !listing.contains("hostname") && !listing.contains(" 7 -> "),
        "the command inherited shade's fds:\n{listing}"
    );
    common::assert_no_shade_mounts(&fx.state);
}

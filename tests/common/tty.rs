//! Drive a real program in a real terminal: tmux runs it, `send-keys` types, `capture-pane`
//! reads the screen. Each terminal has its own tmux server (socket), killed on drop.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// One tmux server with one window running the program.
pub struct Tty {
    socket: String,
}

fn tmux(socket: &str) -> Command {
    let mut c = Command::new("tmux");
    c.args(["-L", socket, "-f", "/dev/null"]);
    c
}

impl Tty {
    /// Run `argv` in `cwd` with `env` on a 120×40 terminal.
    pub fn start(argv: &[&str], cwd: &Path, env: &[(&str, String)]) -> Tty {
        let socket = format!("shade-test-{}-{}", std::process::id(), fastrand::u32(..));
        let mut c = tmux(&socket);
        c.args(["new-session", "-d", "-x", "120", "-y", "40", "-c"])
            .arg(cwd)
            .env("TERM", "xterm-256color");
        for (k, v) in env {
            c.args(["-e", &format!("{k}={v}")]);
        }
        c.arg("--");
        c.args(argv);
        let out = c
            .output()
            .expect("tmux must be installed (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Keep the pane (and its last screen) if the program exits, so a failure shows why.
        let _ = tmux(&socket)
            .args(["set-option", "-g", "remain-on-exit", "on"])
            .output();
        Tty { socket }
    }

    /// Press keys by tmux name (`Enter`, `Tab`, `Right`, `C-c`, `BTab`, …).
    pub fn keys(&self, keys: &[&str]) {
        let out = tmux(&self.socket)
            .args(["send-keys", "-t", "0"])
            .args(keys)
            .output()
            .unwrap();
        assert!(out.status.success(), "send-keys {keys:?} failed");
    }

    /// Type literal text.
    pub fn type_text(&self, text: &str) {
        let out = tmux(&self.socket)
            .args(["send-keys", "-t", "0", "-l", text])
            .output()
            .unwrap();
        assert!(out.status.success(), "send-keys -l failed");
    }

    /// Type `text` and press Enter (submit a prompt or an answer).
    pub fn say(&self, text: &str) {
        self.type_text(text);
        self.keys(&["Enter"]);
    }

    /// The visible screen as text.
    pub fn screen(&self) -> String {
        self.capture(false)
    }

    /// The visible screen with colour and attribute escapes (to tell dim ghost text apart).
    pub fn screen_styled(&self) -> String {
        self.capture(true)
    }

    /// Everything the program printed so far: the scrollback and the screen.
    pub fn history(&self) -> String {
        let out = tmux(&self.socket)
            .args(["capture-pane", "-p", "-J", "-S", "-", "-t", "0"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn capture(&self, escapes: bool) -> String {
        let mut c = tmux(&self.socket);
        c.args(["capture-pane", "-p", "-t", "0"]);
        if escapes {
            c.arg("-e");
        }
        String::from_utf8_lossy(&c.output().unwrap().stdout).into_owned()
    }

    /// Wait until `pred(screen)` holds; panic with the screen after `secs`.
    pub fn wait_for(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}; the screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until the screen shows `text`.
    pub fn wait_text(&self, text: &str, secs: u64) -> String {
        self.wait_for(&format!("{text:?}"), secs, |s| s.contains(text))
    }

    /// The cursor's column and row.
    pub fn cursor(&self) -> (usize, usize) {
        let text = self.show("#{cursor_x} #{cursor_y}");
        let mut it = text.split_whitespace().map(|n| n.parse().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    }

    /// tmux's `display-message -p FORMAT` for the pane: its facts (pid, cursor, status).
    fn show(&self, format: &str) -> String {
        let out = tmux(&self.socket)
            .args(["display-message", "-p", "-t", "0", format])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The tmux server's socket name (`tmux -L NAME`).
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// The program's pid.
    pub fn pane_pid(&self) -> i32 {
        self.show("#{pane_pid}").trim().parse().unwrap()
    }

    /// The program's exit status once it has ended (the pane stays: remain-on-exit). tmux
    /// marks the pane dead when the terminal closes, which can be before it has reaped the
    /// program: the status is waited for (up to `secs`). A program killed by a signal has no
    /// status: the error names the signal.
    pub fn exit_status(&self, secs: u64) -> Result<i32, String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let text = self.show("#{pane_dead_status} #{pane_dead_signal}");
            let mut words = text.split_whitespace();
            if let Some(Ok(code)) = words.next().map(str::parse) {
                return Ok(code);
            }
            // tmux has not reaped it (yet: 3.3a was seen to leave a zombie unreaped for good):
            // the zombie's own exit code, in waitpid's encoding, says how it ended.
            if let Some(status) = zombie_status(self.pane_pid()) {
                return if status & 0x7f == 0 {
                    Ok((status >> 8) & 0xff)
                } else {
                    Err(format!("killed by signal {}", status & 0x7f))
                };
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("no exit status after {secs} s (tmux: {text:?})"));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Is the program still running?
    pub fn alive(&self) -> bool {
        self.show("#{pane_dead}").trim() == "0"
    }
}

impl Drop for Tty {
    /// Close the terminal and wait (a while) for the program to be gone, so that a test, even
    /// a failing one, does not remove its directories under a session still unmounting.
    fn drop(&mut self) {
        let facts = tmux(&self.socket)
            .args([
                "display-message",
                "-p",
                "-t",
                "0",
                "#{pane_pid} #{socket_path}",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let (pid, socket) = facts.split_once(' ').unwrap_or(("", ""));
        let pid = pid.parse::<u32>().ok();
        let _ = tmux(&self.socket).arg("kill-server").output();
        // The server leaves its socket file behind.
        if !socket.is_empty() {
            let _ = std::fs::remove_file(socket);
        }
        let Some(pid) = pid else { return };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            // Gone, or a zombie waiting for init: it holds nothing any more.
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return,
                Ok(stat)
                    if stat
                        .rsplit(')')
                        .next()
                        .is_some_and(|r| r.trim_start().starts_with('Z')) =>
                {
                    return
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// The exit code (waitpid's encoding) of `pid` if it is a zombie: the last field of
/// `/proc/PID/stat`.
fn zombie_status(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state, then the numeric fields.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    (fields.first() == Some(&"Z"))
        .then(|| fields.last()?.parse().ok())
        .flatten()
}

//! A `shade chat` session in a real terminal against the local fake model.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use shade_testkit::{FakeLlm, Reply};

use super::tty::Tty;

/// A project, a config/state home, and the fake model.
pub struct Chat {
    pub _home: tempfile::TempDir,
    pub project: PathBuf,
    pub state: PathBuf,
    pub llm: FakeLlm,
    /// Run shade as the plain test user instead of root (see [`Chat::run_by_plain_user`]).
    pub plain: bool,
}

impl Chat {
    pub fn new(router: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Chat {
        let home = tempfile::tempdir().unwrap();
        let project = home.path().join("project");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(project.join("README"), "a project\n").unwrap();
        let state = home.path().join("state");
        let llm = FakeLlm::start(Arc::new(router)).unwrap();
        Chat {
            project,
            state,
            llm,
            _home: home,
            plain: false,
        }
    }

    /// From now on the session runs as the plain test user, who owns the home, the
    /// project (as it is now) and the state dir.
    pub fn run_by_plain_user(mut self) -> Chat {
        super::plain::require_fuse();
        let home = self.project.parent().unwrap().to_path_buf();
        std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        super::plain::chown_tree(&home);
        self.plain = true;
        self
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        let home = self.project.parent().unwrap().display().to_string();
        vec![
            ("HOME", home.clone()),
            ("XDG_CONFIG_HOME", format!("{home}/config")),
            ("SHADE_STATE_DIR", self.state.display().to_string()),
            ("OPENAI_BASE_URL", self.llm.base_url.clone()),
            ("OPENAI_API_KEY", "test-key".into()),
            ("SHADE_MODEL", "main-model".into()),
            ("SHADE_FAST_MODEL", "fast-model".into()),
            ("SHADE_LOG", "warn".into()),
        ]
    }

    pub fn start(&self, extra: &[&str]) -> Tty {
        self.start_with(extra, &[])
    }

    /// Start with some environment variables set otherwise (`changed` wins).
    pub fn start_with(&self, extra: &[&str], changed: &[(&'static str, String)]) -> Tty {
        let bin = env!("CARGO_BIN_EXE_shade");
        let prefix = if self.plain {
            super::plain::argv(bin)
        } else {
            vec![bin.to_string()]
        };
        let mut argv: Vec<&str> = prefix.iter().map(String::as_str).collect();
        argv.push("chat");
        argv.extend_from_slice(extra);
        let mut env = self.env();
        env.retain(|(k, _)| !changed.iter().any(|(c, _)| c == k));
        env.extend_from_slice(changed);
        let tty = Tty::start(&argv, &self.project, &env);
        tty.wait_text("/help for commands", 60);
        wait_prompt(&tty);
        tty
    }

    /// Branch stores of this session in the state dir now.
    pub fn branch_dirs(&self) -> usize {
        std::fs::read_dir(self.state.join("branches"))
            .map(|d| d.flatten().filter(|e| !pooled(&e.path())).count())
            .unwrap_or(0)
    }

    /// Shade mounts of this session's state dir now (a warm connection waiting in the
    /// pool, no branch's, left out).
    pub fn mounts(&self) -> usize {
        let state = self.state.display().to_string();
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&state))
            .filter(|l| {
                let point = Path::new(l.split(' ').nth(1).unwrap_or(""));
                !point.parent().is_some_and(pooled)
            })
            .count()
    }

    /// Once the session has dropped its branches (waited for), none is mounted or stored.
    pub fn assert_nothing_left(&self) {
        // A warm connection waiting in the pool is no branch (the session's end, or its
        // idle time, unmounts it: fusefs/tests/pool.rs).
        super::wait_until("the branches to be dropped", 60, || self.branch_dirs() == 0);
        assert_eq!(
            self.mounts(),
            0,
            "a branch is still mounted:\n{}",
            std::fs::read_to_string("/proc/mounts").unwrap()
        );
    }

    /// What a default (live) session holds while it runs: its layer directory
    /// (`<pid>-live-<n>`) and the branch that directory names.
    fn session_own(&self) -> Vec<String> {
        let mut own = Vec::new();
        for e in std::fs::read_dir(self.state.join("branches"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains("-live-") {
                if let Ok(b) = std::fs::read_to_string(e.path().join("branch")) {
                    own.push(b.trim().to_string());
                }
                // A branch on a pooled connection is mounted in that connection's first
                // directory.
                if let Ok(m) = std::fs::read_to_string(e.path().join("mount")) {
                    if let Some(d) = Path::new(m.trim()).parent().and_then(Path::file_name) {
                        own.push(d.to_string_lossy().into_owned());
                    }
                }
                own.push(name);
            }
        }
        own
    }

    /// Whether `rel` exists in the project or in the running session's branch, where a
    /// default session's command writes until its call ends and is accepted.
    pub fn exists_in_session(&self, rel: &str) -> bool {
        self.project.join(rel).exists()
            || self.session_own().iter().any(|b| {
                self.state
                    .join("branches")
                    .join(b)
                    .join("mnt")
                    .join(rel)
                    .exists()
            })
    }

    /// Branch stores now besides the running default session's own.
    pub fn other_branch_dirs(&self) -> usize {
        let own = self.session_own();
        std::fs::read_dir(self.state.join("branches"))
            .map(|d| {
                d.flatten()
                    .filter(|e| !own.contains(&e.file_name().to_string_lossy().into_owned()))
                    .filter(|e| !pooled(&e.path()))
                    .count()
            })
            .unwrap_or(0)
    }

    /// [`Chat::assert_nothing_left`] while a default session runs: nothing but its own
    /// branch and layer is mounted or stored.
    pub fn assert_nothing_left_but_the_session(&self) {
        super::wait_until("the other branches to be dropped", 60, || {
            self.other_branch_dirs() == 0
        });
        let own = self.session_own();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        let state = self.state.display().to_string();
        assert!(
            !mounts.lines().any(|l| {
                let point = Path::new(l.split(' ').nth(1).unwrap_or(""));
                l.contains(&state)
                    && !own.iter().any(|o| l.contains(o.as_str()))
                    && !point.parent().is_some_and(pooled)
            }),
            "a branch is still mounted:\n{mounts}"
        );
    }

    /// Telemetry events so far.
    pub fn telemetry(&self) -> Vec<Value> {
        read_jsonl(&self.state.join("telemetry.jsonl"))
    }

    pub fn suggestion_events(&self) -> Vec<Value> {
        self.telemetry()
            .into_iter()
            .filter(|e| e["event"] == "prompt_suggestion")
            .collect()
    }

    pub fn wait_suggestion_events(&self, n: usize) -> Vec<Value> {
        for _ in 0..200 {
            let ev = self.suggestion_events();
            if ev.len() >= n {
                return ev;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "expected {n} prompt_suggestion telemetry lines, got {:?}",
            self.suggestion_events()
        );
    }
}

pub fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The dim (SGR 2) ghost text on the prompt line.
pub fn ghost_shown(tty: &Tty, text: &str) -> bool {
    let styled = tty.screen_styled();
    styled
        .lines()
        .any(|l| l.contains("shade") && l.contains(text) && l.contains("\x1b[2m"))
}

pub fn wait_ghost(tty: &Tty, text: &str) {
    for _ in 0..200 {
        if ghost_shown(tty, text) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "ghost text {text:?} never appeared; the screen:\n{}",
        tty.screen_styled()
    );
}

/// The last prompt line of the screen.
pub fn prompt_line(screen: &str) -> String {
    screen
        .lines()
        .rfind(|l| l.starts_with("shade"))
        .unwrap_or("")
        .to_string()
}

/// Wait until the prompt is back with nothing typed (a suggestion may show as ghost text):
/// the line editor reads keys again. Keys sent before that reach a terminal in cooked mode,
/// where Ctrl-C is a signal, not a key.
pub fn wait_prompt(tty: &Tty) -> String {
    tty.wait_for("an empty prompt", 60, |s| {
        let (x, y) = tty.cursor();
        // (capture-pane drops trailing blanks)
        let line = format!("{:<x$}", s.lines().nth(y).unwrap_or(""));
        line.starts_with("shade") && line.get(..x).is_some_and(|l| l.ends_with("> "))
    })
}

/// One exchange at the prompt: submit `prompt`, wait (60 s) for `answer` on the screen, then
/// for the prompt to be back. Returns the screen then.
pub fn exchange(tty: &Tty, prompt: &str, answer: &str) -> String {
    tty.say(prompt);
    tty.wait_text(answer, 60);
    wait_prompt(tty)
}

/// Whether the branch directory `dir` holds a warm connection waiting in the pool, not a
/// branch (`shade_fusefs::POOLED_MARK`).
fn pooled(dir: &Path) -> bool {
    dir.join(shade_fusefs::POOLED_MARK).exists()
}

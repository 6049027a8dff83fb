//! The default `shade chat` session (no `--shadow`) in a real terminal (tmux) against the real
//! binary and the local fake model: every tool call runs in a branch and is accepted into the
//! project right after it, so edits appear as the agent works, `/undo` takes whole turns
//! back (shell-made changes included), a command's writes outside the project stay in the
//! session's layer, and an accept that meets a user's edit keeps both.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use common::chat::{wait_prompt, Chat};
use common::wait_until;
use serde_json::{json, Value};
use shade_testkit::{last_real_user, last_tool_result, tool_results_since_user, Reply};

fn read(chat: &Chat, rel: &str) -> String {
    std::fs::read_to_string(chat.project.join(rel)).unwrap()
}

const ARGS: &[&str] = &["--approval", "yolo", "--no-suggest", "--no-speculate"];

/// A turn whose shell ran `sed -i` and a formatter, then an edit tool call, each accepted
/// as it ran (the files change in the project before the turn ends); a second turn adds a
/// file. `/undo` takes back the second turn only, `/undo` again the whole first turn (its
/// two accepts, newest first), and the model is told.
#[test]
fn undo_takes_back_a_live_turn_whose_shell_edited_and_formatted() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        let user = last_real_user(body);
        match (user.as_str(), tool_results_since_user(body)) {
            ("tidy the code", 0) => Reply::tool(
                "shell",
                json!({"command": "sed -i s/one/two/ notes.txt && tr -s ' ' < code.c > fmt.tmp && mv fmt.tmp code.c"}),
            ),
            ("tidy the code", 1) => Reply::tool(
                "edit",
                json!({"path": "notes.txt", "old_string": "two", "new_string": "three"}),
            ),
            ("tidy the code", _) => Reply::text("Tidied."),
            ("add a file", 0) => {
                Reply::tool("write_file", json!({"path": "new.txt", "content": "new\n"}))
            }
            ("add a file", _) => Reply::text("Added."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    std::fs::write(chat.project.join("notes.txt"), "one\n").unwrap();
    std::fs::write(chat.project.join("code.c"), "int  x=1 ;\n").unwrap();
    let tty = chat.start(ARGS);
    tty.say("tidy the code");
    tty.wait_text("Tidied.", 60);
    wait_prompt(&tty);
    // In the project as soon as the calls ran: no /accept.
    assert_eq!(read(&chat, "notes.txt"), "three\n");
    assert_eq!(read(&chat, "code.c"), "int x=1 ;\n");
    tty.say("add a file");
    tty.wait_text("Added.", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "new.txt"), "new\n");

    tty.say("/undo");
    let screen = tty.wait_text("removed new.txt", 60);
    wait_prompt(&tty);
    assert!(!chat.project.join("new.txt").exists(), "{screen}");
    assert_eq!(read(&chat, "notes.txt"), "three\n", "{screen}");

    tty.say("/undo");
    tty.wait_text("restored code.c", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "notes.txt"), "one\n");
    assert_eq!(read(&chat, "code.c"), "int  x=1 ;\n");
    assert!(!chat.project.join("fmt.tmp").exists());

    tty.say("what now?");
    tty.wait_text("You said: what now?", 60);
    wait_prompt(&tty);
    let sent = chat.llm.requests();
    let last = sent.last().unwrap()["messages"].to_string();
    assert!(last.contains("I undid accepted changes"), "{last}");
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// The default session's shell cannot write outside the project into the host: its write
/// to the home directory lands in the session's layer, is listed after the turn, and is
/// dropped (said) at the end; the project write is in the project. As root and as the
/// plain user.
#[test]
fn live_shell_writes_outside_the_project_land_in_the_layer() {
    common::require_fuse_root();
    outside_writes_stay_in_the_layer(writing_around());
}

#[test]
fn live_shell_writes_outside_the_project_land_in_the_layer_as_plain_user() {
    common::require_fuse_root();
    outside_writes_stay_in_the_layer(writing_around().run_by_plain_user());
}

/// (`$HOME/sub`: as a plain user, a home with mounts below it — the state directory's
/// branches — is split into its subdirectories, each writable into the layer; the home
/// itself stays read-only.)
fn writing_around() -> Chat {
    let chat = Chat::new(|body: &Value| {
        match (last_real_user(body).as_str(), tool_results_since_user(body)) {
            ("write around", 0) => Reply::tool(
                "shell",
                json!({"command": "echo leak > \"$HOME/sub/leak.txt\" && echo in > inside.txt"}),
            ),
            ("write around", _) => Reply::text("Wrote."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    std::fs::create_dir(chat.project.parent().unwrap().join("sub")).unwrap();
    chat
}

fn outside_writes_stay_in_the_layer(chat: Chat) {
    let home = chat.project.parent().unwrap().to_path_buf();
    let tty = chat.start(ARGS);
    tty.say("write around");
    tty.wait_text("Wrote.", 60);
    let screen = tty.wait_text("in the session's layer, not on the host", 60);
    assert!(screen.contains("leak.txt"), "{screen}");
    wait_prompt(&tty);
    assert_eq!(read(&chat, "inside.txt"), "in\n");
    assert!(
        !home.join("sub/leak.txt").exists(),
        "the command wrote into the host's home"
    );
    tty.say("/changes");
    tty.wait_text("outside the project:", 60);
    wait_prompt(&tty);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    assert!(tty
        .history()
        .contains("dropped with the session, never written to the host"));
    assert!(!home.join("sub/leak.txt").exists());
    chat.assert_nothing_left();
}

/// A user edit made while a tool call ran, on the path the call changed: the accept is
/// refused, nothing is written (the user's edit stays), the branch keeps the agent's edit
/// pending, the user sees one line and the model a note in the tool result; `/diff` shows
/// the agent's version, `/abort` drops it.
#[test]
fn live_accept_conflicting_with_a_user_edit_keeps_both() {
    common::require_fuse_root();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let chat = Chat::new(move |body: &Value| {
        match (last_real_user(body).as_str(), tool_results_since_user(body)) {
            // Edit a.txt in the branch, then wait until the test has edited it in the
            // project (it answers on the socket).
            ("edit a", 0) => Reply::tool(
                "shell",
                json!({"command": format!(
                    "echo agent > a.txt && exec 3<>/dev/tcp/127.0.0.1/{port} && echo ready >&3 && read -r go <&3 && echo done"
                )}),
            ),
            ("edit a", _) => Reply::text("Edited."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    std::fs::write(chat.project.join("a.txt"), "base\n").unwrap();
    let project = chat.project.clone();
    let user = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        std::fs::write(project.join("a.txt"), "user\n").unwrap();
        (&conn).write_all(b"go\n").unwrap();
    });
    let tty = chat.start(ARGS);
    tty.say("edit a");
    tty.wait_text("Edited.", 60);
    user.join().unwrap();
    let screen = tty.wait_text("not accepted", 60);
    assert!(screen.contains("a.txt"), "{screen}");
    wait_prompt(&tty);
    assert_eq!(
        read(&chat, "a.txt"),
        "user\n",
        "the user's edit was overwritten"
    );
    assert_model_told_not_in_project(&chat);
    tty.say("/diff");
    tty.wait_text("+agent", 60);
    wait_prompt(&tty);
    tty.say("/abort");
    tty.wait_text("dropped 1 change", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "a.txt"), "user\n");
    tty.say("/changes");
    tty.wait_text("no changes in the branch", 60);
    wait_prompt(&tty);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// A live turn whose sandboxed shell plants `core.fsmonitor` in the project's git config
/// (which the user's next `git status` would run on the host) and stages a file: the
/// staging (index) and the file's edit go into the project, the config change is held in
/// the branch — the project's `.git/config` is unchanged, the screen names it, the model
/// is told — and only `/accept` (after `/diff` showed it) writes it.
#[test]
fn live_accept_holds_git_config_that_runs_code() {
    common::require_fuse_root();
    holds_git_config(false);
}

#[test]
fn live_accept_holds_git_config_that_runs_code_as_plain_user() {
    common::require_fuse_root();
    holds_git_config(true);
}

fn holds_git_config(plain: bool) {
    let chat = Chat::new(|body: &Value| {
        match (last_real_user(body).as_str(), tool_results_since_user(body)) {
            ("stage it", 0) => Reply::tool(
                "shell",
                json!({"command": "echo more >> README && git add README && git config core.fsmonitor 'touch /tmp/h10-pwned; false'"}),
            ),
            ("stage it", _) => Reply::text("Staged."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.email=a@b", "-c", "user.name=a"])
            .args(args)
            .current_dir(&chat.project)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q", "."]);
    git(&["add", "README"]);
    git(&["commit", "-qm", "init"]);
    let chat = if plain {
        chat.run_by_plain_user()
    } else {
        chat
    };
    let config = read(&chat, ".git/config");
    let index = std::fs::read(chat.project.join(".git/index")).unwrap();
    let tty = chat.start(ARGS);
    tty.say("stage it");
    tty.wait_text("Staged.", 60);
    let screen = tty.wait_text("held, not accepted", 60);
    assert!(screen.contains(".git/config"), "{screen}");
    wait_prompt(&tty);
    assert_eq!(
        read(&chat, ".git/config"),
        config,
        "the config was accepted live"
    );
    assert_eq!(read(&chat, "README"), "a project\nmore\n");
    assert_ne!(
        std::fs::read(chat.project.join(".git/index")).unwrap(),
        index,
        "the staging (index) was not accepted"
    );
    assert_model_told_not_in_project(&chat);
    tty.say("/diff");
    tty.wait_text("fsmonitor", 60);
    wait_prompt(&tty);
    assert!(!read(&chat, ".git/config").contains("fsmonitor"));
    tty.say("/accept");
    tty.wait_text("accepted 1 change", 60);
    wait_prompt(&tty);
    assert!(read(&chat, ".git/config").contains("fsmonitor = \"touch /tmp/h10-pwned; false\""));
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// Red team round 8, route 2: a live chat whose project is the home. One call appends a
/// socket to shade's own `[sandbox] allow_sockets` and a line to `.bashrc` and writes
/// `src/x.rs`: the code file goes in, the two are held — the host's files untouched, the
/// screen names them, the model is told — and `/accept` (after `/diff`) writes them.
#[test]
fn live_chat_in_the_home_holds_bashrc_and_shades_config() {
    common::require_fuse_root();
    holds_in_home(false);
}

#[test]
fn live_chat_in_the_home_holds_bashrc_and_shades_config_as_plain_user() {
    common::require_fuse_root();
    holds_in_home(true);
}

fn holds_in_home(plain: bool) {
    let chat = Chat::new(|body: &Value| {
        match (last_real_user(body).as_str(), tool_results_since_user(body)) {
            ("set up", 0) => Reply::tool(
                "shell",
                json!({"command": "printf '[sandbox]\\nallow_sockets = [\"/run/x.sock\"]\\n' >> .config/shade/config.toml; echo 'echo PWNED' >> .bashrc; mkdir -p src && echo 'pub fn x() {}' > src/x.rs"}),
            ),
            ("set up", _) => Reply::text("Set up."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    std::fs::create_dir_all(chat.project.join(".config/shade")).unwrap();
    std::fs::write(chat.project.join(".config/shade/config.toml"), "# mine\n").unwrap();
    std::fs::write(chat.project.join(".bashrc"), "# rc\n").unwrap();
    let chat = if plain {
        chat.run_by_plain_user()
    } else {
        chat
    };
    let home = chat.project.display().to_string();
    let tty = chat.start_with(
        ARGS,
        &[
            ("HOME", home.clone()),
            ("XDG_CONFIG_HOME", format!("{home}/.config")),
        ],
    );
    tty.say("set up");
    tty.wait_text("Set up.", 60);
    let screen = tty.wait_text("held, not accepted", 60);
    assert!(screen.contains(".bashrc"), "{screen}");
    wait_prompt(&tty);
    assert_eq!(read(&chat, "src/x.rs"), "pub fn x() {}\n");
    assert_eq!(read(&chat, ".bashrc"), "# rc\n");
    // shade's config directory holds API keys: the branch hides it from the model's
    // commands as every credential path of the home, so the append failed outright.
    assert_eq!(read(&chat, ".config/shade/config.toml"), "# mine\n");
    assert_model_told_not_in_project(&chat);
    tty.say("/diff");
    tty.wait_text("PWNED", 60);
    wait_prompt(&tty);
    tty.say("/accept");
    tty.wait_text("accepted 1 change", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, ".bashrc"), "# rc\necho PWNED\n");
    assert_eq!(read(&chat, ".config/shade/config.toml"), "# mine\n");
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// The model was told (in a tool result) that a change is not in the project.
fn assert_model_told_not_in_project(chat: &Chat) {
    let results: Vec<String> = chat
        .llm
        .requests()
        .iter()
        .filter_map(last_tool_result)
        .collect();
    assert!(
        results.iter().any(|r| r.contains("NOT in the project")),
        "{results:?}"
    );
}

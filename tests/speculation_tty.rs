//! Speculation the way a person meets it: the real `shade chat` in a terminal, a slow local
//! model, a suggestion that edits a file and runs a test script that writes its output. The
//! speculation runs in a real branch (FUSE, root); accepting it must show the result with no
//! further model call, typing something else must leave nothing behind, a concurrent edit
//! must make accept refuse and run live, and a boundary must hand over to a live turn.
#![allow(clippy::unwrap_used)]

mod common;

use common::wait_until;

use std::path::Path;
use std::time::Duration;

use common::chat::{exchange, wait_ghost, wait_prompt, Chat};
use common::tty::Tty;
use serde_json::{json, Value};
use shade_testkit::{is_suggestion_request, last_real_user, tool_results_since_user, Reply};

const BUGGY: &str = "#!/bin/sh\n# add two numbers\necho $(( $1 - $2 ))\n";
const FIXED: &str = "#!/bin/sh\n# add two numbers\necho $(( $1 + $2 ))\n";
const TEST: &str = "#!/bin/sh\n[ \"$(./add.sh 2 3)\" = 5 ] && echo PASS || echo FAIL\n";

/// Slow on purpose: each model call takes a while, as a real one does.
const LATENCY: Duration = Duration::from_millis(300);

fn model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        // The suggestion computed from a finished speculation (the pipelined one).
        if shade_testkit::last_user(body).contains("The user just said") {
            return Reply::text("commit this");
        }
        let next = match user.as_str() {
            "what is wrong?" => "fix it and run the tests",
            "how do I use it?" => "check the docs",
            _ => "",
        };
        return Reply::text(next);
    }
    let step = tool_results_since_user(body);
    let reply = match (user.as_str(), step) {
        ("hello", _) => Reply::text("Hello."),
        ("what is wrong?", _) => Reply::text("add.sh subtracts instead of adding."),
        ("how do I use it?", _) => Reply::text("Run ./add.sh A B."),
        ("fix it and run the tests", 0) => Reply::tool(
            "edit",
            json!({"path": "add.sh", "old_string": "$1 - $2", "new_string": "$1 + $2"}),
        ),
        ("fix it and run the tests", 1) => Reply::tool(
            "shell",
            json!({"command": "./test.sh > result.txt; cat result.txt"}),
        ),
        ("fix it and run the tests", _) => Reply::text("Fixed add.sh; the test passes."),
        ("check the docs", 0) => Reply::tool("read_file", json!({"path": "README"})),
        ("check the docs", 1) => Reply::tool(
            "web_fetch",
            json!({"url": "https://docs.example.com/add", "prompt": "usage"}),
        ),
        ("check the docs", _) => Reply::text("The docs say: add.sh A B prints A+B."),
        ("commit this", _) => Reply::text("Committed."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    };
    reply.after(LATENCY)
}

fn setup() -> Chat {
    setup_with(model)
}

fn setup_with(router: fn(&Value) -> Reply) -> Chat {
    common::require_fuse_root();
    let chat = Chat::new(router);
    let p = &chat.project;
    std::fs::write(p.join("add.sh"), BUGGY).unwrap();
    std::fs::write(p.join("test.sh"), TEST).unwrap();
    for f in ["add.sh", "test.sh"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    chat
}

/// Two exchanges (the suggestion guard wants two model turns), the second one asked.
fn converse(chat: &Chat, second: &str, answer: &str) -> Tty {
    let tty = chat.start(&["--approval", "yolo"]);
    exchange(&tty, "hello", "Hello.");
    tty.say(second);
    tty.wait_text(answer, 60);
    tty
}

/// Requests the fake model served for `user`'s turn at `step`, by model.
fn served(chat: &Chat, user: &str, step: usize, model: &str) -> usize {
    chat.llm
        .requests()
        .iter()
        .filter(|r| {
            !is_suggestion_request(r)
                && last_real_user(r) == user
                && tool_results_since_user(r) == step
                && r["model"] == model
        })
        .count()
}

fn speculation_events(chat: &Chat) -> Vec<Value> {
    chat.telemetry()
        .into_iter()
        .filter(|e| e["event"] == "speculation")
        .collect()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn an_accepted_speculation_is_already_done_and_lands_in_the_real_tree() {
    let chat = setup();
    let tty = converse(&chat, "what is wrong?", "subtracts instead of adding");
    wait_ghost(&tty, "fix it and run the tests");
    // The speculation runs the whole turn in the background: edit, test script, answer.
    wait_until("the speculated answer", 60, || {
        served(&chat, "fix it and run the tests", 2, "fast-model") == 1
    });
    // …and then asks for the suggestion after it (the pipelined one).
    wait_until("the pipelined suggestion request", 60, || {
        chat.llm.requests().iter().any(|r| {
            is_suggestion_request(r) && last_real_user(r) == "fix it and run the tests"
                || shade_testkit::last_user(r).contains("The user just said")
        })
    });
    std::thread::sleep(Duration::from_millis(500));
    // Nothing has reached the real tree yet.
    assert_eq!(read(&chat.project.join("add.sh")), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
    let before = chat.llm.requests().len();
    // Accept: Enter on the shown suggestion.
    tty.keys(&["Enter"]);
    tty.wait_text("the test passes.", 60);
    tty.wait_text("speculated ahead: 2 changes written", 60);
    // The result was already there: no model call for the accepted turn.
    assert_eq!(
        served(&chat, "fix it and run the tests", 0, "main-model"),
        0,
        "the accepted turn was run again live"
    );
    let after: Vec<Value> = chat.llm.requests()[before..].to_vec();
    assert!(
        after
            .iter()
            .all(|r| is_suggestion_request(r) || last_real_user(r) != "fix it and run the tests"),
        "model calls after accept: {after:?}"
    );
    // The suggestion after it was computed by the speculation: it shows at once.
    wait_ghost(&tty, "commit this");
    // The tool lines render as for a live turn.
    let screen = tty.screen();
    assert!(screen.contains("✓"), "tool lines missing:\n{screen}");
    // The real tree has the edit and the script's output.
    assert_eq!(read(&chat.project.join("add.sh")), FIXED);
    assert_eq!(read(&chat.project.join("result.txt")), "PASS\n");
    wait_until("the accepted speculation's telemetry", 60, || {
        speculation_events(&chat)
            .iter()
            .any(|e| e["outcome"] == "accepted")
    });
    let ev = speculation_events(&chat);
    let accepted: Vec<&Value> = ev.iter().filter(|e| e["outcome"] == "accepted").collect();
    assert_eq!(accepted.len(), 1, "{ev:?}");
    assert_eq!(accepted[0]["files_written"], 2);
    assert_eq!(accepted[0]["tool_use_count"], 2);
    assert_eq!(accepted[0]["turns_used"], 3);
    assert!(accepted[0]["time_saved_ms"].is_number());
    assert_eq!(accepted[0]["had_pipelined_suggestion"], true);
    // Leaving ends the running speculation of the next suggestion too.
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    wait_until("branches to be gone", 60, || chat.branch_dirs() == 0);
    chat.assert_nothing_left();
}

#[test]
fn typing_something_else_drops_the_speculation_and_leaves_nothing() {
    let chat = setup();
    let tty = converse(&chat, "what is wrong?", "subtracts instead of adding");
    wait_ghost(&tty, "fix it and run the tests");
    // Let it get as far as running the script in its branch.
    wait_until("the speculative shell call", 60, || {
        served(&chat, "fix it and run the tests", 2, "fast-model") == 1
    });
    tty.say("never mind");
    tty.wait_text("You said: never mind", 60);
    assert_eq!(read(&chat.project.join("add.sh")), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
    wait_until("the aborted speculation's telemetry", 60, || {
        speculation_events(&chat)
            .iter()
            .any(|e| e["outcome"] == "aborted")
    });
    wait_until("the branch to be gone", 60, || {
        chat.other_branch_dirs() == 0
    });
    chat.assert_nothing_left_but_the_session();
    let names: Vec<String> = std::fs::read_dir(&chat.project)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["README", "add.sh", "test.sh"]);
}

#[test]
fn a_concurrent_edit_makes_accept_refuse_and_run_live() {
    let chat = setup();
    let tty = converse(&chat, "what is wrong?", "subtracts instead of adding");
    wait_ghost(&tty, "fix it and run the tests");
    wait_until("the speculated answer", 60, || {
        served(&chat, "fix it and run the tests", 2, "fast-model") == 1
    });
    std::thread::sleep(Duration::from_millis(800));
    // The user edits the same file meanwhile (outside shade).
    let edited = format!("{BUGGY}# edited by the user\n");
    std::fs::write(chat.project.join("add.sh"), &edited).unwrap();
    tty.keys(&["Enter"]);
    tty.wait_text("running live", 60);
    tty.wait_text("the test passes.", 60);
    // It ran live: the main model got the turn, and the live edit kept the user's line.
    assert!(served(&chat, "fix it and run the tests", 0, "main-model") >= 1);
    let now = read(&chat.project.join("add.sh"));
    assert!(
        now.contains("$1 + $2") && now.contains("edited by the user"),
        "{now}"
    );
    assert!(speculation_events(&chat)
        .iter()
        .any(|e| e["outcome"] == "failed"));
}

#[test]
fn a_boundary_mid_speculation_continues_live_from_where_it_stopped() {
    let chat = setup();
    let tty = converse(&chat, "how do I use it?", "Run ./add.sh A B.");
    wait_ghost(&tty, "check the docs");
    // The speculation reads README, then stops before web_fetch (it needs the network).
    wait_until("the speculative read", 60, || {
        served(&chat, "check the docs", 1, "fast-model") == 1
    });
    std::thread::sleep(Duration::from_millis(800));
    tty.keys(&["Enter"]);
    tty.wait_text("The docs say", 60);
    // The live turn went on from the boundary: its first main-model call already had the
    // read's result; the read was not made again.
    assert_eq!(served(&chat, "check the docs", 0, "main-model"), 0);
    assert!(served(&chat, "check the docs", 1, "main-model") >= 1);
    let ev = speculation_events(&chat);
    assert!(
        ev.iter()
            .any(|e| e["outcome"] == "accepted" && e["boundary_type"] == "web_fetch"),
        "{ev:?}"
    );
    // Closing the terminal (SIGHUP) ends the session cleanly: no branch is left.
    drop(tty);
    wait_until("branches to be gone after SIGHUP", 60, || {
        chat.branch_dirs() == 0
    });
    chat.assert_nothing_left();
}

#[test]
fn a_shadow_session_keeps_edits_in_its_branch_until_accept() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        let user = last_real_user(body);
        if is_suggestion_request(body) {
            return Reply::text("");
        }
        let name = match user.as_str() {
            "make a note" => "NOTE.md",
            "make another" => "OTHER.md",
            other => return Reply::text(&format!("You said: {other}")),
        };
        if tool_results_since_user(body) == 0 {
            Reply::tool("write_file", json!({"path": name, "content": "hi\n"}))
        } else {
            Reply::text(&format!("Wrote {name}."))
        }
    });
    let tty = chat.start(&["--shadow", "--approval", "yolo"]);
    exchange(&tty, "make a note", "Wrote NOTE.md.");
    assert!(
        !chat.project.join("NOTE.md").exists(),
        "the edit escaped the branch"
    );
    tty.say("/diff");
    tty.wait_text("A NOTE.md", 60);
    tty.wait_text("+hi", 60);
    wait_prompt(&tty);
    exchange(&tty, "/accept", "accepted 1 change");
    assert_eq!(read(&chat.project.join("NOTE.md")), "hi\n");
    // The session goes on in a fresh branch; /abort drops what it did.
    exchange(&tty, "make another", "Wrote OTHER.md.");
    tty.say("/abort");
    tty.wait_text("dropped 1 change", 60);
    assert!(!chat.project.join("OTHER.md").exists());
    // Ctrl-D is a key only once the prompt reads keys again (before, it is the terminal's EOF).
    wait_prompt(&tty);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// The model of a `--shadow` session: a live turn fixes add.sh (in the session's branch),
/// the suggestion after it runs the test script, which reads that edit.
fn shadow_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        let next = match user.as_str() {
            "fix add.sh" => "run the tests",
            _ => "",
        };
        return Reply::text(next);
    }
    let step = tool_results_since_user(body);
    let reply = match (user.as_str(), step) {
        ("hello", _) => Reply::text("Hello."),
        ("fix add.sh", 0) => Reply::tool(
            "edit",
            json!({"path": "add.sh", "old_string": "$1 - $2", "new_string": "$1 + $2"}),
        ),
        ("fix add.sh", _) => Reply::text("Fixed add.sh."),
        ("run the tests", 0) => Reply::tool(
            "shell",
            json!({"command": "./test.sh > result.txt; cat result.txt"}),
        ),
        ("run the tests", _) => Reply::text("The test script ran."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    };
    reply.after(LATENCY)
}

/// A `--shadow` session whose live turn fixed add.sh in its branch, with the suggestion
/// "run the tests" shown (its speculation starting).
fn shadow_session_suggesting(chat: &Chat) -> Tty {
    let tty = chat.start(&["--shadow", "--approval", "yolo"]);
    exchange(&tty, "hello", "Hello.");
    tty.say("fix add.sh");
    tty.wait_text("Fixed add.sh.", 60);
    wait_ghost(&tty, "run the tests");
    tty
}

/// [`shadow_session_suggesting`], with the speculation run to the end.
fn shadow_session_speculated(chat: &Chat) -> Tty {
    let tty = shadow_session_suggesting(chat);
    wait_until("the speculated answer", 60, || {
        served(chat, "run the tests", 1, "fast-model") == 1
    });
    tty
}

#[test]
fn a_shadow_session_speculates_on_its_branch_and_accept_lands_there() {
    let chat = setup_with(shadow_model);
    let tty = shadow_session_speculated(&chat);
    // The speculation ran the script on the session's fix: its result is PASS. The model
    // saw it in the shell tool's result.
    wait_until("the speculated answer", 60, || {
        chat.llm.requests().iter().any(|r| {
            last_real_user(r) == "run the tests"
                && tool_results_since_user(r) == 1
                && r.to_string().contains("PASS")
        })
    });
    // Nothing reached the project: neither the live fix nor the script's output.
    assert_eq!(read(&chat.project.join("add.sh")), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
    tty.keys(&["Enter"]);
    tty.wait_text("The test script ran.", 60);
    tty.wait_text("1 change written into the session's branch", 60);
    assert_eq!(
        served(&chat, "run the tests", 0, "main-model"),
        0,
        "the accepted turn was run again live"
    );
    // Still only in the branch.
    assert_eq!(read(&chat.project.join("add.sh")), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
    wait_prompt(&tty);
    tty.say("/diff");
    tty.wait_text("A result.txt", 60);
    tty.wait_text("M add.sh", 60);
    tty.wait_text("+PASS", 60);
    let screen = tty.screen();
    assert!(
        !screen.contains(".shade-"),
        "accept scratch in the diff:\n{screen}"
    );
    wait_prompt(&tty);
    exchange(&tty, "/accept", "accepted 2 changes");
    assert_eq!(read(&chat.project.join("add.sh")), FIXED);
    assert_eq!(read(&chat.project.join("result.txt")), "PASS\n");
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

#[test]
fn a_shadow_session_drops_a_speculation_it_does_not_take() {
    let chat = setup_with(shadow_model);
    let tty = shadow_session_speculated(&chat);
    tty.say("never mind");
    tty.wait_text("You said: never mind", 60);
    wait_until("the aborted speculation's telemetry", 60, || {
        speculation_events(&chat)
            .iter()
            .any(|e| e["outcome"] == "aborted")
    });
    // Only the session's own branch is left mounted.
    wait_until("the speculation's branch to be gone", 60, || {
        chat.branch_dirs() == 1
    });
    assert_eq!(
        chat.mounts(),
        1,
        "{}",
        std::fs::read_to_string("/proc/mounts").unwrap()
    );
    wait_prompt(&tty);
    tty.say("/diff");
    tty.wait_text("M add.sh", 60);
    let screen = tty.screen();
    assert!(!screen.contains("result.txt"), "{screen}");
    wait_prompt(&tty);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
    assert_eq!(read(&chat.project.join("add.sh")), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
}

#[test]
fn a_shadow_session_refuses_a_speculation_whose_base_changed_and_runs_live() {
    let chat = setup_with(shadow_model);
    let tty = shadow_session_speculated(&chat);
    std::thread::sleep(Duration::from_millis(800));
    // Meanwhile the user makes result.txt in the project: it shows through the session's
    // branch, under the file the speculation created.
    std::fs::write(chat.project.join("result.txt"), "mine\n").unwrap();
    tty.keys(&["Enter"]);
    tty.wait_text("running live", 60);
    tty.wait_text("result.txt: created meanwhile", 60);
    tty.wait_text("The test script ran.", 60);
    assert!(served(&chat, "run the tests", 0, "main-model") >= 1);
    // The live turn ran in the session's branch: the project keeps the user's file.
    assert_eq!(read(&chat.project.join("result.txt")), "mine\n");
    assert_eq!(read(&chat.project.join("add.sh")), BUGGY);
    assert!(speculation_events(&chat)
        .iter()
        .any(|e| e["outcome"] == "failed"));
    wait_prompt(&tty);
    tty.say("/diff");
    tty.wait_text("M result.txt", 60);
    tty.wait_text("+PASS", 60);
    wait_prompt(&tty);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

#[test]
fn accepting_a_shadow_session_drops_its_speculation_first() {
    let chat = setup_with(shadow_model);
    let tty = shadow_session_suggesting(&chat);
    // The speculation has its branch (it asked the model for its first step).
    wait_until("the speculation's first call", 60, || {
        served(&chat, "run the tests", 0, "fast-model") == 1
    });
    exchange(&tty, "/accept", "accepted 1 change");
    assert_eq!(read(&chat.project.join("add.sh")), FIXED);
    assert!(!chat.project.join("result.txt").exists());
    // Only the session's fresh branch is left.
    assert_eq!(chat.branch_dirs(), 1);
    assert_eq!(chat.mounts(), 1);
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// What a prompt-injected model would run in a speculation: every route out of a branch
/// shade's sandbox closes (issue 18), for a suggestion that is only shown.
const ESCAPE: &str = r#"P=$PWD; for p in /proc/[0-9]*; do echo X > $p/root$P/README; done 2>/dev/null; for t in $PPID 1; do nsenter -t $t -m -- sh -c "echo X > $P/README"; nsenter -t $t -n -- true && echo net > $P/net; done 2>/dev/null; mount -o remount,rw,bind / 2>/dev/null; umount -l $P 2>/dev/null; echo X > $P/README; touch /var/tmp/shade-speculation-escape $HOME/shade-speculation-escape 2>/dev/null; echo attempted"#;

fn escape_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        return Reply::text(if user == "what is wrong?" {
            "clean up"
        } else {
            ""
        });
    }
    let reply = match (user.as_str(), tool_results_since_user(body)) {
        ("hello", _) => Reply::text("Hello."),
        ("what is wrong?", _) => Reply::text("Nothing is wrong."),
        ("clean up", 0) => Reply::tool("shell", json!({ "command": ESCAPE })),
        ("clean up", _) => Reply::text("Cleaned up."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    };
    reply.after(LATENCY)
}

#[test]
fn a_shown_suggestions_speculation_cannot_get_out_of_its_branch() {
    shown_speculation_stays_in(setup_with(escape_model));
}

/// The same attacks with shade run by a plain user (no root anywhere).
#[test]
fn a_shown_suggestions_speculation_cannot_get_out_as_a_plain_user() {
    shown_speculation_stays_in(setup_with(escape_model).run_by_plain_user());
}

fn shown_speculation_stays_in(chat: Chat) {
    let outside = Path::new("/var/tmp/shade-speculation-escape");
    let _ = std::fs::remove_file(outside);
    let home_file = chat
        .project
        .parent()
        .unwrap()
        .join("shade-speculation-escape");
    let tty = converse(&chat, "what is wrong?", "Nothing is wrong.");
    wait_ghost(&tty, "clean up");
    // The speculation ran the command and gave the model its output.
    wait_until("the speculated command's result", 60, || {
        served(&chat, "clean up", 1, "fast-model") == 1
    });
    assert_eq!(read(&chat.project.join("README")), "a project\n");
    assert!(!chat.project.join("net").exists());
    assert!(!outside.exists(), "the speculation wrote /var/tmp");
    assert!(!home_file.exists(), "the speculation wrote $HOME");
    if chat.plain {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(&chat.state).unwrap().uid();
        assert_eq!(
            owner,
            common::plain::ids().0,
            "shade did not run as the plain user"
        );
    }
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    assert_eq!(read(&chat.project.join("README")), "a project\n");
    assert_eq!(chat.mounts(), 0);
}

/// What a speculated command prints: its environment, a key and shade's config (issue 28:
/// secrets stay home).
const SECRETS_PROBE: &str = "env; cat ~/.ssh/id_x; echo key=$?; \
                             cat \"$XDG_CONFIG_HOME/shade/config.toml\"; echo config=$?";

fn secrets_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        return Reply::text(if user == "what is wrong?" {
            "show the environment"
        } else {
            ""
        });
    }
    let reply = match (user.as_str(), tool_results_since_user(body)) {
        ("hello", _) => Reply::text("Hello."),
        ("what is wrong?", _) => Reply::text("Nothing is wrong."),
        ("show the environment", 0) => Reply::tool("shell", json!({ "command": SECRETS_PROBE })),
        ("show the environment", _) => Reply::text("Shown."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    };
    reply.after(LATENCY)
}

/// A shown suggestion's speculation gets no secret of shade's environment, no shade
/// variable and no credential file of the home, but PATH, HOME and what `pass_env` passes.
fn speculation_gets_no_secrets(plain: bool) {
    let chat = setup_with(secrets_model);
    let home = chat.project.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_x"), "KEYDATA-spec-4c1f\n").unwrap();
    std::fs::create_dir_all(home.join("config/shade")).unwrap();
    std::fs::write(
        home.join("config/shade/config.toml"),
        "# CONFIG-MARK-spec\n[sandbox]\npass_env = [\"PASSED_TOKEN\"]\n",
    )
    .unwrap();
    let chat = if plain {
        chat.run_by_plain_user()
    } else {
        chat
    };
    let secrets: [(&'static str, String); 5] = [
        ("GITHUB_TOKEN", "leak-spec-gh".into()),
        ("AWS_SECRET_ACCESS_KEY", "leak-spec-aws".into()),
        ("MY_API_KEY", "leak-spec-my".into()),
        ("SHADE_MCP_TOKEN", "leak-spec-mcp".into()),
        ("PASSED_TOKEN", "passed-spec".into()),
    ];
    let tty = chat.start_with(&["--approval", "yolo"], &secrets);
    exchange(&tty, "hello", "Hello.");
    tty.say("what is wrong?");
    tty.wait_text("Nothing is wrong.", 60);
    wait_ghost(&tty, "show the environment");
    wait_until("the speculated command's result", 60, || {
        served(&chat, "show the environment", 1, "fast-model") == 1
    });
    let seen = chat
        .llm
        .requests()
        .iter()
        .filter(|r| last_real_user(r) == "show the environment")
        .find_map(shade_testkit::last_tool_result)
        .unwrap();
    for (name, value) in &secrets[..4] {
        assert!(
            !seen.contains(value.as_str()) && !seen.contains(&format!("{name}=")),
            "{name} reached the speculated command:\n{seen}"
        );
    }
    for own in [
        "SHADE_MODEL=",
        "SHADE_STATE_DIR=",
        "OPENAI_API_KEY=",
        "test-key",
    ] {
        assert!(!seen.contains(own), "{own} reached it:\n{seen}");
    }
    assert!(seen.contains("PATH=") && seen.contains("HOME="), "{seen}");
    assert!(seen.contains("PASSED_TOKEN=passed-spec"), "{seen}");
    assert!(
        !seen.contains("KEYDATA-spec") && seen.contains("key=1"),
        "{seen}"
    );
    assert!(
        !seen.contains("CONFIG-MARK-spec") && seen.contains("config=1"),
        "{seen}"
    );
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    assert_eq!(chat.mounts(), 0);
}

#[test]
fn a_speculated_command_gets_no_secrets() {
    speculation_gets_no_secrets(false);
}

#[test]
fn a_speculated_command_gets_no_secrets_as_a_plain_user() {
    speculation_gets_no_secrets(true);
}

/// A suggestion whose command writes the home and reads it back (a tool filling its cache).
fn home_writing_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        let next = match user.as_str() {
            "what is wrong?" => "warm the cache",
            _ => "",
        };
        return Reply::text(next);
    }
    match (user.as_str(), tool_results_since_user(body)) {
        ("hello", _) => Reply::text("Hello."),
        ("what is wrong?", _) => Reply::text("The cache is cold."),
        ("warm the cache", 0) => Reply::tool(
            "shell",
            json!({"command": "mkdir -p ~/.cache/probe && echo warm > ~/.cache/probe/v; echo status-$?; cat ~/.cache/probe/v"}),
        ),
        ("warm the cache", _) => Reply::text("The cache is warm."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    }
    .after(LATENCY)
}

#[test]
fn a_speculated_command_writing_the_home_gets_the_live_result_and_the_host_home_stays() {
    let chat = setup_with(home_writing_model);
    // A home outside /tmp (a speculation's /tmp is private: a write there proves nothing).
    let home_dir = tempfile::Builder::new()
        .prefix("shade-spec-home-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let home = home_dir.path().to_path_buf();
    let tty = chat.start_with(
        &["--approval", "yolo"],
        &[("HOME", home.display().to_string())],
    );
    exchange(&tty, "hello", "Hello.");
    tty.say("what is wrong?");
    tty.wait_text("The cache is cold.", 60);
    wait_ghost(&tty, "warm the cache");
    wait_until("the speculated answer", 60, || {
        served(&chat, "warm the cache", 1, "fast-model") == 1
    });
    // The speculated command saw its own write, as it would live (a read-only home made it
    // fail with EROFS, and accepting handed the user that wrong result).
    let result = chat
        .llm
        .requests()
        .iter()
        .filter(|r| last_real_user(r) == "warm the cache" && tool_results_since_user(r) == 1)
        .find_map(shade_testkit::last_tool_result)
        .unwrap();
    assert!(result.contains("status-0"), "{result}");
    assert!(result.contains("warm"), "{result}");
    assert!(
        !home.join(".cache/probe").exists(),
        "the speculation wrote the host's home"
    );
    tty.keys(&["Enter"]);
    tty.wait_text("The cache is warm.", 60);
    wait_until("the note on the dropped home writes", 60, || {
        tty.history().contains(
            "shade: not written (outside the project: ~/.cache added, ~/.cache/probe added, \
             ~/.cache/probe/v added): an accepted speculation writes the project only",
        )
    });
    assert_eq!(
        served(&chat, "warm the cache", 0, "main-model"),
        0,
        "the accepted turn was run again live"
    );
    assert!(
        !home.join(".cache/probe").exists(),
        "accept wrote the host's home"
    );
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

/// What the session's branch servers logged.
fn server_logs(chat: &Chat) -> String {
    std::fs::read_dir(chat.state.join("servers"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect()
}

/// Speculation on the project gets its branch from the project's branch server (issue 31:
/// a warm connection, not a fresh mount), and everything else stays: nothing reaches the
/// tree until the suggestion is taken, the accept lands it, typing something else drops
/// the next one.
#[test]
fn a_speculation_is_served_by_the_branch_server() {
    let chat = setup();
    let tty = chat.start_with(
        &["--approval", "yolo"],
        &[("SHADE_LOG", "warn,shade::branch_server=info".into())],
    );
    exchange(&tty, "hello", "Hello.");
    tty.say("what is wrong?");
    tty.wait_text("subtracts instead of adding", 60);
    wait_ghost(&tty, "fix it and run the tests");
    wait_until("the speculated answer", 60, || {
        served(&chat, "fix it and run the tests", 2, "fast-model") == 1
    });
    wait_until("the pipelined suggestion request", 60, || {
        chat.llm.requests().iter().any(|r| {
            is_suggestion_request(r) && last_real_user(r) == "fix it and run the tests"
                || shade_testkit::last_user(r).contains("The user just said")
        })
    });
    std::thread::sleep(Duration::from_millis(500));
    let logs = server_logs(&chat);
    assert!(logs.contains("served a branch"), "not served: {logs}");
    assert_eq!(read(&chat.project.join("add.sh")), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
    tty.keys(&["Enter"]);
    tty.wait_text("speculated ahead: 2 changes written", 60);
    assert_eq!(read(&chat.project.join("add.sh")), FIXED);
    assert_eq!(read(&chat.project.join("result.txt")), "PASS\n");
    // The next suggestion's speculation runs in a served branch too; a new input drops it.
    wait_ghost(&tty, "commit this");
    tty.say("never mind");
    tty.wait_text("You said: never mind", 60);
    assert_eq!(read(&chat.project.join("result.txt")), "PASS\n");
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
    common::stop_branch_servers(&chat.state);
    assert_eq!(chat.mounts(), 0);
}

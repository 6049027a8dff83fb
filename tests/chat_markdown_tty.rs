//! The model's Markdown in a real terminal (tmux): `shade chat` streams an answer word by
//! word and the screen ends up showing it rendered — no `**` or fences, bullets, bold and
//! code styles — while the same answer without a terminal, or with NO_COLOR, is the raw text.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::chat::{exchange, wait_prompt, Chat};
use serde_json::Value;
use shade_testkit::{last_real_user, Reply};

/// An answer line that wraps onto three rows of the 120-column terminal while it streams.
const LONG: &str = "A long line: **wrapped** text and **wrapped** text and **wrapped** text and \
**wrapped** text and **wrapped** text and **wrapped** text and **wrapped** text and \
**wrapped** text and **wrapped** text and **wrapped** text and **wrapped** text and \
**wrapped** text and **wrapped** text and **wrapped** text and the end.";

fn answer() -> String {
    ANSWER.replace("{LONG}", LONG)
}

const ANSWER: &str = "## Plan

I'll fix the **parser** in `src/lib.rs` first. See [the docs](https://docs.rs/x).

- first item
- second *item*

{LONG}

```rust
let total = a ** b; // **kept**
```

Done.";

fn router(body: &Value) -> Reply {
    match last_real_user(body).as_str() {
        "explain" => Reply::text(&answer()).streamed_every(Duration::from_millis(20)),
        "escape" => Reply::text("\x1b[2J\x1b[H fake: shade accepted 3 changes"),
        other => Reply::text(&format!("You said: {other}")),
    }
}

fn without_styles(row: &str) -> String {
    let mut out = String::new();
    let mut escape = false;
    for c in row.chars() {
        match (escape, c) {
            (false, '\x1b') => escape = true,
            (false, c) => out.push(c),
            (true, 'm') => escape = false,
            (true, _) => {}
        }
    }
    out
}

/// The screen row showing `text`, with its styles.
fn styled_row(styled: &str, text: &str) -> String {
    styled
        .lines()
        .find(|l| without_styles(l).contains(text))
        .unwrap_or_else(|| panic!("no row shows {text:?}:\n{styled}"))
        .to_string()
}

#[test]
fn a_streamed_answer_is_rendered_on_the_terminal() {
    let chat = Chat::new(router);
    let tty = chat.start(&["--no-suggest", "--no-speculate"]);
    tty.say("explain");
    tty.wait_text("Done.", 60);
    let screen = wait_prompt(&tty);
    let answer: String = screen
        .lines()
        .skip_while(|l| !l.contains("explain"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        answer
            .contains("I'll fix the parser in src/lib.rs first. See the docs (https://docs.rs/x)."),
        "{screen}"
    );
    assert!(
        answer.contains("\nPlan\n"),
        "the heading keeps its #: {screen}"
    );
    assert!(answer.contains("• first item\n• second item"), "{screen}");
    // The code is exactly as written, its fences gone.
    assert!(
        answer.contains("\nlet total = a ** b; // **kept**"),
        "{screen}"
    );
    assert!(
        !answer.contains("```") && !answer.contains("**parser"),
        "{screen}"
    );

    // The wrapped line was redrawn in place: once, rendered, no raw copy left above it.
    let history = tty.history();
    let rendered = LONG.replace("**", "");
    assert_eq!(history.matches(&rendered).count(), 1, "{history}");
    assert!(!history.contains("**wrapped**"), "{history}");

    let styled = tty.screen_styled();
    let row = styled_row(&styled, "I'll fix the");
    assert!(row.contains("\x1b[1mparser"), "parser is not bold: {row:?}");
    assert!(
        row.contains("\x1b[36msrc/lib.rs"),
        "no code colour: {row:?}"
    );
    let heading = styled_row(&styled, "Plan");
    assert!(heading.contains("\x1b[1m"), "heading not bold: {heading:?}");
    let code = styled_row(&styled, "let total");
    assert!(
        code.contains("48;5;236"),
        "the code block has no background: {code:?}"
    );
    // Syntax colours: the keyword and the comment differ from the rest.
    let colours: std::collections::HashSet<&str> = code
        .split("38;5;")
        .skip(1)
        .map(|p| p.split(|c: char| !c.is_ascii_digit()).next().unwrap_or(""))
        .collect();
    assert!(colours.len() >= 3, "the code is not highlighted: {code:?}");
}

#[test]
fn no_color_keeps_the_raw_text_on_the_terminal() {
    let chat = Chat::new(router);
    let tty = chat.start_with(
        &["--no-suggest", "--no-speculate"],
        &[("NO_COLOR", "1".into())],
    );
    tty.say("explain");
    tty.wait_text("Done.", 60);
    let screen = wait_prompt(&tty);
    assert!(
        screen.contains("I'll fix the **parser** in `src/lib.rs`"),
        "{screen}"
    );
    assert!(
        screen.contains("```rust") && screen.contains("- first item"),
        "{screen}"
    );
}

#[test]
fn without_a_terminal_the_answer_is_the_raw_text() {
    let chat = Chat::new(router);
    let mut child = Command::new(env!("CARGO_BIN_EXE_shade"))
        .args(["chat", "--no-suggest"])
        .current_dir(&chat.project)
        .envs(chat.env())
        .env("TERM", "xterm-256color")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"explain\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout, format!("{}\n", answer()));
}

/// `shade exec` on a terminal renders the same way; with TERM=dumb it prints the raw text.
#[test]
fn exec_renders_on_a_terminal_unless_it_is_dumb() {
    let chat = Chat::new(router);
    let bin = env!("CARGO_BIN_EXE_shade");
    let tty = common::tty::Tty::start(&[bin, "exec", "explain"], &chat.project, &chat.env());
    let screen = tty.wait_text("Done.", 60);
    assert!(
        screen.contains("• first item") && !screen.contains("**parser"),
        "{screen}"
    );
    assert!(
        styled_row(&tty.screen_styled(), "I'll fix the").contains("\x1b[1mparser"),
        "{}",
        tty.screen_styled()
    );

    // (tmux sets TERM for the programs it starts: say it on the command line.)
    let argv = ["env", "TERM=dumb", bin, "exec", "explain"];
    let dumb = common::tty::Tty::start(&argv, &chat.project, &chat.env());
    let screen = dumb.wait_text("Done.", 60);
    assert!(
        screen.contains("I'll fix the **parser** in `src/lib.rs`") && screen.contains("```rust"),
        "{screen}"
    );
}

/// A model's escape sequences are shown, not obeyed: an answer that starts with "clear the
/// screen, cursor home" leaves the earlier turn on screen and shows the escapes as `^[`.
#[test]
fn a_models_escape_sequences_do_not_rewrite_the_screen() {
    let chat = Chat::new(router);
    let tty = chat.start(&["--no-suggest", "--no-speculate"]);
    exchange(&tty, "earlier", "You said: earlier");
    tty.say("escape");
    tty.wait_text("fake: shade accepted", 60);
    let screen = wait_prompt(&tty);
    assert!(screen.contains("You said: earlier"), "{screen}");
    assert!(
        screen.contains("^[[2J^[[H fake: shade accepted 3 changes"),
        "{screen}"
    );
}

//! `shade chat`: the interactive agent. A line editor (reedline) with history, multi-line input
//! and slash commands; answers stream as they arrive; after each answer the user's likely next
//! input appears as ghost text (prompt suggestions). Without a terminal it reads prompts line
//! by line from stdin, one turn each, sharing one conversation.

mod approve;
mod commands;
mod echo;
mod editor;
mod interactive;
mod script;
mod session;
mod speculate;
mod view;

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use shade_agent::approval::ApprovalMode;

use crate::exit;

#[derive(Args)]
#[command(after_help = "\
Keys: Enter submits, Alt-Enter (or a line ending in \\) continues on a new line, Ctrl-C \
cancels a running turn (twice on an empty line exits), Ctrl-D exits. When a suggestion is \
shown as dim text: Tab or Right fills it in, Enter submits it, typing dismisses it. \
@path attaches a file (Tab completes it); !command runs a shell command of your own. When the agent asks (edits, writing commands outside yolo): y yes, n no, a always for that tool this session, Ctrl-C cancels the turn. An accepted suggestion that would have asked asks once with its changeset: y writes it, n drops it and runs nothing.

Conversations are saved after every turn: --continue picks up the latest, --resume ID a \
given one, --sessions lists them.

Slash commands: /help, /model [NAME], /model --fast [NAME], /approval [MODE], /compact, \
/clear, /stats, /undo [N] (the last N turns), /changes, /diff, /accept, /abort, /exit.

Settings (config file, see `shade exec --help`): enable_followup_suggestions, \
enable_cache_sharing, fast_model, telemetry, context_window, compact_threshold.")]
pub struct ChatArgs {
    /// What may run without asking: default, auto-edit, yolo, plan.
    #[arg(long, default_value = "default", value_parser = parse_mode)]
    pub approval: ApprovalMode,
    /// Provider and models.
    #[command(flatten)]
    pub llm: crate::llm_setup::LlmChoice,
    /// Do not suggest the next input.
    #[arg(long)]
    pub no_suggest: bool,
    /// Work in a branch of the project: edits and commands land there; /diff shows them,
    /// /accept writes them into the project, /abort drops them.
    #[arg(long)]
    pub shadow: bool,
    /// UNCONFINED: the old way — tools write straight into the project and commands run
    /// directly on the host, outside any sandbox; what commands change cannot be undone.
    /// (By default each tool call runs in a branch and is accepted into the project right
    /// after, so `/undo` takes turns back and commands run in the branch's sandbox.)
    #[arg(long, conflicts_with = "shadow")]
    pub unconfined: bool,
    /// Do not run a shown suggestion ahead in a branch.
    #[arg(long)]
    pub no_speculate: bool,
    /// Model calls per turn at most.
    #[arg(long, default_value_t = 50)]
    pub max_turns: u32,
    /// Project directory (default: the current directory).
    #[arg(short = 'C', long = "directory", value_name = "DIR")]
    pub directory: Option<PathBuf>,
    /// Pick up this project's most recent conversation where it ended.
    #[arg(short = 'c', long = "continue", conflicts_with = "resume")]
    pub continue_last: bool,
    /// Pick up a saved conversation of this project by its id (or the start of it).
    #[arg(long, value_name = "ID")]
    pub resume: Option<String>,
    /// List this project's saved conversations (newest first) and exit.
    #[arg(long, conflicts_with_all = ["continue_last", "resume"])]
    pub sessions: bool,
}

fn parse_mode(s: &str) -> Result<ApprovalMode, String> {
    s.parse()
}

pub fn main(args: ChatArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return exit::fail(&anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    if args.sessions {
        return list_sessions(&args);
    }
    shade_agent::housekeeping::tidy(
        shade_fusefs::StateDir::from_env().root(),
        std::time::SystemTime::now(),
    );
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let session = match session::Session::new(&args, interactive, runtime.handle().clone()) {
        Ok(s) => s,
        Err(e) => return exit::fail(&e),
    };
    if interactive {
        interactive::run(session, &runtime)
    } else {
        script::run(session, &runtime)
    }
}

/// `--sessions`: one line per saved conversation of the project.
fn list_sessions(args: &ChatArgs) -> i32 {
    let project = match session::project_dir(args) {
        Ok(p) => p,
        Err(e) => return exit::fail(&e),
    };
    let saved = session::store().list(&project);
    if saved.is_empty() {
        println!("no saved conversations for {}", project.display());
    }
    for s in saved {
        let when = chrono::DateTime::from_timestamp_millis(s.updated as i64)
            .map(|t| {
                t.with_timezone(&chrono::Local)
                    .format("%Y-%m-%d %H:%M")
                    .to_string()
            })
            .unwrap_or_default();
        let prompts = s.user_prompts().count();
        println!(
            "{}  {when}  {}{}  {}",
            s.id,
            shade_agent::tools::text::plural(prompts, "prompt"),
            if s.shadow { ", shadow" } else { "" },
            s.title()
        );
    }
    0
}

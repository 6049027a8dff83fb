//! The system prompt. It is the first part of every request's prefix, so it is built once
//! per session and never varies between turns (provider prefix caches hit).

use crate::instructions;
use crate::tools::{memory, ToolContext};

const BASE: &str = "You are shade, a coding agent working in a software project on the user's \
machine. You act through tools; all paths are relative to the workspace root.

Guidelines:
- Read before you edit: use read_file, grep, glob and ls to understand the code first.
- Edit with `edit` (exact replacement; copy old_string from what you read, whitespace included) \
or `write_file` for new files. Keep changes minimal and in the project's style.
- Run commands with `shell` to build, test and check your work; report failures honestly.
- For multi-step work keep a todo list with todo_write.
- If a tool call is refused, do not retry it; explain what you would have done.
- Be concise. When done, say what you changed and how you verified it.";

/// The system prompt for a session in `ctx`'s workspace: the guidelines, where and when it
/// runs, the project's instruction files (`AGENTS.md` and kin) and saved memories.
pub fn system_prompt(ctx: &ToolContext) -> String {
    let mut prompt = BASE.to_string();
    prompt.push_str(&environment(ctx));
    prompt.push_str(&instructions::render(&instructions::load(ctx)));
    let memories = memory::load_memories(ctx);
    if !memories.is_empty() {
        prompt.push_str(&format!(
            "\n\nSaved memories (from the memory tool):{memories}"
        ));
    }
    prompt
}

/// Facts the model would otherwise guess: the directory (as the user knows it, also in a
/// branch), the platform, today's date (for "latest", release notes, web searches) and
/// whether the project is under git.
fn environment(ctx: &ToolContext) -> String {
    let root = ctx.workspace.shown_root();
    let git = if instructions::repository_root(root).is_some() {
        "yes"
    } else {
        "no"
    };
    format!(
        "\n\n# Environment\n- Working directory: {}\n- Platform: {} ({})\n- Today's date: {}\n\
         - Git repository: {git}",
        root.display(),
        std::env::consts::OS,
        std::env::consts::ARCH,
        chrono::Local::now().format("%Y-%m-%d"),
    )
}

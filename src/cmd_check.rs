//! `shade check-command`: show whether the agent would treat a shell script as read-only
//! (run without asking, allowed in plan mode) and, if not, the first construct that stops it.

use std::path::PathBuf;

use clap::Args;
use shade_classify as shell_classify;

#[derive(Args)]
pub struct CheckArgs {
    /// Print one JSON object: {"read_only", "reason", "needs_network"}.
    #[arg(long)]
    json: bool,
    /// Check git commands against the configuration of the repository in DIR
    /// (default: the current directory).
    #[arg(short = 'C', value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The shell script, as one argument (quote it).
    script: String,
}

/// Exit 0 when read-only, 1 when not, 125 when the directory is unusable.
pub fn main(args: CheckArgs) -> i32 {
    let dir = args.dir.unwrap_or_else(|| PathBuf::from("."));
    if !dir.is_dir() {
        eprintln!("shade: {} is not a directory", dir.display());
        return crate::exit::SHADE_ERROR;
    }
    let verdict = shell_classify::classify_in(&args.script, &dir);
    if args.json {
        match serde_json::to_string(&verdict) {
            Ok(line) => println!("{line}"),
            Err(e) => return crate::exit::fail(&e.into()),
        }
    } else if verdict.read_only {
        println!("read-only");
    } else {
        let reason = verdict.reason.as_deref().unwrap_or("not understood");
        println!("not read-only: {reason}");
    }
    if verdict.read_only {
        0
    } else {
        1
    }
}

/// Usage errors of `check-command` exit 125 (1 means "not read-only"); other subcommands
/// keep clap's own status. Help and version output exit 0 as usual.
pub fn exit_on_usage_error(err: clap::Error) -> ! {
    let sub = std::env::args().nth(1);
    // lint's statuses are 0/1/125: a usage error is shade's own error, in one line.
    if sub.as_deref() == Some("lint") && err.use_stderr() {
        let text = err.to_string();
        let first = text.lines().next().unwrap_or("usage error");
        eprintln!("shade: {}", first.trim_start_matches("error: "));
        std::process::exit(crate::exit::SHADE_ERROR);
    }
    let ours = sub.as_deref() == Some("check-command");
    if ours && err.use_stderr() {
        let _ = err.print();
        std::process::exit(crate::exit::SHADE_ERROR);
    }
    err.exit()
}

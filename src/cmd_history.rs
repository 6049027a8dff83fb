//! `shade log` and `shade undo`: the project's accept history, and the way back.

use crate::exit;
use clap::Args;
use serde::Serialize;
use shade_fusefs::accept::history::{self, Entry, State};
use shade_fusefs::quote::quote_path;
use shade_fusefs::undo::{self, UndoError, UndoOptions};
use shade_fusefs::units::format_size;
use shade_fusefs::StateDir;
use std::path::PathBuf;

/// `shade log`.
#[derive(Args)]
pub struct LogArgs {
    /// Project directory (default: the current directory).
    #[arg(short = 'C', long = "dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Show at most this many accepts (newest first).
    #[arg(short = 'n', long, value_name = "N")]
    pub limit: Option<usize>,
}

/// `shade undo`.
#[derive(Args)]
pub struct UndoArgs {
    /// The accept to undo (an id from `shade log`, or its first characters); default: the
    /// newest one not undone.
    pub id: Option<String>,
    /// Project directory (default: the current directory).
    #[arg(short = 'C', long = "dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Only say what would be undone.
    #[arg(long)]
    pub dry_run: bool,
    /// Leave paths changed since the accept as they are now and undo the rest.
    #[arg(long)]
    pub keep_mine: bool,
    /// Print one JSON report on stdout.
    #[arg(long)]
    pub json: bool,
}

fn project(dir: &Option<PathBuf>) -> Result<PathBuf, String> {
    let d = match dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().map_err(|e| format!("current directory: {e}"))?,
    };
    std::fs::canonicalize(&d).map_err(|e| format!("project directory {}: {e}", d.display()))
}

#[derive(Serialize)]
struct LogPath {
    path: String,
    change: &'static str,
    size: u64,
}

#[derive(Serialize)]
struct LogEntry {
    id: String,
    time: String,
    time_ns: i64,
    origin: String,
    undoes: Option<String>,
    undone_by: Option<String>,
    undoable: bool,
    evicted: bool,
    /// `rolled_back` / `unfinished`: its journal was given up by `shade recover --drop`.
    dropped: Option<shade_fusefs::accept::history::Dropped>,
    /// Why its earlier contents were never kept (it cannot be undone).
    not_kept: Option<String>,
    /// Directories it renamed (undo renames them back).
    renamed: Vec<(String, String)>,
    stored_bytes: u64,
    paths: Vec<LogPath>,
}

fn change_word(before: &State, after: &State) -> &'static str {
    match (before.present(), after.present()) {
        (false, true) => "added",
        (true, false) => "deleted",
        _ => "modified",
    }
}

/// An entry's directory renames as the user made them (without the temporary names a plan
/// moves a directory through).
fn renamed(e: &Entry) -> Vec<(String, String)> {
    let raw: Vec<(PathBuf, PathBuf)> = e
        .renames
        .iter()
        .map(|(f, t)| (f.path().to_path_buf(), t.path().to_path_buf()))
        .collect();
    history::shown_renames(&raw)
        .iter()
        .map(|(f, t)| (quote_path(f).into_owned(), quote_path(t).into_owned()))
        .collect()
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a time in ns since the epoch.
fn utc(ns: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(ns)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

fn log_entry(all: &[Entry], e: &Entry) -> LogEntry {
    let undone_by = history::undone_by(all, &e.id).map(|u| u.id.clone());
    LogEntry {
        id: e.id.clone(),
        time: utc(e.time_ns),
        time_ns: e.time_ns,
        origin: e.origin.clone(),
        undoes: e.undoes.clone(),
        undoable: !e.evicted && e.dropped.is_none() && e.not_kept.is_none() && undone_by.is_none(),
        undone_by,
        evicted: e.evicted,
        dropped: e.dropped,
        not_kept: e.not_kept.clone(),
        renamed: renamed(e),
        stored_bytes: e.bytes,
        paths: e
            .changes
            .iter()
            .map(|c| LogPath {
                path: quote_path(c.path.path()).into_owned(),
                change: change_word(&c.before, &c.after),
                size: c.after.bytes().max(c.before.bytes()),
            })
            .collect(),
    }
}

/// `shade log`.
pub fn log_main(args: LogArgs) -> i32 {
    // A read-only listing, nothing mounted or half-written: `shade log | head` ends quietly
    // when the reader does, as a Unix tool does (Rust ignores SIGPIPE and println! panics).
    // SAFETY: restoring the default disposition of one signal, before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let state = StateDir::from_env();
    crate::cmd_run::startup_recovery(&state);
    let root = match project(&args.dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("shade: {e}");
            return exit::SHADE_ERROR;
        }
    };
    let all = match undo::project_history(&state, &root) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shade: {e}");
            return exit::SHADE_ERROR;
        }
    };
    let history_dir = state.history();
    let shown: Vec<LogEntry> = all
        .iter()
        .rev()
        .take(args.limit.unwrap_or(usize::MAX))
        .map(|e| {
            let mut e = e.clone();
            if let Err(err) = history::load_changes(&history_dir, &mut e) {
                tracing::warn!(entry = %e.id, error = %err, "history: changes not read");
            }
            log_entry(&all, &e)
        })
        .collect();
    if args.json {
        return match serde_json::to_writer(std::io::stdout().lock(), &shown) {
            Ok(()) => {
                println!();
                0
            }
            Err(e) => {
                eprintln!("shade: {e}");
                exit::SHADE_ERROR
            }
        };
    }
    if shown.is_empty() {
        println!("no accepts recorded in {}", quote_path(&root));
    }
    for e in &shown {
        let status = if let Some(d) = e.dropped {
            d.describe().to_string()
        } else if let Some(u) = &e.undone_by {
            format!("undone by {u}")
        } else if e.evicted {
            "evicted (can no longer be undone)".into()
        } else if let Some(why) = &e.not_kept {
            format!("not undoable: {why}")
        } else {
            "undoable".into()
        };
        let size: u64 = e.paths.iter().map(|p| p.size).sum();
        println!(
            "{}  {}  {}  {} path(s), {}  {status}",
            e.id,
            e.time,
            shade_fusefs::quote::visible_line(&e.origin),
            e.paths.len(),
            format_size(size)
        );
        for (f, t) in &e.renamed {
            println!("    renamed  {f} -> {t}");
        }
        for p in e.paths.iter().take(10) {
            println!("    {:<8} {}", p.change, p.path);
        }
        if e.paths.len() > 10 {
            println!("    … and {} more", e.paths.len() - 10);
        }
    }
    0
}

#[derive(Serialize)]
struct UndoJson {
    id: Option<String>,
    ok: bool,
    dry_run: bool,
    undo_id: Option<String>,
    restored: Vec<String>,
    removed: Vec<String>,
    renamed: Vec<(String, String)>,
    kept: Vec<KeptJson>,
    error: Option<String>,
}

#[derive(Serialize)]
struct KeptJson {
    path: String,
    reason: String,
}

/// `shade undo`.
pub fn undo_main(args: UndoArgs) -> i32 {
    let state = StateDir::from_env();
    crate::cmd_run::startup_recovery(&state);
    let root = match project(&args.dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("shade: {e}");
            return exit::SHADE_ERROR;
        }
    };
    let opts = UndoOptions {
        keep_mine: args.keep_mine,
        dry_run: args.dry_run,
        origin: String::new(),
    };
    let q = |p: &std::path::Path| quote_path(p).into_owned();
    let result = undo::undo(&state, &root, args.id.as_deref(), &opts);
    let (code, json) = match result {
        Ok(r) => {
            if !args.json {
                let verb = if args.dry_run { "would " } else { "" };
                for p in &r.restored {
                    println!("{verb}restore {}", q(p));
                }
                for (f, t) in &r.renamed {
                    println!("{verb}rename {} back to {}", q(f), q(t));
                }
                for p in &r.removed {
                    println!("{verb}remove {}", q(p));
                }
                for k in &r.kept {
                    println!("kept as it is: {}: {}", q(&k.path), k.reason);
                }
                if args.dry_run {
                    println!("(dry run: nothing changed)");
                } else if r.restored.is_empty() && r.removed.is_empty() && r.renamed.is_empty() {
                    println!("nothing of accept {} left to undo", r.id);
                } else {
                    println!(
                        "undid accept {}{}",
                        r.id,
                        r.undo_id
                            .as_ref()
                            .map(|u| format!(" (recorded as {u}; `shade undo {u}` redoes it)"))
                            .unwrap_or_default()
                    );
                }
            }
            (
                0,
                UndoJson {
                    id: Some(r.id),
                    ok: true,
                    dry_run: args.dry_run,
                    undo_id: r.undo_id,
                    restored: r.restored.iter().map(|p| q(p)).collect(),
                    removed: r.removed.iter().map(|p| q(p)).collect(),
                    renamed: r.renamed.iter().map(|(f, t)| (q(f), q(t))).collect(),
                    kept: r
                        .kept
                        .iter()
                        .map(|k| KeptJson {
                            path: q(&k.path),
                            reason: k.reason.clone(),
                        })
                        .collect(),
                    error: None,
                },
            )
        }
        Err(e) => {
            let (code, kept, id) = match &e {
                UndoError::Conflicts { id, kept } => (exit::CONFLICT, kept.clone(), Some(id)),
                UndoError::Accept(shade_fusefs::AcceptError::Conflicts(_)) => {
                    (exit::CONFLICT, Vec::new(), None)
                }
                _ => (exit::SHADE_ERROR, Vec::new(), None),
            };
            if !args.json {
                if let UndoError::Conflicts { id, kept } = &e {
                    eprintln!(
                        "shade: {} path(s) changed since accept {id}; nothing undone:",
                        kept.len()
                    );
                    for k in kept {
                        eprintln!("  {}: {}", q(&k.path), k.reason);
                    }
                    eprintln!(
                        "shade: `shade undo --keep-mine {id}` leaves them as they are and undoes the rest"
                    );
                } else {
                    eprintln!(
                        "shade: {}",
                        shade_fusefs::quote::visible_controls(&e.to_string())
                    );
                }
            }
            (
                code,
                UndoJson {
                    id: id.cloned().or(args.id.clone()),
                    ok: false,
                    dry_run: args.dry_run,
                    undo_id: None,
                    restored: Vec::new(),
                    removed: Vec::new(),
                    renamed: Vec::new(),
                    kept: kept
                        .iter()
                        .map(|k| KeptJson {
                            path: q(&k.path),
                            reason: k.reason.clone(),
                        })
                        .collect(),
                    error: Some(e.to_string()),
                },
            )
        }
    };
    if args.json {
        if let Err(e) = serde_json::to_writer(std::io::stdout().lock(), &json) {
            eprintln!("shade: {e}");
            return exit::SHADE_ERROR;
        }
        println!();
    }
    code
}

//! Writes outside the project, as the CLI shows and keeps them: listed apart from the
//! project's changes ("outside the project:"), diffed after them, kept only for the paths the
//! user names (`--keep-outside`, `[outside] keep`). See `shade_fusefs::outside`.

use shade_fusefs::outside::{home_dir, KeepError, OutsideChanges};
use shade_fusefs::Branch;
use std::io::Write;
use std::path::PathBuf;

/// The branch's outside changes; a layer that cannot be read is a warning and an empty list
/// (nothing of it can then be kept either).
pub(crate) fn read(branch: &Branch) -> OutsideChanges {
    match OutsideChanges::read(&branch.outside_dir()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shade: warning: cannot read the branch's writes outside the project: {e}");
            OutsideChanges::default()
        }
    }
}

/// `~` and `~/…` expanded to the home; other relative paths against the current directory.
/// Trailing slashes go (a prefix is matched by whole components).
pub(crate) fn expand(p: &str) -> PathBuf {
    let home = home_dir();
    let path = match (p.strip_prefix('~'), &home) {
        (Some(""), Some(h)) => h.clone(),
        (Some(rest), Some(h)) if rest.starts_with('/') => h.join(rest.trim_start_matches('/')),
        _ => PathBuf::from(p),
    };
    let path = if path.is_absolute() {
        path
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    path.components().collect()
}

/// The outside paths to keep: every `--keep-outside`, and with an accept the config's
/// `[outside] keep` list (a broken config file is said and ignored: it keeps nothing).
/// The config's rules are registered as standing ones
/// ([`shade_fusefs::outside::set_standing_rules`]): they never keep a change that makes a
/// program run code, which only a path given for this run (or a pick) keeps.
pub(crate) fn keep_list(flags: &[String], with_accept: bool) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = flags.iter().map(|p| expand(p)).collect();
    let mut standing: Vec<PathBuf> = Vec::new();
    if with_accept {
        match crate::config::outside_keep() {
            Ok(list) => {
                standing.extend(list.iter().map(|p| expand(p)).filter(|p| !out.contains(p)))
            }
            Err(e) => eprintln!("shade: warning: [outside] keep not read: {e}"),
        }
    }
    shade_fusefs::outside::set_standing_rules(standing.clone());
    out.extend(standing);
    out
}

/// The "outside the project:" block on stderr (nothing when there are none).
pub(crate) fn print(outside: &OutsideChanges) {
    if outside.is_empty() {
        return;
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "outside the project:");
    let home = home_dir();
    for l in outside.lines(home.as_deref()) {
        let _ = writeln!(err, "  {l}");
    }
    let code: Vec<String> = outside
        .changes
        .iter()
        .filter(|c| c.runs_code(home.as_deref()))
        .map(|c| shade_fusefs::outside::display_path(&c.path, home.as_deref()))
        .collect();
    if !code.is_empty() {
        let _ = writeln!(
            err,
            "  ! runs code (shell/agent/editor/git/ssh config, hooks, autostart, executables; \
             `[outside] keep` never keeps these, only `--keep-outside PATH` or a pick): {}",
            code.join(", ")
        );
    }
}

/// The diffs of the outside changes under their own header ("" when there are none).
pub(crate) fn diff(outside: &OutsideChanges) -> String {
    if outside.is_empty() {
        return String::new();
    }
    format!(
        "# outside the project\n{}",
        outside.diff(home_dir().as_deref())
    )
}

/// One line naming outside changes for a question or a summary:
/// "outside the project: ~/.bashrc modified, ~/.gitconfig modified" (at most `max` named).
pub(crate) fn summary(outside: &OutsideChanges, max: usize) -> Option<String> {
    if outside.is_empty() {
        return None;
    }
    let home = home_dir();
    let mut parts: Vec<String> = outside
        .changes
        .iter()
        .take(max)
        .map(|c| {
            format!(
                "{} {}",
                shade_fusefs::outside::display_path(&c.path, home.as_deref()),
                c.kind.word()
            )
        })
        .collect();
    if outside.changes.len() > max {
        parts.push(format!("and {} more", outside.changes.len() - max));
    }
    Some(format!("outside the project: {}", parts.join(", ")))
}

/// Say on stderr why a keep did not happen.
pub(crate) fn report_refused(e: &KeepError) {
    match e {
        KeepError::Conflicts(list) => {
            eprintln!(
                "shade: not kept: {} outside path{} changed on the host since the command started:",
                list.len(),
                if list.len() == 1 { "" } else { "s" }
            );
            for c in list {
                eprintln!("  {c}");
            }
        }
        KeepError::Accept(shade_fusefs::AcceptError::Unfinished {
            id,
            path,
            source,
            done,
            total,
        }) => eprintln!(
            "shade: keeping outside paths not finished: {done} of {total} steps were applied when \
             {} failed: {source}; `shade recover` (or any later shade start) finishes it \
             (journal {id}; paths changed since are not overwritten)",
            shade_fusefs::quote::quote_path(path)
        ),
        other => eprintln!("shade: {other}"),
    }
}

/// Say on stderr what a keep wrote.
pub(crate) fn report_kept(kept: &[PathBuf], json: bool) {
    if json || kept.is_empty() {
        return;
    }
    let home = home_dir();
    let names: Vec<String> = kept
        .iter()
        .map(|p| shade_fusefs::outside::display_path(p, home.as_deref()))
        .collect();
    eprintln!(
        "shade: kept {} outside the project: {}",
        if kept.len() == 1 {
            "1 path".to_string()
        } else {
            format!("{} paths", kept.len())
        },
        names.join(", ")
    );
}

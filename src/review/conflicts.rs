//! What an accept reports: its conflicts as terminal lines and as JSON, and the paths it left
//! out. Shared by `run`, `exec`, the review screens and chat, so they say it the same way.

use serde::Serialize;
use shade_fusefs::quote::{quote_path, visible_controls};
use std::path::PathBuf;

/// One conflict as `--json` prints it.
#[derive(Serialize)]
pub(crate) struct ConflictJson {
    #[serde(serialize_with = "shade_fusefs::lossy_path")]
    pub path: PathBuf,
    /// The exact bytes of a name that is not UTF-8 (`path` shows it with U+FFFD).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_bytes: Option<Vec<u8>>,
    pub reason: String,
}

/// A conflict as one terminal line: its path quoted (see `shade_fusefs::quote`), the rest as
/// the accept engine says it.
pub(crate) fn conflict_line(c: &shade_fusefs::Conflict) -> String {
    let text = c.to_string();
    let shown = c.path.display().to_string();
    match text.strip_prefix(&shown) {
        Some(rest) => format!("{}{rest}", quote_path(&c.path)),
        None => visible_controls(&text).into_owned(),
    }
}

/// Says on stderr what an accept of `n` changes did; false when some were left out because
/// their paths changed while it ran (listed, with where the branch's versions are kept).
pub(crate) fn report_accepted(n: usize, report: &shade_fusefs::AcceptReport, json: bool) -> bool {
    if let Some(note) = report.privileges_note() {
        eprintln!("shade: {note}");
    }
    let left = report.not_applied.len();
    if left == 0 {
        if !json {
            eprintln!(
                "shade: accepted {n} change{}",
                if n == 1 { "" } else { "s" }
            );
        }
        return true;
    }
    eprintln!(
        "shade: accepted all but {left} of {n} changes: {} changed in the project while the \
         accept ran and {} left as they are now:",
        if left == 1 {
            "this path"
        } else {
            "these paths"
        },
        if left == 1 { "is" } else { "are" },
    );
    for a in &report.not_applied {
        eprintln!("  {a}");
    }
    false
}

/// One line naming what an accept left out (for `--json`'s `error`).
pub(crate) fn not_applied_summary(report: &shade_fusefs::AcceptReport) -> String {
    let list: Vec<String> = report.not_applied.iter().map(ToString::to_string).collect();
    format!(
        "not applied (changed while the accept ran): {}",
        list.join("; ")
    )
}

/// Says on stderr why an accept was refused, and returns the conflicts for `--json`.
pub(crate) fn report_conflicts(
    list: &[shade_fusefs::Conflict],
    project: &std::path::Path,
) -> Vec<ConflictJson> {
    eprintln!(
        "shade: not accepted: {} path{} changed in {} since the branch read them:",
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        quote_path(project)
    );
    list.iter()
        .map(|c| {
            eprintln!("  {}", conflict_line(c));
            ConflictJson {
                path: c.path.clone(),
                path_bytes: shade_fusefs::non_utf8_bytes(&c.path).map(<[u8]>::to_vec),
                reason: c.to_string(),
            }
        })
        .collect()
}

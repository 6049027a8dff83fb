//! Unified diffs for approval previews (the user sees what an edit would do before saying yes).

/// Lines of diff shown at most.
pub const MAX_LINES: usize = 200;

/// A unified diff of `old` → `new` for `path`, cut at `MAX_LINES`.
pub fn unified(path: &str, old: &str, new: &str) -> String {
    let diff = similar::TextDiff::from_lines(old, new);
    let text = diff
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string();
    let total = text.lines().count();
    if total <= MAX_LINES {
        return text;
    }
    let mut cut: String = text
        .lines()
        .take(MAX_LINES)
        .map(|l| format!("{l}\n"))
        .collect();
    cut.push_str(&format!("[… {} more diff lines …]\n", total - MAX_LINES));
    cut
}

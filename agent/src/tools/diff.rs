//! Unified diffs for approval previews (the user sees what an edit would do before saying yes).

/// Lines of diff shown at most.
pub const MAX_LINES: usize = 200;

/// A unified diff of `old` → `new` for `path`, cut at `MAX_LINES`.
pub fn unified(path: &str, old: &str, new: &str) -> String {
    with_header(&format!("a/{path}"), &format!("b/{path}"), old, new)
}

/// The diff of a file that does not exist yet (`--- /dev/null`, as git shows it).
pub fn created(path: &str, new: &str) -> String {
    with_header("/dev/null", &format!("b/{path}"), "", new)
}

fn with_header(from: &str, to: &str, old: &str, new: &str) -> String {
    let diff = similar::TextDiff::from_lines(old, new);
    let text = diff
        .unified_diff()
        .context_radius(3)
        .header(from, to)
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

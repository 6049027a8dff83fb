//! Exit statuses shade itself uses. A command's own exit status is passed through, so
//! shade's own failures use codes that ordinary programs rarely return.

/// shade could not do its job (bad project dir, no /dev/fuse, mount failed, …).
pub const SHADE_ERROR: i32 = 125;
/// Accept found conflicts with changes made to the real tree meanwhile, or (as root) would
/// give a file to an owner it does not have in the project; nothing was written.
pub const CONFLICT: i32 = 124;
// A command that could not be started (127) or hit `--timeout` (123): see
// `shade_fusefs::sandbox::{EXIT_CANNOT_EXEC, EXIT_TIMED_OUT}`.

/// Print shade's own error as one clear line and return the exit status for it.
pub fn fail(err: &anyhow::Error) -> i32 {
    // Errors name paths and carry other programs' words: no raw control characters.
    eprintln!(
        "shade: {}",
        shade_fusefs::quote::visible_controls(&one_line(err))
    );
    SHADE_ERROR
}

/// The error chain joined by ": " like `{:#}`, minus causes the line already says:
/// error types whose message includes their source would show it twice otherwise
/// ("…: Permission denied (os error 13): Permission denied (os error 13)").
fn one_line(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let msg = cause.to_string();
        if out.contains(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
    }
    out
}

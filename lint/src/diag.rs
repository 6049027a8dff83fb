//! The normalised diagnostic every checker's output is parsed into.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

/// How bad a diagnostic is; only new `Error`s make `shade lint` exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The code does not build or is certainly wrong.
    Error,
    /// Suspicious code the checker flags.
    Warning,
    /// Notes and information.
    Info,
    /// Hints (unused, deprecated, style).
    Hint,
}

impl Severity {
    /// Read a checker's own spelling of a severity (`error`, `fatal error`, `note`, …).
    pub fn parse(s: &str) -> Severity {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" | "fatal error" | "fatal" | "failure-note" | "ice" => Severity::Error,
            "warning" | "warn" => Severity::Warning,
            "hint" | "help" | "style" => Severity::Hint,
            _ => Severity::Info,
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
            Severity::Hint => "hint",
        })
    }
}

/// One finding of one checker, with a project-relative path and 1-based positions, so
/// diagnostics of different checkers, runs and branches compare and print alike.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Relative to the project root (`/`-separated); absolute only for files outside it.
    pub path: String,
    /// 1-based.
    pub line: u32,
    /// 1-based.
    pub column: u32,
    /// 1-based, inclusive line of the end of the range.
    pub end_line: u32,
    /// 1-based column of the end of the range.
    pub end_column: u32,
    /// How bad it is.
    pub severity: Severity,
    /// The checker's rule or error code (`E0308`, `F401`, `unused_variables`).
    pub code: Option<String>,
    /// The checker's message, first line only.
    pub message: String,
    /// Which checker said it (`cargo`, `ruff`, `clangd`, …).
    pub checker: String,
    /// Whether the edit introduced it (false for diagnostics the unedited project has).
    pub new: bool,
}

impl fmt::Display for Diagnostic {
    /// `path:line:col: severity: message [code] (checker)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.path, self.line, self.column, self.severity, self.message
        )?;
        if let Some(c) = &self.code {
            write!(f, " [{c}]")?;
        }
        write!(f, " ({})", self.checker)
    }
}

/// A diagnostic before normalisation: what a parser read, with the path as the checker
/// printed it.
#[derive(Debug, Clone, Default)]
pub struct Raw {
    /// As printed: absolute, or relative to the directory the checker ran in.
    pub path: String,
    /// 1-based; 0 when the checker gave none.
    pub line: u32,
    /// 1-based; 0 when the checker gave none.
    pub column: u32,
    /// 0 when unknown (then the start is used).
    pub end_line: u32,
    /// 0 when unknown.
    pub end_column: u32,
    /// How bad.
    pub severity: Option<Severity>,
    /// Rule code.
    pub code: Option<String>,
    /// Message (may be several lines; only the first is kept).
    pub message: String,
}

/// Where a checker ran, to turn its paths into project-relative ones.
#[derive(Debug, Clone)]
pub struct PathBase<'a> {
    /// The real project root (what the checker sees as its root).
    pub project: &'a Path,
    /// The directory the checker ran in (relative paths start here).
    pub cwd: &'a Path,
    /// The branch mount point, for runs that fell back to the mount directory.
    pub mount: Option<&'a Path>,
}

impl Raw {
    /// Normalise: project-relative path, 1-based positions, end at least the start, one-line
    /// message with whitespace collapsed.
    pub fn normalise(self, base: &PathBase<'_>, checker: &str, default: Severity) -> Diagnostic {
        let line = self.line.max(1);
        let column = self.column.max(1);
        let (end_line, end_column) = if self.end_line < line {
            (line, column)
        } else if self.end_line == line {
            (line, self.end_column.max(column))
        } else {
            (self.end_line, self.end_column.max(1))
        };
        let message = self
            .message
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Diagnostic {
            path: relative_path(&self.path, base),
            line,
            column,
            end_line,
            end_column,
            severity: self.severity.unwrap_or(default),
            code: self.code.filter(|c| !c.is_empty()),
            message,
            checker: checker.to_string(),
            new: false,
        }
    }
}

/// `path` as the checker printed it, made relative to the project root where it lies inside.
pub fn relative_path(path: &str, base: &PathBase<'_>) -> String {
    let p = Path::new(path.strip_prefix("file://").unwrap_or(path));
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.cwd.join(p)
    };
    let abs = lexical(&abs);
    for root in std::iter::once(base.project).chain(base.mount) {
        if let Ok(rel) = abs.strip_prefix(root) {
            return rel.to_string_lossy().into_owned();
        }
    }
    abs.to_string_lossy().into_owned()
}

/// `p` with `.` and `..` resolved by name, without touching the file system: checkers print
/// `./src/x.go`, cargo reports a configured `../x` unresolved, git config names `../hooks`.
pub fn lexical(p: &Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Sort for stable output: by path, position, then message.
pub fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by(|a, b| {
        (&a.path, a.line, a.column, &a.message, &a.checker)
            .cmp(&(&b.path, b.line, b.column, &b.message, &b.checker))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_project_relative() {
        let base = PathBase {
            project: Path::new("/p"),
            cwd: Path::new("/p/sub"),
            mount: Some(Path::new("/state/b/mnt")),
        };
        assert_eq!(relative_path("/p/src/a.rs", &base), "src/a.rs");
        assert_eq!(relative_path("./x.go", &base), "sub/x.go");
        assert_eq!(relative_path("../y.py", &base), "y.py");
        assert_eq!(relative_path("/state/b/mnt/z.c", &base), "z.c");
        assert_eq!(
            relative_path("/usr/include/stdio.h", &base),
            "/usr/include/stdio.h"
        );
    }

    #[test]
    fn display_is_one_line_with_code_and_checker() {
        let d = Raw {
            path: "src/a.rs".into(),
            line: 3,
            column: 9,
            message: "unused variable: `x`\n  note: more".into(),
            code: Some("unused_variables".into()),
            ..Default::default()
        }
        .normalise(
            &PathBase {
                project: Path::new("/p"),
                cwd: Path::new("/p"),
                mount: None,
            },
            "cargo",
            Severity::Warning,
        );
        assert_eq!(
            d.to_string(),
            "src/a.rs:3:9: warning: unused variable: `x` [unused_variables] (cargo)"
        );
        assert_eq!((d.end_line, d.end_column), (3, 9));
    }
}

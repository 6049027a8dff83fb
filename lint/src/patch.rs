//! Unified diffs (`git diff`, `diff -u`): parsed, checked against the files they apply to,
//! and turned into whole new file contents before anything is written, so a patch that
//! does not apply changes nothing.

use std::path::{Component, Path, PathBuf};

use shade_fusefs::rootdir::RootDir;

/// One file's part of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// Path before (`None`: the file is created).
    pub old: Option<String>,
    /// Path after (`None`: the file is deleted).
    pub new: Option<String>,
    /// The hunks, in order.
    pub hunks: Vec<Hunk>,
}

/// One `@@ -a,b +c,d @@` hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// 1-based first old line (0 for an empty old side).
    pub old_start: usize,
    /// Lines of the hunk: (' ' | '-' | '+', text without newline).
    pub lines: Vec<(char, String)>,
    /// The old side lacks a final newline.
    pub old_no_eol: bool,
    /// The new side lacks a final newline.
    pub new_no_eol: bool,
}

/// What a patch does to one file, worked out against the files it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEdit {
    /// Project-relative path.
    pub path: String,
    /// Content before (`None`: did not exist).
    pub old: Option<String>,
    /// Content after (`None`: deleted).
    pub new: Option<String>,
}

/// Why a patch was refused; the text is the one line the user sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// Not a unified diff, or a malformed one.
    #[error("not a valid unified diff: {0}")]
    Malformed(String),
    /// A path leading out of the project (absolute, `..`, through a symlink).
    #[error("patch path {0} leads outside the project")]
    Escapes(String),
    /// The file is not as the patch expects.
    #[error("patch does not apply: {0}")]
    DoesNotApply(String),
    /// Binary diffs and other things this reader does not handle.
    #[error("unsupported patch: {0}")]
    Unsupported(String),
}

/// Parse a unified diff. An empty (or whitespace-only) text is an empty patch.
pub fn parse(text: &str) -> Result<Vec<FilePatch>, PatchError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.starts_with("GIT binary patch") || l.starts_with("Binary files ") {
            return Err(PatchError::Unsupported("binary diff".into()));
        }
        if !l.starts_with("--- ") || !lines.get(i + 1).is_some_and(|n| n.starts_with("+++ ")) {
            i += 1;
            continue;
        }
        let old = header_path(&l[4..]);
        let new = header_path(&lines[i + 1][4..]);
        i += 2;
        let mut hunks = Vec::new();
        while i < lines.len() && lines[i].starts_with("@@") {
            let (old_start, old_len, new_len) = hunk_header(lines[i])?;
            i += 1;
            let mut h = Hunk {
                old_start,
                lines: Vec::new(),
                old_no_eol: false,
                new_no_eol: false,
            };
            let (mut o, mut n) = (0, 0);
            while (o < old_len || n < new_len) && i < lines.len() {
                let l = lines[i];
                let (tag, rest) = match l.chars().next() {
                    Some(c @ (' ' | '-' | '+')) => (c, &l[1..]),
                    None => (' ', ""), // an empty context line whose space was stripped
                    Some('\\') => {
                        i += 1;
                        continue;
                    }
                    Some(_) => break,
                };
                match tag {
                    ' ' => {
                        o += 1;
                        n += 1
                    }
                    '-' => o += 1,
                    _ => n += 1,
                }
                h.lines.push((tag, rest.to_string()));
                i += 1;
            }
            if o != old_len || n != new_len {
                return Err(PatchError::Malformed(format!(
                    "hunk at old line {old_start} is shorter than its header says"
                )));
            }
            while i < lines.len() && lines[i].starts_with('\\') {
                match h.lines.last() {
                    Some(('-', _)) => h.old_no_eol = true,
                    Some(('+', _)) => h.new_no_eol = true,
                    _ => {
                        h.old_no_eol = true;
                        h.new_no_eol = true;
                    }
                }
                i += 1;
            }
            hunks.push(h);
        }
        if hunks.is_empty() {
            return Err(PatchError::Malformed(format!(
                "no hunks for {}",
                new.as_deref().or(old.as_deref()).unwrap_or("?")
            )));
        }
        files.push(FilePatch { old, new, hunks });
    }
    if files.is_empty() && !text.trim().is_empty() {
        return Err(PatchError::Malformed(
            "no `--- a/…` / `+++ b/…` file headers found".into(),
        ));
    }
    strip_git_prefixes(&mut files);
    Ok(files)
}

/// `a/src/x.rs\t2024-…` → `a/src/x.rs`; `/dev/null` → None.
fn header_path(s: &str) -> Option<String> {
    let s = s.split('\t').next().unwrap_or("").trim_end();
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    (s != "/dev/null").then(|| s.to_string())
}

fn hunk_header(l: &str) -> Result<(usize, usize, usize), PatchError> {
    let bad = || PatchError::Malformed(format!("bad hunk header `{l}`"));
    let body = l
        .strip_prefix("@@ -")
        .and_then(|r| r.split(" @@").next())
        .ok_or_else(bad)?;
    let (old, new) = body.split_once(" +").ok_or_else(bad)?;
    let range = |r: &str| -> Result<(usize, usize), PatchError> {
        let (s, n) = r.split_once(',').unwrap_or((r, "1"));
        Ok((s.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?))
    };
    let (os, ol) = range(old)?;
    let (_, nl) = range(new)?;
    Ok((os, ol, nl))
}

/// `git diff` writes `a/` and `b/` prefixes; strip them when every header has them.
fn strip_git_prefixes(files: &mut [FilePatch]) {
    let all = files.iter().all(|f| {
        f.old.as_deref().is_none_or(|p| p.starts_with("a/"))
            && f.new.as_deref().is_none_or(|p| p.starts_with("b/"))
    });
    if !all {
        return;
    }
    for f in files {
        f.old = f.old.take().map(|p| p[2..].to_string());
        f.new = f.new.take().map(|p| p[2..].to_string());
    }
}

/// A project-relative path from a patch, refused when it could lead out of `root`:
/// absolute, `..`, or through a symlink inside the tree.
pub fn confine(root: &Path, rel: &str) -> Result<PathBuf, PatchError> {
    let p = Path::new(rel);
    let mut out = root.to_path_buf();
    let mut parts = p.components().peekable();
    if parts.peek().is_none() {
        return Err(PatchError::Escapes(rel.to_string()));
    }
    for c in parts {
        match c {
            Component::Normal(n) => {
                out.push(n);
                if std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(PatchError::Escapes(rel.to_string()));
                }
            }
            Component::CurDir => {}
            _ => return Err(PatchError::Escapes(rel.to_string())),
        }
    }
    Ok(out)
}

/// Work out every file's new content against the tree at `root` (the branch), all or
/// nothing.
pub fn plan(root: &Path, files: &[FilePatch]) -> Result<Vec<FileEdit>, PatchError> {
    // Read beneath the root's descriptor: `confine` says why a path is refused, the
    // kernel keeps a link swapped in after it from leading out.
    let tree = RootDir::open(root)
        .map_err(|e| PatchError::DoesNotApply(format!("{}: {e}", root.display())))?;
    let mut edits: Vec<FileEdit> = Vec::new();
    for f in files {
        let rel = f.new.as_deref().or(f.old.as_deref()).ok_or_else(|| {
            PatchError::Malformed("a file patch from /dev/null to /dev/null".into())
        })?;
        if f.old.is_some() && f.new.is_some() && f.old != f.new {
            return Err(PatchError::Unsupported(format!(
                "renames ({} -> {rel})",
                f.old.as_deref().unwrap_or("")
            )));
        }
        confine(root, rel)?;
        // A file patched twice in one diff: the second part applies to the first's result.
        let current = match edits.iter().position(|e| e.path == rel) {
            Some(k) => edits.remove(k).new,
            None => read_existing(&tree, rel)?,
        };
        let new = match (&f.old, &f.new, &current) {
            (None, Some(_), Some(_)) => {
                return Err(PatchError::DoesNotApply(format!("{rel} already exists")))
            }
            (Some(_), _, None) => {
                return Err(PatchError::DoesNotApply(format!("{rel} does not exist")))
            }
            _ => apply(current.as_deref().unwrap_or(""), &f.hunks)
                .map_err(|m| PatchError::DoesNotApply(format!("{rel}: {m}")))?,
        };
        let new = if f.new.is_none() {
            if !new.is_empty() {
                return Err(PatchError::DoesNotApply(format!(
                    "{rel}: deletion leaves content behind"
                )));
            }
            None
        } else {
            Some(new)
        };
        let old = match edits.iter().position(|e| e.path == rel) {
            Some(_) => None,
            None => read_existing(&tree, rel)?,
        };
        edits.push(FileEdit {
            path: rel.to_string(),
            old,
            new,
        });
    }
    Ok(edits)
}

fn read_existing(tree: &RootDir, rel: &str) -> Result<Option<String>, PatchError> {
    match tree.read(Path::new(rel)) {
        Ok(b) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| PatchError::Unsupported(format!("{rel} is not UTF-8 text"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(PatchError::DoesNotApply(format!("{rel}: {e}"))),
    }
}

/// Apply hunks to `text`. Each hunk must match exactly, at its stated line or, like
/// `patch`, at the nearest offset where its old side matches.
pub fn apply(text: &str, hunks: &[Hunk]) -> Result<String, String> {
    let had_eol = text.is_empty() || text.ends_with('\n');
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut delta: isize = 0;
    let mut min_start = 0usize;
    let mut final_no_eol = !had_eol;
    for (n, h) in hunks.iter().enumerate() {
        let old: Vec<&str> = h
            .lines
            .iter()
            .filter(|(t, _)| *t != '+')
            .map(|(_, s)| s.as_str())
            .collect();
        let new: Vec<String> = h
            .lines
            .iter()
            .filter(|(t, _)| *t != '-')
            .map(|(_, s)| s.clone())
            .collect();
        let want = if old.is_empty() {
            h.old_start as isize + delta
        } else {
            h.old_start as isize - 1 + delta
        }
        .max(0) as usize;
        let fits = |at: usize| {
            at >= min_start
                && at + old.len() <= lines.len()
                && lines[at..at + old.len()]
                    .iter()
                    .zip(&old)
                    .all(|(a, b)| a == b)
        };
        let at = (0..=lines.len())
            .flat_map(|d| [want.checked_sub(d), want.checked_add(d).filter(|_| d > 0)])
            .flatten()
            .find(|&at| fits(at))
            .ok_or_else(|| {
                format!(
                    "hunk {} (old line {}) does not match the file",
                    n + 1,
                    h.old_start
                )
            })?;
        let end = at + old.len();
        if end == lines.len() {
            // The hunk reaches the end of the file: its new side decides the last newline.
            final_no_eol = !new.is_empty() && h.new_no_eol;
        }
        lines.splice(at..end, new.iter().cloned());
        delta += new.len() as isize - old.len() as isize;
        min_start = at + new.len();
    }
    let mut out = lines.join("\n");
    if !lines.is_empty() && !final_no_eol {
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "a\nb\nc\nd\ne\n";

    #[test]
    fn git_diff_applies_and_strips_prefixes() {
        let p = "diff --git a/x.txt b/x.txt\nindex 1..2 100644\n--- a/x.txt\n+++ b/x.txt\n@@ -2,2 +2,3 @@\n b\n-c\n+C\n+C2\n";
        let files = parse(p).expect("parses");
        assert_eq!(files[0].new.as_deref(), Some("x.txt"));
        assert_eq!(
            apply(OLD, &files[0].hunks),
            Ok("a\nb\nC\nC2\nd\ne\n".into())
        );
    }

    #[test]
    fn offset_hunks_apply_and_mismatches_do_not() {
        let p = "--- x\n+++ x\n@@ -1,2 +1,2 @@\n d\n-e\n+E\n";
        let files = parse(p).expect("parses");
        assert_eq!(apply(OLD, &files[0].hunks), Ok("a\nb\nc\nd\nE\n".into()));
        let p = "--- x\n+++ x\n@@ -1,2 +1,2 @@\n q\n-e\n+E\n";
        let files = parse(p).expect("parses");
        assert!(apply(OLD, &files[0].hunks).is_err());
    }

    #[test]
    fn creation_deletion_and_no_newline() {
        let p = "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n\\ No newline at end of file\n";
        let files = parse(p).expect("parses");
        assert_eq!(files[0].old, None);
        assert_eq!(apply("", &files[0].hunks), Ok("x = 1\ny = 2".into()));
        let p = "--- a/x\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n";
        let files = parse(p).expect("parses");
        assert_eq!(files[0].new, None);
        assert_eq!(apply("a\nb\n", &files[0].hunks), Ok(String::new()));
    }

    #[test]
    fn garbage_and_escapes_are_refused() {
        assert!(matches!(parse("hello\n"), Err(PatchError::Malformed(_))));
        assert_eq!(parse("  \n"), Ok(vec![]));
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(confine(dir.path(), "../x").is_err());
        assert!(confine(dir.path(), "/etc/passwd").is_err());
        std::os::unix::fs::symlink("/etc", dir.path().join("l")).expect("symlink");
        assert!(confine(dir.path(), "l/passwd").is_err());
        assert!(confine(dir.path(), "src/ok.rs").is_ok());
    }
}

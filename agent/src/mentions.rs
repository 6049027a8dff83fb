//! `@path` mentions in a prompt: the files named are attached to the message, the way
//! Claude Code, Codex and qwen-code do, so "explain @src/lib.rs" needs no read call first.
//!
//! A mention is `@` at the start of the prompt or after whitespace, followed by a path;
//! trailing sentence punctuation is not part of it. Paths go through
//! [`Workspace::resolve`], so a mention can never reach outside the project (`..`, absolute
//! paths elsewhere, symlinks out). A mention that names nothing is left as typed.

use std::path::PathBuf;

use crate::workspace::Workspace;

/// Longest text attached from one file; the rest is left for `read_file`.
pub const MAX_FILE_BYTES: usize = 64 * 1024;
/// Entries listed for a mentioned directory.
pub const MAX_DIR_ENTRIES: usize = 200;

/// A prompt with its mentions attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expanded {
    /// What the model gets: the prompt as typed, then one block per attachment.
    pub text: String,
    /// What was attached, for the user: the path as typed and a short note (`42 lines`).
    pub attached: Vec<(String, String)>,
    /// Mentions that look like paths but could not be attached, with why.
    pub refused: Vec<(String, String)>,
}

/// Attach the files and directories `prompt` mentions (each once).
pub fn expand(prompt: &str, workspace: &Workspace) -> Expanded {
    let mut out = Expanded {
        text: prompt.to_string(),
        attached: Vec::new(),
        refused: Vec::new(),
    };
    let mut blocks = String::new();
    let mut done: Vec<PathBuf> = Vec::new();
    for mention in mentions(prompt) {
        let path = match workspace.resolve(mention) {
            Ok(p) => p,
            Err(e) => {
                out.refused.push((mention.to_string(), e.to_string()));
                continue;
            }
        };
        if done.contains(&path) {
            continue;
        }
        let shown = workspace.display(&path);
        match attach(workspace, &path, &shown) {
            Ok(Some((block, note))) => {
                blocks.push_str(&block);
                out.attached.push((mention.to_string(), note));
                done.push(path);
            }
            Ok(None) => {}
            Err(e) => out.refused.push((mention.to_string(), e)),
        }
    }
    if !blocks.is_empty() {
        out.text.push_str("\n\nAttached by @-mention:");
        out.text.push_str(&blocks);
    }
    out
}

/// The `@` mentions of `prompt`, as typed (without the `@`).
pub fn mentions(prompt: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut prev_is_space = true;
    for (i, c) in prompt.char_indices() {
        if c == '@' && prev_is_space {
            let rest = &prompt[i + 1..];
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            let token =
                rest[..end].trim_end_matches([',', '.', ';', ':', '!', '?', ')', '"', '\'']);
            if !token.is_empty() {
                found.push(token);
            }
        }
        prev_is_space = c.is_whitespace();
    }
    found
}

/// The block for one path and its note; `None` when nothing is there (a mention of
/// something that does not exist is left as plain text: `@decorator`, `@user`).
fn attach(
    workspace: &Workspace,
    path: &std::path::Path,
    shown: &str,
) -> Result<Option<(String, String)>, String> {
    // Through the root's descriptor: a link a command swaps in cannot lead out.
    let Ok(files) = workspace.files() else {
        return Ok(None);
    };
    let rel = workspace.relative(path);
    let Ok(meta) = files.metadata(rel) else {
        return Ok(None);
    };
    if meta.is_dir() {
        let mut names: Vec<String> = files
            .read_dir(rel)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|e| {
                let mut n = e.name.to_string_lossy().into_owned();
                if e.kind == crate::workspace::Kind::Dir {
                    n.push('/');
                }
                n
            })
            .collect();
        names.sort();
        let total = names.len();
        names.truncate(MAX_DIR_ENTRIES);
        let more = if total > names.len() {
            format!("\n… {} more", total - names.len())
        } else {
            String::new()
        };
        let block = format!(
            "\n\n<directory path=\"{shown}\">\n{}{more}\n</directory>",
            names.join("\n")
        );
        return Ok(Some((block, crate::tools::text::plural(total, "entry"))));
    }
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let bytes = files.read(rel).map_err(|e| e.to_string())?;
    if bytes.iter().take(8192).any(|&b| b == 0) {
        return Err("a binary file".into());
    }
    let text = String::from_utf8_lossy(&bytes);
    let (body, note) = if text.len() > MAX_FILE_BYTES {
        let mut end = MAX_FILE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let kept = text[..end].lines().count();
        (
            format!(
                "{}\n[… cut after {kept} lines of {}; read_file for the rest]",
                &text[..end],
                text.lines().count()
            ),
            format!("first {kept} of {} lines", text.lines().count()),
        )
    } else {
        (
            text.to_string(),
            crate::tools::text::plural(text.lines().count(), "line"),
        )
    };
    let block = format!(
        "\n\n<file path=\"{shown}\">\n{}\n</file>",
        body.trim_end_matches('\n')
    );
    Ok(Some((block, note)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn finds_mentions_but_not_addresses_or_punctuation() {
        assert_eq!(
            mentions("explain @src/lib.rs, then @docs/ and mail me@example.com (@a.txt)"),
            ["src/lib.rs", "docs/"]
        );
        assert_eq!(mentions("@x.rs."), ["x.rs"]);
        assert!(mentions("@ alone").is_empty());
    }

    #[test]
    fn attaches_files_and_directories_and_never_escapes() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "top secret").unwrap();
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("src")).unwrap();
        std::fs::write(t.path().join("src/lib.rs"), "fn a() {}\nfn b() {}\n").unwrap();
        std::fs::write(t.path().join("bin"), b"\x7fELF\0\0").unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("out")).unwrap();
        let ws = Workspace::new(t.path()).unwrap();
        let secret = outside.path().join("secret");
        let prompt = format!(
            "look at @src/lib.rs and @src/ and @src/lib.rs, not @../x, @out/secret, @{}, @bin; @decorator",
            secret.display()
        );
        let e = expand(&prompt, &ws);
        assert!(e.text.starts_with(&prompt));
        assert!(e
            .text
            .contains("<file path=\"src/lib.rs\">\nfn a() {}\nfn b() {}\n</file>"));
        assert!(e
            .text
            .contains("<directory path=\"src\">\nlib.rs\n</directory>"));
        assert_eq!(e.text.matches("<file path=\"src/lib.rs\">").count(), 1);
        assert!(!e.text.contains("top secret"));
        assert_eq!(
            e.attached,
            [
                ("src/lib.rs".to_string(), "2 lines".to_string()),
                ("src/".to_string(), "1 entry".to_string())
            ]
        );
        let refused: Vec<&str> = e.refused.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(
            refused,
            ["../x", "out/secret", secret.to_str().unwrap(), "bin"]
        );
    }

    #[test]
    fn a_prompt_without_mentions_is_unchanged() {
        let t = tempfile::tempdir().unwrap();
        let ws = Workspace::new(t.path()).unwrap();
        let e = expand("fix the bug", &ws);
        assert_eq!(e.text, "fix the bug");
        assert!(e.attached.is_empty() && e.refused.is_empty());
    }
}

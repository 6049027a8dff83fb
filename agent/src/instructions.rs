//! Project instructions: the `AGENTS.md` (and `CLAUDE.md`, `QWEN.md`, `GEMINI.md`) files a
//! project keeps for coding agents, read into the system prompt the way the agents that
//! defined them do, so a project set up for one of them needs no second copy for shade.
//!
//! Files are gathered from the repository root (the nearest ancestor with `.git`) down to
//! the workspace root, then the user's own `AGENTS.md` in shade's config directory first of
//! all; a file reached twice (a `CLAUDE.md` symlinked to `AGENTS.md`, or the same text) is
//! read once. Files at the workspace root are read where the files are (a branch mount sees
//! the branch's version); their ancestors are outside the workspace and read as they are.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::tools::ToolContext;

/// The names other coding agents read, in the order their text is given.
pub const FILE_NAMES: [&str; 4] = ["AGENTS.md", "CLAUDE.md", "QWEN.md", "GEMINI.md"];

/// Longest text taken from one file (Codex's default limit); the rest is cut with a note.
pub const MAX_BYTES_PER_FILE: usize = 32 * 1024;

/// One instruction file: where the model is told it is, and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstructionFile {
    /// The path as the model and the user know it (the real project's, in a branch).
    pub shown: PathBuf,
    /// Its text, at most [`MAX_BYTES_PER_FILE`] bytes and a note when cut.
    pub text: String,
}

/// The instruction files for a session in `ctx`'s workspace, outermost first.
pub fn load(ctx: &ToolContext) -> Vec<InstructionFile> {
    let mut places: Vec<(PathBuf, PathBuf)> = Vec::new();
    if let Some(dir) = crate::paths::config_dir() {
        places.push((dir.clone(), dir));
    }
    let shown_root = ctx.workspace.shown_root().to_path_buf();
    for dir in ancestors_within_repository(&shown_root) {
        places.push((dir.clone(), dir));
    }
    places.push((ctx.workspace.root().to_path_buf(), shown_root));

    let mut seen_files = HashSet::new();
    let mut seen_texts = HashSet::new();
    let mut out = Vec::new();
    let last = places.len() - 1;
    for (at, (dir, shown_dir)) in places.into_iter().enumerate() {
        for name in FILE_NAMES {
            if at == last {
                // The workspace (a branch commands write): read beneath its root
                // descriptor, so a file a command made a link to the host is not read.
                let Ok(bytes) = ctx.workspace.files().and_then(|f| f.read(Path::new(name))) else {
                    continue;
                };
                let text = cut(&bytes);
                if text.trim().is_empty() || !seen_texts.insert(text.trim().to_string()) {
                    continue;
                }
                out.push(InstructionFile {
                    shown: shown_dir.join(name),
                    text,
                });
                continue;
            }
            let path = dir.join(name);
            let Ok(real) = path.canonicalize() else {
                continue;
            };
            if !real.is_file() || !seen_files.insert(real.clone()) {
                continue;
            }
            let Ok(bytes) = std::fs::read(&real) else {
                continue;
            };
            let text = cut(&bytes);
            if text.trim().is_empty() || !seen_texts.insert(text.trim().to_string()) {
                continue;
            }
            out.push(InstructionFile {
                shown: shown_dir.join(name),
                text,
            });
        }
    }
    out
}

/// The system prompt section for `files` (empty when there are none).
pub fn render(files: &[InstructionFile]) -> String {
    let mut out = String::new();
    if files.is_empty() {
        return out;
    }
    out.push_str(
        "\n\n# Project instructions\nThe user and the project keep these instructions for \
         coding agents. Follow them; a file nearer the working directory wins over an outer one.",
    );
    for f in files {
        out.push_str(&format!(
            "\n\n--- {} ---\n{}",
            f.shown.display(),
            f.text.trim_end()
        ));
    }
    out
}

/// The nearest of `dir` and its ancestors holding `.git` (a directory, or a worktree's file).
pub fn repository_root(dir: &Path) -> Option<&Path> {
    dir.ancestors().find(|a| a.join(".git").exists())
}

/// `dir`'s ancestors from the repository root down, not `dir` itself; none outside a
/// repository (a stray `AGENTS.md` in a home directory is not this project's).
fn ancestors_within_repository(dir: &Path) -> Vec<PathBuf> {
    let Some(repo_root) = repository_root(dir) else {
        return Vec::new();
    };
    let mut chain: Vec<PathBuf> = dir
        .ancestors()
        .skip(1)
        .take_while(|a| a.starts_with(repo_root))
        .map(Path::to_path_buf)
        .collect();
    chain.reverse();
    chain
}

/// The file's text, cut at [`MAX_BYTES_PER_FILE`] on a character boundary.
fn cut(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= MAX_BYTES_PER_FILE {
        return text.into_owned();
    }
    let mut end = MAX_BYTES_PER_FILE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[… cut: the file has {} bytes; read it with read_file for the rest]",
        &text[..end],
        bytes.len()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::workspace::Workspace;

    fn ctx_in(dir: &Path) -> ToolContext {
        ToolContext::new(Workspace::new(dir).unwrap())
    }

    #[test]
    fn reads_the_repository_chain_once_per_file_and_text() {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        let proj = repo.join("svc");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(&proj).unwrap();
        std::fs::write(t.path().join("AGENTS.md"), "outside the repository").unwrap();
        std::fs::write(repo.join("AGENTS.md"), "use tabs").unwrap();
        std::fs::write(proj.join("AGENTS.md"), "run make check").unwrap();
        std::os::unix::fs::symlink("AGENTS.md", proj.join("CLAUDE.md")).unwrap();
        std::fs::write(proj.join("QWEN.md"), "use tabs\n").unwrap();
        std::fs::write(proj.join("GEMINI.md"), "  \n").unwrap();
        let files = load(&ctx_in(&proj));
        let texts: Vec<&str> = files
            .iter()
            .filter(|f| f.shown.starts_with(repo.canonicalize().unwrap()))
            .map(|f| f.text.trim())
            .collect();
        assert_eq!(texts, ["use tabs", "run make check"]);
        let rendered = render(&files);
        assert!(rendered.contains("svc/AGENTS.md ---\nrun make check"));
        assert!(!rendered.contains("outside the repository"));
    }

    #[test]
    fn a_branch_shows_real_paths_and_its_own_text() {
        let real = tempfile::tempdir().unwrap();
        let mount = tempfile::tempdir().unwrap();
        std::fs::write(real.path().join("AGENTS.md"), "the real one").unwrap();
        std::fs::write(mount.path().join("AGENTS.md"), "the branch's edit").unwrap();
        let ctx = ToolContext::new(Workspace::shadowed(real.path(), mount.path()).unwrap());
        let files = load(&ctx);
        let last = files.last().unwrap();
        assert_eq!(last.text, "the branch's edit");
        assert_eq!(
            last.shown,
            real.path().canonicalize().unwrap().join("AGENTS.md")
        );
    }

    #[test]
    fn long_files_are_cut_on_a_character_boundary() {
        let text = "é".repeat(MAX_BYTES_PER_FILE);
        let out = cut(text.as_bytes());
        assert!(out.contains("[… cut: the file has"));
        assert!(out.len() < text.len());
    }
}

//! A session directory's metadata (`session.toml`) and the fresh copy of its project each run
//! works on: the pristine tree (inline `project/`, a fetched corpus project, or the user's own
//! directory), the session's patch applied, made a git repository when asked.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Where `bench/corpus/fetch.sh` puts the pristine projects (`projects/<name>/`).
pub const DEFAULT_CORPUS: &str = "/var/tmp/shade-corpus";

/// `session.toml`: everything about a session except the conversation (that lives only in
/// the cassettes).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionMeta {
    /// `inline` (the session's `project/` directory) or a name in bench/corpus/projects.toml.
    #[serde(default)]
    pub project: String,
    /// A unified diff in the session directory applied to the project first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// Make the project a git repository with one commit before the session.
    #[serde(default)]
    pub git: bool,
    /// The kind of work (fix-then-test, docs-lookup, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// One line for the reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub about: Option<String>,
    /// Hand-written inputs equivalent to a recorded one (keyed by the recorded input): a
    /// suggestion matching one of them counts as the user's next input (bench/README, "Real
    /// next inputs").
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub equivalents: std::collections::BTreeMap<String, Vec<String>>,
}

impl SessionMeta {
    /// Read `dir/session.toml`; a directory without one (a user's own `shade chat --record`
    /// output) gets empty metadata and needs `--project`.
    pub fn load(dir: &Path) -> Result<Self> {
        let file = dir.join("session.toml");
        if !file.exists() {
            return Ok(Self::default());
        }
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing {}", file.display()))
    }

    /// Write `dir/session.toml`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let text = toml::to_string(self).context("encoding session.toml")?;
        std::fs::write(dir.join("session.toml"), text)
            .with_context(|| format!("writing {}/session.toml", dir.display()))
    }

    /// The pristine tree of the session's project.
    pub fn source(&self, dir: &Path, corpus: &Path, project: Option<&Path>) -> Result<PathBuf> {
        if let Some(p) = project {
            return Ok(p.to_path_buf());
        }
        let src = match self.project.as_str() {
            "" => bail!(
                "{} has no session.toml naming its project: pass --project DIR",
                dir.display()
            ),
            "inline" => dir.join("project"),
            name => corpus.join("projects").join(name),
        };
        if !src.is_dir() {
            bail!(
                "the project of {} is not at {} (for corpus projects run bench/corpus/fetch.sh)",
                dir.display(),
                src.display()
            );
        }
        Ok(src)
    }
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A fresh copy of `source` at `dest` (removed first), `patch` applied (`patch -p1`), a git
/// repository with one commit when `git`; returns `dest` canonicalised.
pub fn materialise(source: &Path, patch: Option<&Path>, git: bool, dest: &Path) -> Result<PathBuf> {
    if dest.exists() {
        std::fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    std::fs::create_dir_all(dest)?;
    let mut from = source.as_os_str().to_owned();
    from.push("/.");
    run(Command::new("cp").arg("-a").arg(&from).arg(dest))?;
    if let Some(p) = patch {
        run(Command::new("patch")
            .args(["-p1", "--batch", "--quiet", "-d"])
            .arg(dest)
            .arg("-i")
            .arg(p))?;
    }
    if git && !dest.join(".git").exists() {
        let git = |args: &[&str]| {
            let mut c = Command::new("git");
            c.args([
                "-c",
                "user.name=shade-bench",
                "-c",
                "user.email=bench@localhost",
            ])
            .args(args)
            .current_dir(dest);
            run(&mut c)
        };
        git(&["init", "-q"])?;
        // The sessions' own commits need an identity a fresh machine may not have.
        git(&["config", "user.name", "shade-bench"])?;
        git(&["config", "user.email", "bench@localhost"])?;
        git(&["add", "-A"])?;
        git(&["commit", "-qm", "the project before the session"])?;
    }
    Ok(std::fs::canonicalize(dest)?)
}

/// Write an inline project's files (with their executable bits) under `dir`.
pub fn write_inline(
    files: &std::collections::BTreeMap<String, String>,
    executable: &[String],
    dir: &Path,
) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for (name, content) in files {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, content).with_context(|| format!("writing {}", p.display()))?;
        let mode = if executable.contains(name) {
            0o755
        } else {
            0o644
        };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

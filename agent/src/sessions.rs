//! Saved conversations, so a chat can be picked up again (`shade chat --continue`,
//! `--resume ID`) after the terminal closed, the machine rebooted or the user simply left.
//!
//! One JSON file per conversation under `$SHADE_STATE_DIR/sessions/`, rewritten atomically
//! (temp file, fsync, rename) after every turn, so a crash leaves the previous turn's copy,
//! never half a file. Files name the project they belong to; listing filters by it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::llm::Message;

/// Conversations kept per state directory; the oldest beyond this are removed on save.
pub const KEEP: usize = 200;

/// Why a saved conversation could not be found, read or written.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No saved conversation of this project matches.
    #[error("no saved conversation {0} for this project (`shade chat --sessions` lists them)")]
    NotFound(String),
    /// A prefix names several conversations.
    #[error("{0} names more than one saved conversation: {1}")]
    Ambiguous(String, String),
    /// The project has none at all.
    #[error("no saved conversation for this project yet")]
    NoneYet,
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A file that is not a saved conversation.
    #[error("{path}: not a saved conversation: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// A conversation as saved.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SavedSession {
    /// Its name: the start time and a random suffix (`20261123-181502-7f3a`).
    pub id: String,
    /// The project directory as the user knows it.
    pub project: PathBuf,
    /// Milliseconds since the epoch.
    pub created: u64,
    /// Milliseconds since the epoch, at the last save (orders the list).
    pub updated: u64,
    /// The main model at the last save.
    pub model: String,
    /// Whether it ran in a branch (`--shadow`): its edits were only in the project if accepted.
    #[serde(default)]
    pub shadow: bool,
    /// The conversation, system prompt first.
    pub messages: Vec<Message>,
}

impl SavedSession {
    /// A new, empty conversation of `project`.
    pub fn new(project: &Path, model: &str, shadow: bool) -> Self {
        let now = now_ms();
        Self {
            id: new_id(now / 1000),
            project: project.to_path_buf(),
            created: now,
            updated: now,
            model: model.to_string(),
            shadow,
            messages: Vec::new(),
        }
    }

    /// The first thing the user asked: what the list shows.
    pub fn title(&self) -> String {
        self.user_prompts().next().map(one_line).unwrap_or_default()
    }

    /// The user's prompts in order.
    pub fn user_prompts(&self) -> impl Iterator<Item = &str> {
        self.messages.iter().filter_map(|m| match m {
            Message::User { content } => Some(content.as_str()),
            _ => None,
        })
    }
}

/// Where conversations are kept.
#[derive(Debug, Clone)]
pub struct SessionStore {
    dir: PathBuf,
}

impl SessionStore {
    /// The store under `state_root` (`$SHADE_STATE_DIR`).
    pub fn new(state_root: &Path) -> Self {
        Self {
            dir: state_root.join("sessions"),
        }
    }

    /// Write `session` atomically (stamping its update time) and drop the oldest beyond
    /// [`KEEP`].
    pub fn save(&self, session: &mut SavedSession) -> Result<(), SessionError> {
        session.updated = now_ms().max(session.updated + 1);
        let io = |path: &Path, source| SessionError::Io {
            path: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        let path = self.path_of(&session.id);
        let text = serde_json::to_vec(session).map_err(|source| SessionError::Corrupt {
            path: path.clone(),
            source,
        })?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| io(&self.dir, e))?;
        tmp.write_all(&text).map_err(|e| io(tmp.path(), e))?;
        tmp.as_file().sync_all().map_err(|e| io(tmp.path(), e))?;
        tmp.persist(&path).map_err(|e| io(&path, e.error))?;
        self.prune();
        Ok(())
    }

    /// The project's conversations, most recently updated first (unreadable files skipped).
    pub fn list(&self, project: &Path) -> Vec<SavedSession> {
        let mut all: Vec<SavedSession> = self
            .files()
            .into_iter()
            .filter_map(|p| read(&p).ok())
            .filter(|s| s.project == project)
            .collect();
        all.sort_by(|a, b| b.updated.cmp(&a.updated).then(b.id.cmp(&a.id)));
        all
    }

    /// The project's most recent conversation.
    pub fn latest(&self, project: &Path) -> Result<SavedSession, SessionError> {
        self.list(project)
            .into_iter()
            .next()
            .ok_or(SessionError::NoneYet)
    }

    /// The project's conversation whose id is or starts with `id`.
    pub fn find(&self, project: &Path, id: &str) -> Result<SavedSession, SessionError> {
        let matching: Vec<SavedSession> = self
            .list(project)
            .into_iter()
            .filter(|s| s.id.starts_with(id))
            .collect();
        match matching.len() {
            0 | 1 => matching
                .into_iter()
                .next()
                .ok_or_else(|| SessionError::NotFound(id.to_string())),
            _ => {
                if let Some(exact) = matching.iter().find(|s| s.id == id) {
                    return Ok(exact.clone());
                }
                let ids: Vec<&str> = matching.iter().map(|s| s.id.as_str()).collect();
                Err(SessionError::Ambiguous(id.to_string(), ids.join(", ")))
            }
        }
    }

    fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn files(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Remove the oldest files beyond [`KEEP`] (ids sort by start time).
    fn prune(&self) {
        let mut files = self.files();
        if files.len() <= KEEP {
            return;
        }
        files.sort();
        for old in &files[..files.len() - KEEP] {
            let _ = std::fs::remove_file(old);
        }
    }
}

fn read(path: &Path) -> Result<SavedSession, SessionError> {
    let bytes = std::fs::read(path).map_err(|source| SessionError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| SessionError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn new_id(now: u64) -> String {
    let local = chrono::DateTime::from_timestamp(now as i64, 0)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y%m%d-%H%M%S")
                .to_string()
        })
        .unwrap_or_else(|| now.to_string());
    format!("{local}-{:04x}", fastrand::u16(..))
}

/// The first line of `text`, at most 72 characters (71 and `…` when cut).
pub fn one_line(text: &str) -> String {
    crate::llm::error::truncate_chars(text.lines().next().unwrap_or("").trim(), 71)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.into(),
        }
    }

    #[test]
    fn saves_lists_by_project_and_finds_by_prefix() {
        let state = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let (a, b) = (Path::new("/p/a"), Path::new("/p/b"));
        let mut first = SavedSession::new(a, "m", false);
        first.id = "20261123-100000-0001".into();
        first.messages = vec![user("why does test.sh fail?\nmore")];
        store.save(&mut first).unwrap();
        let mut other = SavedSession::new(b, "m", false);
        store.save(&mut other).unwrap();
        let mut second = SavedSession::new(a, "m", true);
        second.id = "20261123-110000-0002".into();
        second.messages = vec![user("fix it")];
        store.save(&mut second).unwrap();

        let listed: Vec<String> = store.list(a).into_iter().map(|s| s.id).collect();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0], "20261123-110000-0002");
        assert_eq!(store.latest(a).unwrap().title(), "fix it");
        let found = store.find(a, "20261123-10").unwrap();
        assert_eq!(found.title(), "why does test.sh fail?");
        assert_eq!(found.messages, first.messages);
        assert!(matches!(
            store.find(a, "20261123"),
            Err(SessionError::Ambiguous(..))
        ));
        assert!(matches!(
            store.find(a, "nope"),
            Err(SessionError::NotFound(_))
        ));
        assert!(matches!(
            store.latest(Path::new("/p/c")),
            Err(SessionError::NoneYet)
        ));
        // No temp files are left beside the saved ones.
        assert_eq!(
            std::fs::read_dir(state.path().join("sessions"))
                .unwrap()
                .count(),
            3
        );
    }

    #[test]
    fn a_corrupt_file_is_skipped_in_lists() {
        let state = tempfile::tempdir().unwrap();
        let store = SessionStore::new(state.path());
        let mut s = SavedSession::new(Path::new("/p"), "m", false);
        store.save(&mut s).unwrap();
        std::fs::write(state.path().join("sessions/broken.json"), "{").unwrap();
        assert_eq!(store.list(Path::new("/p")).len(), 1);
    }

    #[test]
    fn long_titles_are_cut() {
        let t = one_line(&"x".repeat(100));
        assert_eq!(t.chars().count(), 72);
        assert!(t.ends_with('…'));
    }
}

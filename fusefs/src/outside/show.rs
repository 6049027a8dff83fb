//! Showing outside changes: one line each (many under one directory grouped), and diffs.

use super::{OutsideChange, OutsideChanges, OutsideKind};
use crate::quote::quote_path;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Files larger than this are not diffed (the diff says so).
pub const DIFF_MAX: u64 = 1 << 20;

/// At least this many changes under one directory are shown as one line.
pub const GROUP_MIN: usize = 20;

/// The user's home for display (`$HOME` when absolute, else the password database's).
pub fn home_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").map(PathBuf::from) {
        if h.is_absolute() && h != Path::new("/") {
            return Some(h);
        }
    }
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.dir)
        .filter(|d| d.is_absolute() && d != Path::new("/"))
}

/// `path` quoted for a terminal, with `~` for `home`.
pub fn display_path(path: &Path, home: Option<&Path>) -> String {
    if let Some(h) = home {
        if let Ok(rest) = path.strip_prefix(h) {
            if rest.as_os_str().is_empty() {
                return "~".into();
            }
            return format!("~/{}", quote_path(rest));
        }
    }
    quote_path(path).into_owned()
}

/// `n` with thousands separators.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count for people: `512 bytes`, `12 kB`, `52 MB`.
pub fn human_size(n: u64) -> String {
    match n {
        0..=999 => format!("{n} bytes"),
        1_000..=999_999 => format!("{} kB", n / 1_000),
        1_000_000..=999_999_999 => format!("{} MB", n / 1_000_000),
        _ => format!("{:.1} GB", n as f64 / 1e9),
    }
}

impl OutsideChange {
    /// One line: the kind letter, the path (`~` for the home), what else changed.
    pub fn line(&self, home: Option<&Path>) -> String {
        let slash = if self.is_dir { "/" } else { "" };
        let mut s = format!(
            "{} {}{slash}",
            self.kind.letter(),
            display_path(&self.path, home)
        );
        if let (Some(a), Some(b)) = (self.mode_old, self.mode_new) {
            if a & 0o7777 != b & 0o7777 && a & libc::S_IFMT == b & libc::S_IFMT {
                s.push_str(&format!(" (mode {:o} -> {:o})", a & 0o7777, b & 0o7777));
            }
        }
        if self.foreign_owner {
            s.push_str(" (owned by an id outside the sandbox)");
        } else if let (Some(a), Some(b)) = (self.owner_old, self.owner_new) {
            if a != b {
                s.push_str(&format!(
                    " (owner {}:{} -> {}:{})",
                    a.uid, a.gid, b.uid, b.gid
                ));
            }
        }
        if self.xattrs_changed {
            s.push_str(" (extended attributes)");
        }
        if self.host_hidden {
            // Keeping it writes what the command wrote over a hidden file or a sanitized
            // copy: the host's credentials in it would be gone.
            s.push_str(" (over a credential hidden from the command)");
        }
        if self.kept {
            s.push_str(" [kept]");
        }
        s
    }
}

/// The directory a change is grouped under in listings, if any: the shallowest directory
/// above it with at least [`GROUP_MIN`] changes, never `/`, the home, or a directory right
/// under `/` (`/etc`, `/usr`).
fn group_dirs(changes: &[OutsideChange], home: Option<&Path>) -> BTreeMap<PathBuf, usize> {
    let mut counts: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for c in changes {
        for a in c.path.ancestors().skip(1) {
            *counts.entry(a.to_path_buf()).or_default() += 1;
        }
    }
    let allowed = |d: &Path| {
        d.components().count() > 2 && Some(d) != home && home.is_none_or(|h| !h.starts_with(d))
    };
    let mut groups = BTreeMap::new();
    for c in changes {
        let shallowest = c
            .path
            .ancestors()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .find(|a| allowed(a) && counts.get(*a).copied().unwrap_or(0) >= GROUP_MIN);
        if let Some(g) = shallowest {
            *groups.entry(g.to_path_buf()).or_default() += 1;
        }
    }
    groups
}

impl OutsideChanges {
    /// The human listing: one line per change, or per directory holding many
    /// ("~/.cargo/registry/: 1,204 added, 52 MB"). Empty when nothing changed.
    pub fn lines(&self, home: Option<&Path>) -> Vec<String> {
        let groups = group_dirs(&self.changes, home);
        let mut out = Vec::new();
        let mut shown_group: Option<&Path> = None;
        for c in &self.changes {
            let g = groups.keys().find(|g| c.path.starts_with(g));
            match g {
                Some(g) if shown_group == Some(g.as_path()) => {}
                Some(g) => {
                    shown_group = Some(g.as_path());
                    out.push(self.group_line(g, home));
                }
                None => out.push(c.line(home)),
            }
        }
        out
    }

    fn group_line(&self, g: &Path, home: Option<&Path>) -> String {
        let under: Vec<&OutsideChange> = self
            .changes
            .iter()
            .filter(|c| c.path.starts_with(g))
            .collect();
        let files: Vec<&&OutsideChange> = under.iter().filter(|c| !c.is_dir).collect();
        // Counted in files ("1,204 files added"); directories only when there are no files.
        let (counted, noun): (Vec<&OutsideChange>, &str) = if files.is_empty() {
            (under.clone(), "directories")
        } else {
            (files.into_iter().copied().collect(), "files")
        };
        let mut by_kind: BTreeMap<&'static str, usize> = BTreeMap::new();
        for c in &counted {
            *by_kind.entry(c.kind.word()).or_default() += 1;
        }
        let bytes: u64 = under.iter().map(|c| c.size_new.unwrap_or(0)).sum();
        let kept = under.iter().filter(|c| c.kept).count();
        let kinds: Vec<String> = by_kind
            .iter()
            .map(|(w, n)| format!("{} {noun} {w}", thousands(*n)))
            .collect();
        let mut s = format!(
            "{}/: {}, {}",
            display_path(g, home),
            kinds.join(", "),
            human_size(bytes)
        );
        if kept > 0 {
            s.push_str(&format!(" [{} kept]", thousands(kept)));
        }
        s
    }

    /// Unified diffs of every change, paths with `~`: text diffs for text files up to
    /// [`DIFF_MAX`], else the kind and sizes.
    pub fn diff(&self, home: Option<&Path>) -> String {
        self.changes.iter().map(|c| c.diff(home)).collect()
    }
}

/// Up to [`DIFF_MAX`] bytes of a regular file or a symlink's target (`Err` says why not).
fn read_side(path: &Path, size: Option<u64>, target: Option<&PathBuf>) -> Result<Vec<u8>, String> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(t) = target {
        return Ok(t.as_os_str().as_bytes().to_vec());
    }
    if size.is_some_and(|s| s > DIFF_MAX) {
        return Err(format!(
            "larger than 1 MiB ({}), not diffed",
            human_size(size.unwrap_or(0))
        ));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("unreadable: {e}"))?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Err("not a regular file".into());
    }
    let mut buf = Vec::new();
    f.take(DIFF_MAX + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("unreadable: {e}"))?;
    if buf.len() as u64 > DIFF_MAX {
        return Err("larger than 1 MiB, not diffed".into());
    }
    Ok(buf)
}

fn kind_of(mode: Option<u32>) -> &'static str {
    match mode.map(|m| m & libc::S_IFMT) {
        None => "nothing",
        Some(libc::S_IFREG) => "file",
        Some(libc::S_IFDIR) => "directory",
        Some(libc::S_IFLNK) => "symlink",
        Some(libc::S_IFIFO) => "fifo",
        Some(libc::S_IFSOCK) => "socket",
        Some(_) => "device",
    }
}

impl OutsideChange {
    /// This change as a diff: a unified text diff, or one line saying what changed.
    pub fn diff(&self, home: Option<&Path>) -> String {
        let shown = display_path(&self.path, home);
        let mut head = format!("diff --shade-outside {shown}\n");
        if self.host_hidden {
            head.push_str(
                "(a credential: hidden from the command or shown to it sanitized; \
                 the host's file is not shown)\n",
            );
        }
        let text_kind = |m: Option<u32>| {
            matches!(
                m.map(|m| m & libc::S_IFMT),
                Some(libc::S_IFREG) | Some(libc::S_IFLNK) | None
            )
        };
        if self.is_dir && self.kind != OutsideKind::Deleted
            || self
                .mode_old
                .is_some_and(|m| m & libc::S_IFMT == libc::S_IFDIR)
        {
            return format!("{head}{} directory {}\n", capital(self.kind.word()), shown);
        }
        if !text_kind(self.mode_old) || !text_kind(self.mode_new) {
            return format!(
                "{head}{}: {} -> {}\n",
                capital(self.kind.word()),
                kind_of(self.mode_old),
                kind_of(self.mode_new)
            );
        }
        let old = match self.mode_old {
            None => Ok(Vec::new()),
            Some(_) if self.host_hidden => Ok(Vec::new()),
            Some(_) => read_side(&self.path, self.size_old, self.target_old.as_ref()),
        };
        let new = match (&self.upper, self.metacopy) {
            (None, _) => Ok(Vec::new()),
            (Some(_), true) if self.host_hidden => Err("only its metadata changed".into()),
            (Some(_), true) => read_side(&self.path, self.size_new, self.target_new.as_ref()),
            (Some(u), false) => read_side(u, self.size_new, self.target_new.as_ref()),
        };
        let (old, new) = match (old, new) {
            (Ok(o), Ok(n)) => (o, n),
            (Err(e), _) | (_, Err(e)) => {
                return format!(
                    "{head}{}, {} -> {}: {e}\n",
                    capital(self.kind.word()),
                    self.size_old.map_or("absent".into(), human_size),
                    self.size_new.map_or("absent".into(), human_size),
                )
            }
        };
        if old.contains(&0) || new.contains(&0) {
            return format!(
                "{head}Binary, {} -> {}\n",
                self.size_old.map_or("absent".into(), human_size),
                self.size_new.map_or("absent".into(), human_size),
            );
        }
        let (old, new) = (String::from_utf8_lossy(&old), String::from_utf8_lossy(&new));
        let a = if self.mode_old.is_some() && !self.host_hidden {
            format!("a:{shown}")
        } else {
            "/dev/null".into()
        };
        let b = if self.mode_new.is_some() {
            format!("b:{shown}")
        } else {
            "/dev/null".into()
        };
        let d = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
        let text = d.unified_diff().header(&a, &b).to_string();
        let text = crate::quote::visible_controls(&text).into_owned();
        if text.is_empty() {
            let mut s = head;
            if let (Some(o), Some(n)) = (self.mode_old, self.mode_new) {
                if o != n {
                    s.push_str(&format!("mode {:o} -> {:o}\n", o & 0o7777, n & 0o7777));
                }
            }
            if self.owner_old != self.owner_new {
                s.push_str("owner changed\n");
            }
            if self.xattrs_changed {
                s.push_str("extended attributes changed\n");
            }
            return s;
        }
        format!("{head}{text}")
    }
}

fn capital(w: &str) -> String {
    let mut c = w.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

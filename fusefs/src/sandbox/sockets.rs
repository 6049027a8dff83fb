//! The unix sockets a confined command may reach outside its branch (issue 29).
//!
//! A service that acts for whoever connects (systemd, the system and session buses, docker,
//! a tmux server, an ssh agent) would write for the command outside any layer. So no host
//! socket is connectable from a sandbox: through the outside layer's overlays a socket file
//! is another inode, the plain user's rebuilt `/` leaves sockets out, and Landlock scopes
//! abstract ones (see outside.rs, scope.rs). The user names the ones to reach — `shade run
//! --allow-socket PATH`, `[sandbox] allow_sockets` (with `$VAR`, e.g. `$SSH_AUTH_SOCK`) —
//! and each is bound into the sandbox at its path, the real socket (as root through an
//! idmapped mount, so the sandbox's root may connect where host root may).

use std::path::{Path, PathBuf};
use std::sync::RwLock;

static ALLOWED: RwLock<Vec<PathBuf>> = RwLock::new(Vec::new());
static UNRESOLVED: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Notes an allowed socket whose path could not be made (an unset `$VAR`): it allows
/// nothing, and `shade doctor` says so.
pub fn note_unresolved(why: String) {
    let mut list = UNRESOLVED
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !list.contains(&why) {
        list.push(why);
    }
}

/// What [`note_unresolved`] noted.
pub fn unresolved_sockets() -> Vec<String> {
    UNRESOLVED
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Adds `paths` to the sockets every later command of this process may reach.
pub fn allow_sockets(paths: impl IntoIterator<Item = PathBuf>) {
    let mut list = ALLOWED
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for p in paths {
        if !list.contains(&p) {
            list.push(p);
        }
    }
}

/// The sockets allowed so far (as given, expanded).
pub fn allowed_sockets() -> Vec<PathBuf> {
    ALLOWED
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// `$VAR`, `${VAR}` and a leading `~/` expanded in a configured socket path. `Err` names
/// what is missing (an unset variable: nothing to allow) or says it is not absolute.
pub fn expand(text: &str) -> Result<PathBuf, String> {
    let mut out = String::new();
    let mut rest = text;
    if let Some(tail) = rest.strip_prefix("~/") {
        let home = std::env::var("HOME")
            .ok()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{text}: $HOME is not set"))?;
        out.push_str(&home);
        out.push('/');
        rest = tail;
    }
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = match after.strip_prefix('{') {
            Some(inner) => match inner.find('}') {
                Some(end) => (&inner[..end], &inner[end + 1..]),
                None => return Err(format!("{text}: unclosed ${{")),
            },
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        if name.is_empty() {
            return Err(format!("{text}: `$` without a variable name"));
        }
        let value = std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("{text}: ${name} is not set"))?;
        out.push_str(&value);
        rest = tail;
    }
    out.push_str(rest);
    let path = PathBuf::from(out);
    if !path.is_absolute() {
        return Err(format!("{text}: not an absolute path"));
    }
    Ok(path)
}

/// What an allowed socket is now, for `shade doctor` and the log: `Ok` with its real path
/// when it is a socket, else why it is not bound.
pub fn check(path: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::FileTypeExt;
    let real = std::fs::canonicalize(path).map_err(|e| format!("{e}"))?;
    let meta = std::fs::metadata(&real).map_err(|e| format!("{e}"))?;
    if !meta.file_type().is_socket() {
        return Err("not a socket".into());
    }
    Ok(real)
}

/// The allowed sockets that exist, by their real paths (a missing one is said in the log).
/// `real_writes`: the directories commands write for real (the project, through accepts;
/// SHADE_SHARE ones): an allowed path that passes through a symlink in one of them is not
/// bound, since a command could have planted that link to send the allow to another socket
/// (the session bus, docker's, idmapped as root).
pub(crate) fn present(real_writes: &[&Path]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in allowed_sockets() {
        match planted_link(&p, real_writes).and_then(|()| check(&p)) {
            Ok(real) if !out.contains(&real) => out.push(real),
            Ok(_) => {}
            Err(why) => tracing::info!("allowed socket {} not bound: {why}", p.display()),
        }
    }
    out
}

/// `Err` when resolving `path` meets a symlink inside one of `real_writes` (which must be
/// canonical), or cannot be resolved.
fn planted_link(path: &Path, real_writes: &[&Path]) -> Result<(), String> {
    use std::path::Component;
    let mut todo: Vec<std::ffi::OsString> = Vec::new();
    let push = |todo: &mut Vec<std::ffi::OsString>, p: &Path, at: &mut PathBuf| {
        let mut parts: Vec<std::ffi::OsString> = Vec::new();
        for c in p.components() {
            match c {
                Component::RootDir => {
                    *at = PathBuf::from("/");
                    parts.clear();
                }
                Component::Normal(n) => parts.push(n.to_os_string()),
                Component::ParentDir => parts.push("..".into()),
                Component::CurDir | Component::Prefix(_) => {}
            }
        }
        // `todo` is a stack: the first component last.
        todo.extend(parts.into_iter().rev());
    };
    let mut at = PathBuf::from("/");
    push(&mut todo, path, &mut at);
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            at.pop();
            continue;
        }
        let next = at.join(&name);
        let meta =
            std::fs::symlink_metadata(&next).map_err(|e| format!("{}: {e}", next.display()))?;
        if !meta.file_type().is_symlink() {
            at = next;
            continue;
        }
        if let Some(dir) = real_writes.iter().find(|d| next.starts_with(d)) {
            return Err(format!(
                "{} is a symlink in {}, which commands write for real",
                next.display(),
                dir.display()
            ));
        }
        links += 1;
        if links > 40 {
            return Err(format!("{}: too many symlinks", path.display()));
        }
        let target = std::fs::read_link(&next).map_err(|e| format!("{}: {e}", next.display()))?;
        push(&mut todo, &target, &mut at);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn expands_variables_and_home() {
        std::env::set_var("SHADE_TEST_SOCK_DIR", "/run/x");
        assert_eq!(
            expand("$SHADE_TEST_SOCK_DIR/a.sock").unwrap(),
            PathBuf::from("/run/x/a.sock")
        );
        assert_eq!(
            expand("${SHADE_TEST_SOCK_DIR}b/c").unwrap(),
            PathBuf::from("/run/xb/c")
        );
        assert!(expand("$SHADE_TEST_SOCK_UNSET_VAR").is_err());
        assert!(expand("relative.sock").is_err());
        assert!(expand("/a/${unclosed").is_err());
    }

    #[test]
    fn symlinks_commands_write_are_not_followed() {
        let dir = std::env::temp_dir().join(format!("shade-sock-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (shared, home) = (dir.join("shared"), dir.join("home"));
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::create_dir_all(home.join("real")).unwrap();
        let dir = std::fs::canonicalize(&dir).unwrap();
        let (shared, home) = (dir.join("shared"), dir.join("home"));
        std::os::unix::fs::symlink(home.join("real/x.sock"), shared.join("a.sock")).unwrap();
        std::os::unix::fs::symlink("real", home.join("link")).unwrap();
        std::os::unix::fs::symlink("../shared", home.join("up")).unwrap();
        let w = [shared.as_path()];
        assert!(planted_link(&shared.join("a.sock"), &w).is_err());
        assert!(planted_link(&home.join("up/a.sock"), &w).is_err());
        // A link outside them is followed; the socket not existing is an error too.
        assert!(planted_link(&home.join("link"), &w).is_ok());
        assert!(planted_link(&home.join("link/x.sock"), &w).is_err());
        std::fs::write(home.join("real/x.sock"), "").unwrap();
        assert!(planted_link(&home.join("link/x.sock"), &w).is_ok());
        assert!(planted_link(&home.join("link/../link/x.sock"), &w).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

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

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};
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
    let real = std::fs::canonicalize(path).map_err(|e| format!("{e}"))?;
    let meta = std::fs::metadata(&real).map_err(|e| format!("{e}"))?;
    if !meta.file_type().is_socket() {
        return Err("not a socket".into());
    }
    Ok(real)
}

/// An allowed socket as checked: its real path (no symlink on it when it was checked) and
/// the socket itself, held open (`O_PATH`) so that its identity stays its own until the
/// command's stage has bound it (see [`StagedSocket::bind`]).
#[derive(Debug)]
pub(crate) struct Pinned {
    /// The path it was found at, every symlink resolved.
    pub real: PathBuf,
    dev: u64,
    ino: u64,
    fd: OwnedFd,
}

impl Pinned {
    /// The socket to bind at `target` (a file in the command's stage).
    pub(crate) fn staged(self, target: CString) -> Result<StagedSocket, String> {
        Ok(StagedSocket {
            real: CString::new(self.real.as_os_str().as_bytes())
                .map_err(|_| format!("{}: a NUL in the path", self.real.display()))?,
            target,
            dev: self.dev,
            ino: self.ino,
            _pin: self.fd,
        })
    }
}

/// An allowed socket for the command's stage (root's or a plain user's): bound in the
/// pre-exec hook by [`StagedSocket::bind`].
#[derive(Debug)]
pub(crate) struct StagedSocket {
    real: CString,
    /// The file in the stage it is bound on (bubblewrap then binds that at `real`).
    pub target: CString,
    dev: u64,
    ino: u64,
    _pin: OwnedFd,
}

impl StagedSocket {
    /// In the pre-exec hook, in the command's mount namespace (async-signal-safe): opens
    /// the real path again without following any symlink (`openat2` `RESOLVE_NO_SYMLINKS`),
    /// and only if that is the very socket checked (same device and inode; the check's fd
    /// keeps the inode from being reused) binds it, read-only, at `target` from that fd
    /// (`open_tree`, idmapped to `userns` when given and the file system allows). Whatever
    /// swapped the path since the check (a symlink, another socket) finds nothing bound:
    /// the command sees an empty file there. Whether it was bound.
    ///
    /// # Safety
    /// Between fork and exec: raw system calls only.
    pub(crate) unsafe fn bind(&self, userns: Option<RawFd>) -> bool {
        let mut how: libc::open_how = std::mem::zeroed();
        how.flags = (libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
        how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
        let fd = libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            self.real.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        ) as libc::c_int;
        if fd < 0 {
            return false;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let same = libc::fstat(fd, &mut st) == 0
            && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
            && st.st_dev == self.dev
            && st.st_ino == self.ino;
        let tree = if same {
            libc::syscall(
                libc::SYS_open_tree,
                fd,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint
                    | libc::OPEN_TREE_CLONE
                    | libc::OPEN_TREE_CLOEXEC as libc::c_uint,
            ) as libc::c_int
        } else {
            -1
        };
        libc::close(fd);
        if tree < 0 {
            return false;
        }
        // Read-only (connect needs no write access): through a writable mount the sandbox's
        // root (host root there) could chmod or chown the host's socket for real. Idmapped
        // so that the sandbox's root may connect where host root may; a file system that
        // cannot be idmapped: the socket as it is (its owner's permissions then decide).
        let set = |extra: u64, ns: RawFd| {
            let mut attr: libc::mount_attr = std::mem::zeroed();
            attr.attr_set = libc::MOUNT_ATTR_RDONLY | extra;
            attr.userns_fd = ns as u64;
            libc::syscall(
                libc::SYS_mount_setattr,
                tree,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint,
                &attr as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            ) == 0
        };
        let attrs = match userns {
            Some(ns) => set(libc::MOUNT_ATTR_IDMAP, ns) || set(0, 0),
            None => set(0, 0),
        };
        let ok = attrs
            && libc::syscall(
                libc::SYS_move_mount,
                tree,
                c"".as_ptr(),
                libc::AT_FDCWD,
                self.target.as_ptr(),
                libc::MOVE_MOUNT_F_EMPTY_PATH as libc::c_uint,
            ) == 0;
        libc::close(tree);
        ok
    }
}

/// The allowed sockets that exist, pinned (a missing one is said in the log).
/// `real_writes`: the directories commands write for real (the project, through accepts;
/// SHADE_SHARE ones): an allowed path that passes through a symlink in one of them is not
/// bound, since a command could have planted that link to send the allow to another socket
/// (the session bus, docker's, idmapped as root). The path is resolved one component at a
/// time from directory fds (see [`pin`]), so the socket found is the one the walk checked.
pub(crate) fn present(real_writes: &[&Path]) -> Vec<Pinned> {
    let mut out: Vec<Pinned> = Vec::new();
    for p in allowed_sockets() {
        match pin(&p, real_writes) {
            Ok(s) if !out.iter().any(|o| (o.dev, o.ino) == (s.dev, s.ino)) => out.push(s),
            Ok(_) => {}
            Err(why) => tracing::info!("allowed socket {} not bound: {why}", p.display()),
        }
    }
    out
}

/// `path` resolved from `/` one component at a time, each opened `O_PATH | O_NOFOLLOW`
/// from its directory's fd: a symlink met inside one of `real_writes` (canonical) is
/// refused, others are followed (at most 40). The end must be a socket with one link (a
/// hard link is another way to send the allow elsewhere).
fn pin(path: &Path, real_writes: &[&Path]) -> Result<Pinned, String> {
    use std::os::unix::fs::MetadataExt;
    let open = |dir: Option<&OwnedFd>, name: &std::ffi::OsStr| -> Result<OwnedFd, String> {
        let c = CString::new(name.as_bytes()).map_err(|_| "a NUL in the path".to_string())?;
        let at = dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
        // SAFETY: openat(2) of a NUL-terminated name; the fd returned is ours.
        let fd = unsafe {
            libc::openat(
                at,
                c.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        // SAFETY: just opened, owned here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let meta = |fd: &OwnedFd| -> Result<std::fs::Metadata, String> {
        std::fs::File::from(fd.try_clone().map_err(|e| e.to_string())?)
            .metadata()
            .map_err(|e| e.to_string())
    };
    let root = || open(None, std::ffi::OsStr::new("/"));
    let mut todo: Vec<std::ffi::OsString> = Vec::new();
    let push = |todo: &mut Vec<std::ffi::OsString>, p: &Path| -> bool {
        let mut parts: Vec<std::ffi::OsString> = Vec::new();
        let mut absolute = false;
        for c in p.components() {
            match c {
                Component::RootDir => {
                    absolute = true;
                    parts.clear();
                }
                Component::Normal(n) => parts.push(n.to_os_string()),
                Component::ParentDir => parts.push("..".into()),
                Component::CurDir | Component::Prefix(_) => {}
            }
        }
        // `todo` is a stack: the first component last.
        todo.extend(parts.into_iter().rev());
        absolute
    };
    let mut at = PathBuf::from("/");
    let mut dir = root()?;
    push(&mut todo, path);
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            if at.pop() {
                dir = open(Some(&dir), &name)?;
            }
            continue;
        }
        let next = at.join(&name);
        let fd = open(Some(&dir), &name).map_err(|e| format!("{}: {e}", next.display()))?;
        let m = meta(&fd)?;
        if !m.file_type().is_symlink() {
            at = next;
            dir = fd;
            continue;
        }
        if let Some(d) = real_writes.iter().find(|d| next.starts_with(d)) {
            return Err(format!(
                "{} is a symlink in {}, which commands write for real",
                next.display(),
                d.display()
            ));
        }
        links += 1;
        if links > 40 {
            return Err(format!("{}: too many symlinks", path.display()));
        }
        let target = read_link_fd(&fd).map_err(|e| format!("{}: {e}", next.display()))?;
        if push(&mut todo, &target) {
            at = PathBuf::from("/");
            dir = root()?;
        }
    }
    let m = meta(&dir)?;
    if !m.file_type().is_socket() {
        return Err("not a socket".into());
    }
    if m.nlink() != 1 {
        return Err(format!("{} links to the socket (a hard link?)", m.nlink()));
    }
    Ok(Pinned {
        real: at,
        dev: m.dev(),
        ino: m.ino(),
        fd: dir,
    })
}

/// The target of the symlink `fd` (opened `O_PATH | O_NOFOLLOW`) is.
fn read_link_fd(fd: &OwnedFd) -> std::io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: readlinkat(2) with an empty path reads the link `fd` is, into `buf`.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).map_err(|_| std::io::Error::last_os_error())?;
    buf.truncate(n);
    Ok(PathBuf::from(std::ffi::OsString::from_vec(buf)))
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
        let planted = |p: &Path| pin(p, &w).err().is_some_and(|e| e.contains("for real"));
        assert!(planted(&shared.join("a.sock")));
        assert!(planted(&home.join("up/a.sock")));
        // A link outside them is followed; the socket not existing is an error too.
        assert!(pin(&home.join("link/x.sock"), &w).is_err());
        assert!(!planted(&home.join("link/x.sock")));
        let _l = std::os::unix::net::UnixListener::bind(home.join("real/x.sock")).unwrap();
        let p = pin(&home.join("link/x.sock"), &w).unwrap();
        assert_eq!(p.real, home.join("real/x.sock"));
        assert!(pin(&home.join("link/../link/x.sock"), &w).is_ok());
        assert!(pin(&home.join("link"), &w)
            .err()
            .is_some_and(|e| e.contains("not a socket")));
        // A second (hard) link to it is refused.
        std::fs::hard_link(home.join("real/x.sock"), home.join("real/y.sock")).unwrap();
        assert!(pin(&home.join("real/x.sock"), &w).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

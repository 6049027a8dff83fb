//! Every write a confined command makes outside the project lands in its branch's outside
//! layer (issue 29): the command and its branch see it, the host's files stay
//! byte-identical. As root and as the plain user (`shadetest`, made by scripts/setup.sh).
//!
//! These tests need root (to become the plain user, and for the root half), /dev/fuse,
//! bubblewrap, git and python3; they fail loudly where something is missing.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as show;
use common::plain::{copy_of, ids as plain_ids, require_fuse, PLAIN};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Env {
    plain: bool,
    _tmp: tempfile::TempDir,
    project: PathBuf,
    state: PathBuf,
}

fn env(plain: bool) -> Env {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests run as root (they also become the plain user {PLAIN})"
    );
    for tool in ["/usr/bin/python3", "/usr/bin/setpriv", "/usr/bin/git"] {
        assert!(Path::new(tool).exists(), "{tool} is missing");
    }
    let tmp = tempfile::Builder::new()
        .prefix("shade-outside-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let (project, state) = (root.join("project"), root.join("state"));
    for d in [&project, &state] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    if plain {
        require_fuse();
        let (uid, gid) = plain_ids();
        for p in [&root, &project, &state] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        }
    }
    Env {
        plain,
        _tmp: tmp,
        project,
        state,
    }
}

impl Env {
    fn home(&self) -> PathBuf {
        if self.plain {
            nix::unistd::User::from_name(PLAIN).unwrap().unwrap().dir
        } else {
            "/root".into()
        }
    }

    /// `shade run --timeout 120 -- sh -c SCRIPT` as this test's user.
    fn run(&self, script: &str) -> Output {
        // SHADE_OUTSIDE_BIN: the same tests against another build (to show they fail
        // without the outside layer).
        let bin = std::env::var("SHADE_OUTSIDE_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_shade").to_string());
        let bin = bin.as_str();
        let mut c = if self.plain {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args([
                &format!("--reuid={PLAIN}"),
                &format!("--regid={PLAIN}"),
                "--init-groups",
                "--",
            ])
            .arg(copy_of(bin));
            c
        } else {
            Command::new(bin)
        };
        c.args(["run", "--timeout", "120", "--", "sh", "-c", script])
            .env("HOME", self.home())
            .env("SHADE_STATE_DIR", &self.state)
            .env_remove("CARGO_TARGET_DIR")
            .current_dir(&self.project)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn assert_no_mounts_left(&self) {
        // The branch server's pooled connections are its own: it is ended first.
        common::stop_branch_servers(&self.state);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let state = self.state.to_string_lossy().to_string();
        let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&state)).collect();
        assert!(left.is_empty(), "mounts left behind: {left:#?}");
    }
}

/// The branch servers its runs started end before its directories go.
impl Drop for Env {
    fn drop(&mut self) {
        common::stop_branch_servers(&self.state);
    }
}

/// A file's bytes, `None` if it is missing.
fn bytes(p: &Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok()
}

/// Puts a file back as it was (a probe that got out must not harm the machine).
fn restore(p: &Path, was: &Option<Vec<u8>>) {
    if bytes(p) != *was {
        match was {
            Some(b) => std::fs::write(p, b).unwrap(),
            None => {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

#[test]
fn root_writes_outside_the_project_stay_in_the_branch() {
    let e = env(false);
    let home = e.home();
    let (bashrc, gitconfig) = (home.join(".bashrc"), home.join(".gitconfig"));
    let before = (bytes(&bashrc), bytes(&gitconfig));
    let probe = format!("/etc/shade-probe-{}", std::process::id());
    let o = e.run(&format!(
        "id -u; touch {probe} && ls {probe} && echo x >> ~/.bashrc && tail -n 1 ~/.bashrc \
         && git config --global user.name evil && git config --global user.name"
    ));
    let after = (bytes(&bashrc), bytes(&gitconfig));
    let etc_written = Path::new(&probe).exists();
    restore(&bashrc, &before.0);
    restore(&gitconfig, &before.1);
    restore(Path::new(&probe), &None);
    let log = show(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("0\n{probe}\nx\nevil\n"),
        "{log}"
    );
    assert!(!etc_written, "/etc was written\n{log}");
    assert_eq!(after, before, "the home was written\n{log}");
    e.assert_no_mounts_left();
}

#[test]
fn plain_user_writes_outside_the_project_stay_in_the_branch() {
    let e = env(true);
    let bashrc = e.home().join(".bashrc");
    let before = bytes(&bashrc);
    let tmp_probe = format!("/tmp/shade-outside-probe-{}", std::process::id());
    let o = e.run(&format!(
        "echo x >> ~/.bashrc && tail -n 1 ~/.bashrc; \
         (echo y > {tmp_probe}) 2>/dev/null; \
         if touch /etc/shade-probe 2>/dev/null; then echo etc-written; fi"
    ));
    let after = bytes(&bashrc);
    let tmp_written = Path::new(&tmp_probe).exists();
    restore(&bashrc, &before);
    restore(Path::new(&tmp_probe), &None);
    let log = show(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "x\n", "{log}");
    assert_eq!(after, before, "the home was written\n{log}");
    assert!(!tmp_written, "/tmp was written\n{log}");
    e.assert_no_mounts_left();
}

/// A listening unix socket, removed on drop.
struct Listener {
    path: PathBuf,
    _sock: std::os::unix::net::UnixListener,
}

impl Listener {
    fn at(path: PathBuf) -> Listener {
        let _ = std::fs::remove_file(&path);
        let sock = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Anyone may connect: only the sandbox should stop the command.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        Listener { path, _sock: sock }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A service listening on a unix socket outside the project would act for the command
/// outside any layer (issue 29): where writes are captured, such sockets are closed.
fn outside_socket_is_closed(plain: bool) {
    let e = env(plain);
    // As root in /var/tmp (the `/` unit); as the plain user in its home (a unit).
    let dir = if plain { e.home() } else { "/var/tmp".into() };
    let l = Listener::at(dir.join(format!(".shade-outside-sock-{}", std::process::id())));
    let o = e.run(&format!(
        "/usr/bin/python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); \
         s.connect('{}'); print('CONNECTED')\" 2>/dev/null; true",
        l.path.display()
    ));
    let log = show(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("CONNECTED"),
        "the command reached a socket outside the branch\n{log}"
    );
}

#[test]
fn root_outside_socket_is_closed() {
    outside_socket_is_closed(false);
}

#[test]
fn plain_user_outside_socket_is_closed() {
    outside_socket_is_closed(true);
}

/// A plain user's directory with a mount below it is made anew for each command (since
/// h36 assembled in the command's stage and bound by bwrap in one recursive bind, no longer
/// view by view): its file is the host's but read-only (EROFS; its mount ro, nosuid and
/// nodev), no file can be made in it, none of its sockets or FIFOs shows, its symlink
/// does, its subdirectory is a unit (written in the layer, not on the host). The mount
/// below it (a tmpfs made here in a private mount namespace, as a snap is mounted) is an
/// overlay: its file reads, its socket accepts nothing.
#[test]
fn plain_user_rebuilt_directory_is_read_only_and_holds_no_socket() {
    use std::os::unix::net::UnixListener;
    let e = env(true);
    let dir = e.project.parent().unwrap().to_path_buf();
    let (uid, gid) = plain_ids();
    let own = |p: &Path| std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    std::fs::write(dir.join("f.txt"), "host file\n").unwrap();
    own(&dir.join("f.txt"));
    nix::unistd::mkfifo(
        &dir.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    std::os::unix::fs::symlink("f.txt", dir.join("link")).unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/g.txt"), "sub file\n").unwrap();
    for p in ["sub", "sub/g.txt", "fifo"] {
        own(&dir.join(p));
    }
    let script = "cd .. && cat f.txt; \
         (echo x >> f.txt) 2>&1 | grep -q 'Read-only file system' && echo f-erofs; \
         (touch new.txt) 2>&1 | grep -q 'Read-only file system' && echo new-erofs; \
         [ -e fifo ] || [ -p fifo ] || echo no-fifo; \
         [ -e sock ] || [ -S sock ] || echo no-sock; \
         readlink link; cat sub/g.txt; echo y > sub/new.txt && cat sub/new.txt; \
         cat snap/h.txt; \
         for s in sock snap/s.sock; do /usr/bin/python3 -c \"import socket, sys; \
         c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1]); print('CONNECTED')\" \
         $s 2>/dev/null || echo refused $s; done; \
         awk -v p=\"$PWD/f.txt\" '$5 == p {print \"opts\", $6}' /proc/self/mountinfo; \
         awk -v p=\"$PWD/snap\" '$5 == p {print \"opts\", $6}' /proc/self/mountinfo";
    let run_dir = dir.clone();
    // In a thread of its own that leaves the host's mount namespace: the tmpfs, its
    // listener and the command exist only there.
    let (o, wrong) = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
        use nix::mount::{mount, MsFlags};
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .unwrap();
        let snap = run_dir.join("snap");
        std::fs::create_dir(&snap).unwrap();
        mount(
            Some("tmpfs"),
            &snap,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("mode=0755,size=1m"),
        )
        .unwrap();
        std::fs::write(snap.join("h.txt"), "snap file\n").unwrap();
        let listen = |p: &Path| {
            let l = UnixListener::bind(p).unwrap();
            l.set_nonblocking(true).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
            l
        };
        let beside = listen(&run_dir.join("sock"));
        let in_snap = listen(&snap.join("s.sock"));
        let o = e.run(script);
        let mut wrong: Vec<String> = [(&beside, "sock"), (&in_snap, "snap/s.sock")]
            .into_iter()
            .filter(|(l, _)| l.accept().is_ok())
            .map(|(_, name)| format!("{name} was reached"))
            .collect();
        for gone in ["sub/new.txt", "new.txt"] {
            if run_dir.join(gone).exists() {
                wrong.push(format!("{gone} was written on the host"));
            }
        }
        if std::fs::read_to_string(run_dir.join("f.txt")).unwrap() != "host file\n" {
            wrong.push("f.txt was changed on the host".into());
        }
        drop((beside, in_snap));
        nix::mount::umount2(&snap, nix::mount::MntFlags::MNT_DETACH).unwrap();
        drop(e);
        (o, wrong)
    })
    .join()
    .unwrap();
    let log = show(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(wrong.is_empty(), "{wrong:?}\n{log}");
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 13, "{log}");
    assert_eq!(
        lines[..13],
        [
            "host file",
            "f-erofs",
            "new-erofs",
            "no-fifo",
            "no-sock",
            "f.txt",
            "sub file",
            "y",
            "snap file",
            "refused sock",
            "refused snap/s.sock",
            lines.get(11).copied().unwrap_or("missing"),
            lines.get(12).copied().unwrap_or("missing"),
        ],
        "{log}"
    );
    for (line, what) in [(lines[11], "f.txt"), (lines[12], "snap")] {
        let opts: Vec<&str> = line.trim_start_matches("opts ").split(',').collect();
        assert!(line.starts_with("opts "), "{what}: no mount\n{log}");
        for want in ["nosuid", "nodev"] {
            assert!(opts.contains(&want), "{what} is not {want}: {line}\n{log}");
        }
        if what == "f.txt" {
            assert!(opts.contains(&"ro"), "{what} is writable: {line}\n{log}");
        }
    }
}

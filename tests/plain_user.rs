//! `shade run` as a plain user (`shadetest`, made by scripts/setup.sh): FUSE works where
//! `/dev/fuse` is open to everyone (0666, as desktop distributions ship it), and where it is
//! 0600 shade says in one line what is needed (fusermount3 cannot help: it opens the device
//! with the caller's rights). Its own test binary: it changes the mode of `/dev/fuse` for a
//! moment (restored on drop, also on panic), which must not overlap other plain-user tests.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const USER: &str = "shadetest";

/// `/dev/fuse` at another mode until dropped; one test at a time changes it (the tests of
/// this binary run in parallel threads).
struct FuseMode {
    original: u32,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static FUSE_MODE: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl FuseMode {
    fn set(mode: u32) -> FuseMode {
        let guard = FUSE_MODE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let original = std::fs::metadata("/dev/fuse").unwrap().mode() & 0o7777;
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(mode)).unwrap();
        FuseMode {
            original,
            _one_at_a_time: guard,
        }
    }
}

impl Drop for FuseMode {
    fn drop(&mut self) {
        let _ =
            std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(self.original));
    }
}

fn id(flag: &str) -> u32 {
    let o = Command::new("id").args([flag, USER]).output().unwrap();
    assert!(
        o.status.success(),
        "the plain test user {USER} is missing: run scripts/setup.sh as root"
    );
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// `shade ARGS` as the plain user in `project`, with its state under `state`.
fn shade_as_user(bin: &Path, project: &Path, state: &Path, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid", USER, "--regid", USER, "--init-groups", "--"])
        .arg(bin)
        .args(args)
        .current_dir(project)
        .env("HOME", format!("/home/{USER}"))
        .env("SHADE_STATE_DIR", state)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_plain_user_runs_in_a_branch_where_dev_fuse_allows_it() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test switches to the plain user {USER} and must start as root"
    );
    let (uid, gid) = (id("-u"), id("-g"));
    let tmp = tempfile::Builder::new()
        .prefix("shade-plain-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The binary where the user can run it (the build tree may be closed to it).
    let bin = tmp.path().join("shade");
    std::fs::copy(env!("CARGO_BIN_EXE_shade"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let project: PathBuf = tmp.path().join("project");
    let state = tmp.path().join("state");
    for d in [&project, &state] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(uid), Some(gid)).unwrap();
    }

    {
        let _mode = FuseMode::set(0o666);
        let o = shade_as_user(
            &bin,
            &project,
            &state,
            &["run", "--", "sh", "-c", "echo hi > f"],
        );
        assert_eq!(o.status.code(), Some(0), "{}", out(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("A f"),
            "{}",
            out(&o)
        );
        assert!(
            !project.join("f").exists(),
            "without --accept nothing is written"
        );
        let o = shade_as_user(
            &bin,
            &project,
            &state,
            &["run", "--accept", "--", "sh", "-c", "echo hi > f"],
        );
        assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    }
    let f = std::fs::metadata(project.join("f")).unwrap();
    assert_eq!(
        (f.uid(), std::fs::read_to_string(project.join("f")).unwrap()),
        (uid, "hi\n".into())
    );

    let o = {
        let _mode = FuseMode::set(0o600);
        shade_as_user(&bin, &project, &state, &["run", "--", "true"])
    };
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/dev/fuse") && err.contains("0666"), "{err}");
    // The branch server's pooled connections are its own: it is ended first.
    common::stop_branch_servers(&state);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&*state.to_string_lossy()), "{mounts}");
}

/// As the plain user, a kept outside write reaches the user's home with the user's owner and
/// nothing else does. The layer is written by hand from an `--unconfined` command in the
/// runner's format (see tests/outside_cli.rs).
#[test]
fn a_plain_user_keeps_exactly_the_named_outside_path() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test switches to the plain user {USER} and must start as root"
    );
    let (uid, gid) = (id("-u"), id("-g"));
    let tmp = tempfile::Builder::new()
        .prefix("shade-plain-outside-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = tmp.path().join("shade");
    std::fs::copy(env!("CARGO_BIN_EXE_shade"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (project, state, home) = (
        tmp.path().join("project"),
        tmp.path().join("state"),
        tmp.path().join("home"),
    );
    for d in [&project, &state, &home] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(uid), Some(gid)).unwrap();
    }
    for (name, text) in [(".bashrc", "orig\n"), (".gitconfig", "[core]\n")] {
        std::fs::write(home.join(name), text).unwrap();
        std::os::unix::fs::chown(home.join(name), Some(uid), Some(gid)).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let script = format!(
        r#"set -e
d=$(ls -d {state}/branches/*/ | head -n1)outside
mkdir -p "$d/u0/upper"
printf '{{"created_ns":{created},"shift":0,"userxattr":true,"units":[{{"path":"{home}","dir":"u0"}}]}}' > "$d/layer.json"
printf 'orig\nx\n' > "$d/u0/upper/.bashrc"
printf '[core]\n[user]\n\tname = evil\n' > "$d/u0/upper/.gitconfig"
"#,
        state = state.display(),
        home = home.display()
    );
    let o = {
        let _mode = FuseMode::set(0o666);
        Command::new("setpriv")
            .args(["--reuid", USER, "--regid", USER, "--init-groups", "--"])
            .arg(&bin)
            .args(["run", "--unconfined", "--timeout", "60"])
            .args(["--keep-outside", "~/.gitconfig", "--", "sh", "-c", &script])
            .current_dir(&project)
            .env("HOME", &home)
            .env("SHADE_STATE_DIR", &state)
            .env("SHADE_CONFIG", tmp.path().join("config.toml"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("  M ~/.bashrc") && err.contains("  M ~/.gitconfig"),
        "{}",
        out(&o)
    );
    assert!(
        err.contains("kept 1 path outside the project: ~/.gitconfig"),
        "{}",
        out(&o)
    );
    let g = std::fs::metadata(home.join(".gitconfig")).unwrap();
    assert_eq!(
        (
            g.uid(),
            g.gid(),
            std::fs::read_to_string(home.join(".gitconfig")).unwrap()
        ),
        (uid, gid, "[core]\n[user]\n\tname = evil\n".into())
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".bashrc")).unwrap(),
        "orig\n"
    );
}

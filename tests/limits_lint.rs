//! The lint sandbox (an agent session's language server: `shade_lint::exec::command` with
//! `Confinement::speculative`) gets the bounds every command gets: as a plain user too, its
//! private /tmp and /dev/shm have their inodes (and the xattrs tmpfs counts with them)
//! bounded by their size. Before, they were bubblewrap's `--tmpfs --size`, about a million
//! inodes per GiB of RAM whatever the size.
//!
//! The sandbox is started by this test binary itself, run again as the plain user (the
//! `child` test does the work when `SHADE_LIMITS_LINT_CHILD` names its directories).
//! Needs root (to become the plain user, made by scripts/setup.sh), bubblewrap and python3.
#![allow(clippy::unwrap_used)]

mod common;

use common::plain::{ids as plain_ids, PLAIN};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const CHILD: &str = "SHADE_LIMITS_LINT_CHILD";

/// Empty files made in /dev/shm and /tmp until ENOSPC (or 20000), counted.
const FLOOD: &str = r#"
import errno, os
for d in ("/dev/shm", "/tmp"):
    n, err = 0, 0
    try:
        while n < 20000:
            open("%s/f%d" % (d, n), "w").close()
            n += 1
    except OSError as e:
        err = e.errno
    print(d, n, err)
"#;

#[test]
fn lint_sandbox_tmp_inodes_as_plain_user() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test runs as root (it becomes the plain user {PLAIN})"
    );
    let (uid, gid) = plain_ids();
    let tmp = tempfile::Builder::new()
        .prefix("shade-limits-lint-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let (project, mount) = (root.join("project"), root.join("mount"));
    for d in [&project, &mount] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(uid), Some(gid)).unwrap();
    }
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    // This binary where the plain user may run it.
    let exe = root.join("t");
    let me = std::env::current_exe().unwrap();
    if std::fs::hard_link(&me, &exe).is_err() {
        std::fs::copy(&me, &exe).unwrap();
    }
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = Command::new("/usr/bin/setpriv")
        .args([
            &format!("--reuid={PLAIN}"),
            &format!("--regid={PLAIN}"),
            "--init-groups",
            "--",
        ])
        .arg(&exe)
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{}:{}", project.display(), mount.display()))
        .env("HOME", format!("/home/{PLAIN}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let log = common::describe(&o);
    for dir in ["/dev/shm", "/tmp"] {
        let (files, err): (u64, i32) = text
            .lines()
            .find_map(|l| {
                // The harness's "test child ... " may come first on the line.
                let at = l.find(&format!("{dir} "))?;
                let mut w = l[at + dir.len()..].split_whitespace();
                Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
            })
            .unwrap_or_else(|| panic!("no count for {dir}\n{log}"));
        assert!(
            files < 4096 && err == libc::ENOSPC,
            "{files} files (errno {err}) in an 8 MiB {dir} of the lint sandbox\n{log}"
        );
    }
}

/// The plain user's half: starts the language server's sandbox on the directories
/// `SHADE_LIMITS_LINT_CHILD` names, runs the flood in it, prints its counts. Does nothing
/// in an ordinary test run.
#[test]
fn child() {
    let Ok(dirs) = std::env::var(CHILD) else {
        return;
    };
    let (project, mount) = dirs.split_once(':').unwrap();
    let (project, mount) = (PathBuf::from(project), PathBuf::from(mount));
    let view = shade_lint::exec::BranchView {
        project: project.clone(),
        mount,
        runner: None,
    };
    let mut confine = shade_lint::exec::Confinement::speculative(Vec::new());
    confine.isolation.limits.tmp_size = Some(8 << 20);
    confine.isolation.limits.shm_size = Some(8 << 20);
    let argv = ["/usr/bin/python3", "-c", FLOOD].map(String::from);
    let mut cmd = shade_lint::exec::command(&view, &argv, Path::new(&project), &confine).unwrap();
    let o = cmd.output().unwrap();
    print!("{}", String::from_utf8_lossy(&o.stdout));
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
}

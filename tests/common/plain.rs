//! Running shade as the plain test user (`shadetest`, made by `scripts/setup.sh test`),
//! so the same attacks are tried without root.
#![allow(dead_code, clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The unprivileged user the tests become.
pub const PLAIN: &str = "shadetest";

/// Its uid and gid; panics (never skips) when setup.sh has not made it.
pub fn ids() -> (u32, u32) {
    let user = nix::unistd::User::from_name(PLAIN)
        .unwrap()
        .unwrap_or_else(|| panic!("no user {PLAIN:?}: run scripts/setup.sh test (as root)"));
    (user.uid.as_raw(), user.gid.as_raw())
}

/// `bin` where the plain user can run it: the build tree may sit under a 0700 home (CI
/// checks out anywhere). One copy per test process, in /var/tmp; copies of dead test
/// processes are removed.
pub fn copy_of(bin: &str) -> PathBuf {
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        for entry in std::fs::read_dir("/var/tmp").unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("shade-iso-bin-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = PathBuf::from(format!("/var/tmp/shade-iso-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join("shade");
        let _ = std::fs::remove_file(&copy);
        if std::fs::hard_link(bin, &copy).is_err() {
            std::fs::copy(bin, &copy).unwrap();
        }
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    })
    .clone()
}

/// The argv that runs `bin` as the plain user (through setpriv), to put before its args.
pub fn argv(bin: &str) -> Vec<String> {
    vec![
        "/usr/bin/setpriv".into(),
        format!("--reuid={PLAIN}"),
        format!("--regid={PLAIN}"),
        "--init-groups".into(),
        "--".into(),
        copy_of(bin).display().to_string(),
    ]
}

/// Give `path` and everything under it to the plain user.
pub fn chown_tree(path: &Path) {
    let (uid, gid) = ids();
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if std::fs::symlink_metadata(path).unwrap().is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            chown_tree(&e.unwrap().path());
        }
    }
}

/// `/dev/fuse` must be usable by others for a plain user's mount (setup.sh makes it so).
pub fn require_fuse() {
    let fuse = std::fs::metadata("/dev/fuse").expect("/dev/fuse is missing");
    assert!(
        fuse.permissions().mode() & 0o006 == 0o006,
        "/dev/fuse is not usable by {PLAIN} (mode {:o}): run scripts/setup.sh test",
        fuse.permissions().mode()
    );
}

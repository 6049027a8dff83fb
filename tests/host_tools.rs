//! shade runs no program of the project's choosing on the host (red team round 4, #3).
//!
//! The route: rustup's `cargo` is a proxy that obeys the project's `rust-toolchain.toml`,
//! whose `[toolchain] path` names any directory, and execs `<path>/bin/cargo`. A branch's
//! accepted files can plant both; shade used to run `cargo metadata` on the host, in the
//! real project, whenever it made a linter (`shade lint`, and the start of every session
//! with lints). Here a stand-in for the proxy comes first on `PATH` (the plain user has no
//! rustup; the route needs nothing more than this), the planted cargo writes a marker named
//! by the PID namespace it runs in, and the real binary runs `shade lint` and
//! starts an `exec --shadow` session, as root and as the plain user. The marker must not
//! appear; the planted program does run, inside the sandbox, as the project's check.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;
use common::plain::{chown_tree, PLAIN};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use shade_testkit::{FakeLlm, Reply};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Root,
    Plain,
}

/// rustup's proxy as far as the route goes: the nearest `rust-toolchain.toml` with a
/// `path` decides which cargo runs.
const PROXY: &str = r#"#!/bin/sh
d=$PWD
while :; do
  if [ -f "$d/rust-toolchain.toml" ]; then
    p=$(sed -n 's/^path *= *"\(.*\)"$/\1/p' "$d/rust-toolchain.toml")
    [ -n "$p" ] && exec "$p/bin/cargo" "$@"
    break
  fi
  [ "$d" = / ] && break
  d=$(dirname "$d")
done
echo "fake proxy: no toolchain" >&2
exit 101
"#;

struct Setup {
    _tmp: tempfile::TempDir,
    _marks: tempfile::TempDir,
    who: Who,
    project: PathBuf,
    home: PathBuf,
    state: PathBuf,
    bin: PathBuf,
    share: PathBuf,
    /// Written by the planted cargo when it runs in the host's PID namespace.
    marker: PathBuf,
}

fn setup(who: Who) -> Setup {
    common::require_fuse_root();
    let tmp = tempfile::Builder::new()
        .prefix("shade-host-tools-")
        .tempdir_in("/var/tmp")
        .unwrap();
    // Where a host run would leave its mark: beside the test's directory, writable by
    // anyone (a plain user's host run must be able to write it), not shared with the
    // sandbox.
    let marks = tempfile::Builder::new()
        .prefix("shade-host-marks-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(marks.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let root = tmp.path().canonicalize().unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (project, home, state, bin, share) = (
        root.join("project"),
        root.join("home"),
        root.join("state"),
        root.join("bin"),
        root.join("share"),
    );
    for d in [&project, &home, &state, &bin, &share] {
        std::fs::create_dir(d).unwrap();
    }
    // Named by the PID namespace it ran in: the host's, or a sandbox's (whose writes
    // outside the project may reach the host as a plain user's `shade lint`).
    let host_ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let host_ns: String = host_ns
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let marker = marks
        .path()
        .canonicalize()
        .unwrap()
        .join(format!("ran-in-{host_ns}"));
    std::fs::write(
        project.join("Cargo.toml"),
        "[package]\nname = \"p\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::create_dir(project.join("src")).unwrap();
    std::fs::write(project.join("src/main.rs"), "fn main() {}\n").unwrap();
    // What a branch planted: a toolchain directory of its own and the file naming it.
    let tc = project.join(".cache/tc");
    std::fs::create_dir_all(tc.join("bin")).unwrap();
    std::fs::create_dir_all(tc.join("lib")).unwrap();
    let planted = tc.join("bin/cargo");
    std::fs::write(
        &planted,
        format!(
            "#!/bin/sh\necho ran >> {share}/planted-ran\n\
             id > {marks}/ran-in-$(readlink /proc/self/ns/pid | tr -dc 0-9)\nexit 1\n",
            share = share.display(),
            marks = marker.parent().unwrap().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        project.join("rust-toolchain.toml"),
        format!("[toolchain]\npath = \"{}\"\n", tc.display()),
    )
    .unwrap();
    let proxy = bin.join("cargo");
    std::fs::write(&proxy, PROXY).unwrap();
    std::fs::set_permissions(&proxy, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o777)).unwrap();
    if who == Who::Plain {
        for d in [&project, &home, &state] {
            chown_tree(d);
        }
    }
    Setup {
        _tmp: tmp,
        _marks: marks,
        who,
        project,
        home,
        state,
        bin,
        share,
        marker,
    }
}

impl Setup {
    /// `argv` as the test's user, in the project, with the stand-in proxy first on `PATH`.
    fn command(&self, argv: &[&str]) -> Command {
        let mut c = match self.who {
            Who::Root => Command::new(argv[0]),
            Who::Plain => {
                let mut c = Command::new("/usr/bin/setpriv");
                c.args([
                    &format!("--reuid={PLAIN}"),
                    &format!("--regid={PLAIN}"),
                    "--init-groups",
                    "--",
                    argv[0],
                ]);
                c
            }
        };
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        c.args(&argv[1..])
            .current_dir(&self.project)
            .env("PATH", path)
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("SHADE_STATE_DIR", &self.state)
            .env("SHADE_BRANCH_SERVER", "0")
            .env("SHADE_SHARE", &self.share)
            .env_remove("SHADE_CONFIG")
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTUP_TOOLCHAIN")
            .stdin(Stdio::null());
        c
    }

    fn shade(&self, args: &[&str]) -> Command {
        let bin = match self.who {
            Who::Root => PathBuf::from(env!("CARGO_BIN_EXE_shade")),
            Who::Plain => common::plain::copy_of(env!("CARGO_BIN_EXE_shade")),
        };
        let bin = bin.display().to_string();
        let argv: Vec<&str> = std::iter::once(bin.as_str())
            .chain(args.iter().copied())
            .collect();
        self.command(&argv)
    }

    fn assert_no_host_run(&self, what: &str, o: &Output) {
        assert!(
            !self.marker.exists(),
            "{what} ran the project's cargo on the host ({:?}): {}\n{}",
            self.who,
            std::fs::read_to_string(&self.marker).unwrap_or_default(),
            out(o)
        );
        assert!(no_mounts(&self.state), "{what} left a mount behind");
    }
}

fn no_mounts(state: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    !mounts.contains(&*state.to_string_lossy())
}

fn route_is_closed(who: Who) {
    let s = setup(who);
    // The route's shape is real: the proxy, run on the host in the project, runs the
    // planted program.
    let o = s.command(&["cargo", "--version"]).output().unwrap();
    assert!(
        s.marker.exists(),
        "the stand-in proxy did not run the planted cargo: {}",
        out(&o)
    );
    std::fs::remove_file(&s.marker).unwrap();
    std::fs::remove_file(s.share.join("planted-ran")).unwrap();

    // `shade lint`, cold (no daemon left behind), on an edit of main.rs.
    let patch = "--- a/src/main.rs\n+++ b/src/main.rs\n@@ -1 +1 @@\n-fn main() {}\n+fn main() { let _x = 1; }\n";
    let mut child = s
        .shade(&["lint", "--cold", "--checker", "cargo"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(patch.as_bytes());
    }
    let o = child.wait_with_output().unwrap();
    s.assert_no_host_run("`shade lint`", &o);
    // The check itself did run the planted cargo: in the sandbox, as the project's code.
    assert!(
        s.share.join("planted-ran").exists(),
        "the check never ran the project's cargo (the route was not exercised): {}",
        out(&o)
    );

    // A session with lints: `exec --shadow` makes its linter at the start.
    let llm = FakeLlm::start(Arc::new(|_: &serde_json::Value| Reply::text("Done."))).unwrap();
    let o = s
        .shade(&["exec", "--shadow", "--approval", "yolo", "look around"])
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("SHADE_LOG", "error")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        !llm.requests().is_empty(),
        "the session never started: {}",
        out(&o)
    );
    s.assert_no_host_run("`shade exec --shadow`", &o);
}

#[test]
fn the_projects_toolchain_never_runs_on_the_host_as_root() {
    route_is_closed(Who::Root);
}

#[test]
fn the_projects_toolchain_never_runs_on_the_host_as_plain_user() {
    common::plain::require_fuse();
    route_is_closed(Who::Plain);
}

/// `shade lint`'s checker runs the project's code on an edit nobody accepted: as root and
/// as a plain user, it writes nothing outside the branch (a plain user's sandbox once bound
/// the host's `/` read-write: a `build.rs` in the patch could write `~/.bashrc`).
fn checker_writes_stay_in_the_branch(who: Who) {
    let s = setup(who);
    let target = s.marker.parent().unwrap().join("written");
    std::fs::create_dir_all(s.home.join(".config/shade")).unwrap();
    std::fs::write(
        s.home.join(".config/shade/config.toml"),
        format!(
            "[lint]\ncommand = [\"sh\", \"-c\", \"echo x > {t}; echo x > $HOME/.bashrc; \
             echo ran > {share}/checker-ran\"]\n",
            t = target.display(),
            share = s.share.display()
        ),
    )
    .unwrap();
    if who == Who::Plain {
        chown_tree(&s.home);
    }
    let o = s
        .shade(&["lint", "--cold", "--checker", "command"])
        .output()
        .unwrap();
    assert!(
        s.share.join("checker-ran").exists(),
        "the checker did not run: {}",
        out(&o)
    );
    assert!(
        !target.exists(),
        "the checker wrote on the host ({who:?}): {}",
        out(&o)
    );
    assert!(
        !s.home.join(".bashrc").exists(),
        "the checker wrote the home ({who:?}): {}",
        out(&o)
    );
    assert!(no_mounts(&s.state), "a mount was left behind");
}

#[test]
fn checker_writes_stay_in_the_branch_as_root() {
    checker_writes_stay_in_the_branch(Who::Root);
}

#[test]
fn checker_writes_stay_in_the_branch_as_plain_user() {
    common::plain::require_fuse();
    checker_writes_stay_in_the_branch(Who::Plain);
}

//! Owners and modes (issue 28, item 7): a branch's chown and chmod are changes, shown in
//! the listing, the diff and `--json`; as root, accept gives a path only to an owner the
//! project already had there (its own, its new directory's, a renamed file's, or root),
//! and refuses the whole accept otherwise, writing nothing (exit 124).
#![allow(clippy::unwrap_used)]

mod common;

use common::{describe, Fixture};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Run `cmd` to its end, capturing its output; killed and failed after two minutes.
fn output_within(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let end = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("shade did not finish in 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn run(fx: &Fixture, flags: &[&str], script: &str) -> Output {
    let mut c = fx.shade();
    c.arg("run")
        .args(flags)
        .args(["--timeout", "60", "--", "sh", "-c", script]);
    output_within(&mut c)
}

/// A fixture whose project holds `f` (0:0, 0644).
fn with_file() -> Fixture {
    let fx = Fixture::new();
    fs::set_permissions(&fx.project, fs::Permissions::from_mode(0o755)).unwrap();
    fx.write("f", "one\n");
    fs::set_permissions(fx.project.join("f"), fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(fx.project.join("f"), Some(0), Some(0)).unwrap();
    fx
}

#[test]
fn chown_and_chmod_are_shown_in_the_listing_the_diff_and_json() {
    let fx = with_file();
    let o = run(&fx, &["--diff"], "chown 4242 f && chmod 600 f");
    assert!(o.status.success(), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.lines()
            .any(|l| l == "M f (mode 100644 -> 100600, owner 0:0 -> 4242:0)"),
        "listing: {}",
        describe(&o)
    );
    let diff = String::from_utf8_lossy(&o.stdout);
    for want in [
        "diff --shade a/f b/f",
        "old mode 100644",
        "new mode 100600",
        "old owner 0:0",
        "new owner 4242:0",
    ] {
        assert!(
            diff.lines().any(|l| l == want),
            "{want:?} in the diff:\n{diff}"
        );
    }

    let o = run(&fx, &["--json"], "chown 4242 f && chmod 600 f");
    assert!(o.status.success(), "{}", describe(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &v["changes"][0];
    assert_eq!(c["path"], "f", "{v}");
    assert_eq!(c["kind"], "modified", "{v}");
    assert_eq!(c["mode_old"], "100644", "{v}");
    assert_eq!(c["mode_new"], "100600", "{v}");
    assert_eq!(
        c["owner_old"],
        serde_json::json!({"uid": 0, "gid": 0}),
        "{v}"
    );
    assert_eq!(
        c["owner_new"],
        serde_json::json!({"uid": 4242, "gid": 0}),
        "{v}"
    );

    // A chown alone is a change too.
    let o = run(&fx, &["--json"], "chgrp 4243 f");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["changes"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(
        v["changes"][0]["owner_new"],
        serde_json::json!({"uid": 0, "gid": 4243}),
        "{v}"
    );
    assert!(v["changes"][0].get("mode_old").is_none(), "{v}");
}

#[test]
fn accept_refuses_to_give_a_file_to_another_owner_and_writes_nothing() {
    let fx = with_file();
    let o = run(
        &fx,
        &["--accept"],
        "echo two > f && chown 4242 f && chmod 600 f && echo new > g",
    );
    assert_eq!(o.status.code(), Some(124), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("refusing to accept"))
        .collect();
    assert_eq!(refusal.len(), 1, "{}", describe(&o));
    assert!(
        refusal[0].contains("f would belong to 4242:0")
            && refusal[0].contains("nothing was written"),
        "{}",
        refusal[0]
    );
    let m = fs::metadata(fx.project.join("f")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o644));
    assert_eq!(fx.read("f"), "one\n");
    assert!(!fx.project.join("g").exists(), "g was written");

    // A new file given to someone the directory does not belong to: refused as well.
    let o = run(&fx, &["--accept"], "echo new > g && chown 4242:4242 g");
    assert_eq!(o.status.code(), Some(124), "{}", describe(&o));
    assert!(!fx.project.join("g").exists(), "g was written");
}

#[test]
fn accept_keeps_owners_the_project_already_had() {
    let fx = with_file();
    // A file of 4242, a directory of 4243, a file of 4244 to rename.
    fx.write("mine", "m\n");
    fx.write("d/x", "x\n");
    fx.write("r", "r\n");
    std::os::unix::fs::chown(fx.project.join("mine"), Some(4242), Some(4242)).unwrap();
    std::os::unix::fs::chown(fx.project.join("d"), Some(4243), Some(4243)).unwrap();
    std::os::unix::fs::chown(fx.project.join("r"), Some(4244), Some(4244)).unwrap();
    let script = "echo more >> mine && chown 4242:4242 mine && chmod 600 mine \
                  && echo n > d/new && chown 4243:4243 d/new \
                  && mv r r2 \
                  && chown 0:0 f";
    let o = run(&fx, &["--accept"], script);
    assert!(o.status.success(), "{}", describe(&o));
    let owner = |p: &str| {
        let m = fs::symlink_metadata(fx.project.join(p)).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    assert_eq!(owner("mine"), (4242, 4242, 0o600));
    assert_eq!(fx.read("mine"), "m\nmore\n");
    assert_eq!(owner("d/new").0, 4243);
    assert_eq!(owner("r2").0, 4244);
    assert!(!fx.project.join("r").exists());
    assert_eq!(owner("f").0, 0);
}

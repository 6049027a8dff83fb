//! The accept engine on real temp dirs: every kind of op, conflicts, unsafe plans, force.
#![allow(clippy::unwrap_used)]

mod accept_common;

use accept_common::{file, materialize, perms, snapshot, Entry, Env, Snap};
use shade_fusefs::accept::{apply, recover, AcceptError, AcceptOptions, AcceptReport};
use shade_fusefs::{Base, PlanOp};
use std::path::PathBuf;

fn opts(env: &Env, force: bool) -> AcceptOptions {
    AcceptOptions {
        force,
        state: env.state.clone(),
        reads: Vec::new(),
        own: None,
    }
}

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn old_tree() -> Snap {
    let mut s = Snap::new();
    s.insert(p("a.txt"), file("old a", 0o644));
    s.insert(p("b.txt"), file("old b", 0o644));
    s.insert(p("sub"), Entry::Dir(0o755));
    s.insert(p("sub/c.txt"), file("old c", 0o600));
    s.insert(p("link"), Entry::Link(p("a.txt")));
    s.insert(p("old"), Entry::Dir(0o755));
    s.insert(p("old/x"), file("old x", 0o644));
    s.insert(p("old/y"), file("old y", 0o644));
    s.insert(p("rm_dir"), Entry::Dir(0o755));
    s.insert(p("rm_dir/deep"), Entry::Dir(0o755));
    s.insert(p("rm_dir/deep/z"), file("z", 0o644));
    s.insert(p("d2f"), Entry::Dir(0o755));
    s.insert(p("d2f/inner"), file("inner", 0o644));
    s.insert(p("f2d"), file("was a file", 0o644));
    s
}

#[test]
fn applies_every_kind_of_op() {
    let mut env = Env::new();
    materialize(&env.root, &old_tree());
    let plan = vec![
        PlanOp::RenameDir {
            from: p("old"),
            to: p("new"),
            base_from: env.base("old"),
            base_to: Base::Absent,
        },
        PlanOp::Delete {
            path: p("d2f"),
            base: env.base("d2f"),
            base_at: None,
        },
        PlanOp::Delete {
            path: p("f2d"),
            base: env.base("f2d"),
            base_at: None,
        },
        PlanOp::Mkdir {
            path: p("fresh"),
            perms: perms(0o750),
            base: Base::Absent,
            base_at: None,
        },
        PlanOp::Mkdir {
            path: p("f2d"),
            perms: perms(0o755),
            base: Base::Absent,
            base_at: None,
        },
        env.write("a.txt", b"new a", 0o755, env.base("a.txt")),
        env.write("fresh/n.txt", b"brand new", 0o600, Base::Absent),
        env.write("new/x", b"new x", 0o644, env.base("old/x")),
        env.write("d2f", b"now a file", 0o644, Base::Absent),
        env.write("f2d/inside", b"inside", 0o644, Base::Absent),
        PlanOp::Symlink {
            path: p("link"),
            target: p("b.txt"),
            base: env.base("link"),
            base_at: None,
        },
        PlanOp::Symlink {
            path: p("fresh/l"),
            target: p("../a.txt"),
            base: Base::Absent,
            base_at: None,
        },
        PlanOp::SetPerms {
            path: p("sub"),
            perms: perms(0o700),
            base: env.base("sub"),
            base_at: None,
        },
        PlanOp::Delete {
            path: p("b.txt"),
            base: env.base("b.txt"),
            base_at: None,
        },
        PlanOp::Delete {
            path: p("rm_dir"),
            base: env.base("rm_dir"),
            base_at: None,
        },
    ];
    let report = apply(&env.root, plan, &opts(&env, false)).unwrap();
    assert_eq!(
        report,
        AcceptReport {
            written: 7,
            created_dirs: 2,
            renamed_dirs: 1,
            deleted: 4,
            not_applied: vec![],
            privileges_dropped: vec![],
        }
    );

    let mut want = Snap::new();
    want.insert(p("a.txt"), file("new a", 0o755));
    want.insert(p("sub"), Entry::Dir(0o700));
    want.insert(p("sub/c.txt"), file("old c", 0o600));
    want.insert(p("link"), Entry::Link(p("b.txt")));
    want.insert(p("new"), Entry::Dir(0o755));
    want.insert(p("new/x"), file("new x", 0o644));
    want.insert(p("new/y"), file("old y", 0o644));
    want.insert(p("fresh"), Entry::Dir(0o750));
    want.insert(p("fresh/n.txt"), file("brand new", 0o600));
    want.insert(p("fresh/l"), Entry::Link(p("../a.txt")));
    want.insert(p("d2f"), file("now a file", 0o644));
    want.insert(p("f2d"), Entry::Dir(0o755));
    want.insert(p("f2d/inside"), file("inside", 0o644));
    assert_eq!(snapshot(&env.root), want);
    env.assert_clean();
}

#[test]
fn conflicts_refuse_everything_and_list_every_path() {
    let mut env = Env::new();
    materialize(&env.root, &old_tree());
    let plan = vec![
        env.write("a.txt", b"branch a", 0o644, env.base("a.txt")),
        env.write("added.txt", b"branch added", 0o644, Base::Absent),
        env.write("sub/c.txt", b"branch c", 0o600, env.base("sub/c.txt")),
        env.write("untouched-by-user.txt", b"fine", 0o644, Base::Absent),
        PlanOp::Delete {
            path: p("b.txt"),
            base: env.base("b.txt"),
            base_at: None,
        },
    ];
    // The user, meanwhile: edits a.txt, creates added.txt, deletes sub/c.txt, touches b.txt.
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(env.root.join("a.txt"), "user a").unwrap();
    std::fs::write(env.root.join("added.txt"), "user added").unwrap();
    std::fs::remove_file(env.root.join("sub/c.txt")).unwrap();
    std::fs::write(env.root.join("b.txt"), "user b").unwrap();
    let before = snapshot(&env.root);

    let err = apply(&env.root, plan, &opts(&env, false)).unwrap_err();
    let AcceptError::Conflicts(c) = &err else {
        panic!("not a conflict: {err}")
    };
    let mut paths: Vec<_> = c.iter().map(|c| c.path.clone()).collect();
    paths.sort();
    assert_eq!(
        paths,
        vec![p("a.txt"), p("added.txt"), p("b.txt"), p("sub/c.txt")]
    );
    let msg = err.to_string();
    assert!(
        msg.contains("added.txt: created meanwhile")
            && msg.contains("sub/c.txt: deleted meanwhile"),
        "{msg}"
    );
    assert_eq!(
        snapshot(&env.root),
        before,
        "a refused accept changed the tree"
    );
    env.assert_clean();
}

#[test]
fn force_overrides_conflicts() {
    let mut env = Env::new();
    materialize(&env.root, &old_tree());
    let plan = vec![
        env.write("a.txt", b"branch a", 0o644, env.base("a.txt")),
        env.write("added.txt", b"branch added", 0o644, Base::Absent),
        env.write("sub/c.txt", b"branch c", 0o600, env.base("sub/c.txt")),
        PlanOp::Delete {
            path: p("b.txt"),
            base: env.base("b.txt"),
            base_at: None,
        },
    ];
    std::fs::write(env.root.join("a.txt"), "user a").unwrap();
    std::fs::write(env.root.join("added.txt"), "user added").unwrap();
    std::fs::remove_file(env.root.join("sub/c.txt")).unwrap();
    std::fs::write(env.root.join("b.txt"), "user b").unwrap();
    apply(&env.root, plan, &opts(&env, true)).unwrap();
    let s = snapshot(&env.root);
    assert_eq!(s[&p("a.txt")], file("branch a", 0o644));
    assert_eq!(s[&p("added.txt")], file("branch added", 0o644));
    assert_eq!(s[&p("sub/c.txt")], file("branch c", 0o600));
    assert!(!s.contains_key(&p("b.txt")));
    env.assert_clean();
}

#[test]
fn unsafe_paths_are_refused_before_anything_changes() {
    for bad in [
        "../escape",
        "/tmp/abs",
        "a/../../x",
        "sub/./c.txt",
        "",
        ".shade-accept-x/y",
    ] {
        let mut env = Env::new();
        materialize(&env.root, &old_tree());
        let before = snapshot(&env.root);
        let plan = vec![
            env.write("a.txt", b"ok", 0o644, env.base("a.txt")),
            env.write(bad, b"evil", 0o644, Base::Absent),
        ];
        let err = apply(&env.root, plan, &opts(&env, true)).unwrap_err();
        assert!(matches!(err, AcceptError::Unsafe { .. }), "{bad:?}: {err}");
        assert_eq!(snapshot(&env.root), before, "{bad:?}");
        env.assert_clean();
    }
}

#[test]
fn a_symlinked_parent_is_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("x"), "outside x").unwrap();
    let outside_before = snapshot(outside.path());

    // The user replaced `dir` (which the branch wrote into) with a symlink out of the project.
    for force in [false, true] {
        let mut env = Env::new();
        std::fs::create_dir(env.root.join("dir")).unwrap();
        std::fs::write(env.root.join("dir/x"), "lower x").unwrap();
        let plan = vec![
            env.write("dir/x", b"branch x", 0o644, env.base("dir/x")),
            env.write("dir/new", b"branch new", 0o644, Base::Absent),
        ];
        std::fs::remove_dir_all(env.root.join("dir")).unwrap();
        std::os::unix::fs::symlink(outside.path(), env.root.join("dir")).unwrap();
        let before = snapshot(&env.root);
        let err = apply(&env.root, plan, &opts(&env, force)).unwrap_err();
        if force {
            assert!(matches!(err, AcceptError::Unsafe { .. }), "{err}");
        } else {
            let AcceptError::Conflicts(c) = &err else {
                panic!("{err}")
            };
            assert_eq!(c.len(), 2, "{err}");
        }
        assert_eq!(snapshot(&env.root), before);
        assert_eq!(
            snapshot(outside.path()),
            outside_before,
            "accept wrote outside the project"
        );
        env.assert_clean();
    }

    // A plan that itself makes `evil` a symlink and then writes through it.
    let mut env = Env::new();
    let plan = vec![
        PlanOp::Symlink {
            path: p("evil"),
            target: outside.path().to_path_buf(),
            base: Base::Absent,
            base_at: None,
        },
        env.write("evil/x", b"pwned", 0o644, Base::Absent),
    ];
    let err = apply(&env.root, plan, &opts(&env, true)).unwrap_err();
    assert!(matches!(err, AcceptError::Unsafe { .. }), "{err}");
    assert_eq!(
        snapshot(outside.path()),
        outside_before,
        "accept wrote outside the project"
    );
    assert!(snapshot(&env.root).is_empty());
    env.assert_clean();
}

#[test]
fn recover_without_journals_is_a_no_op() {
    let env = Env::new();
    let r = recover(&env.state).unwrap();
    assert!(r.rolled_forward.is_empty() && r.rolled_back.is_empty());
    std::fs::create_dir_all(env.state.journals()).unwrap();
    let r = recover(&env.state).unwrap();
    assert!(r.rolled_forward.is_empty() && r.rolled_back.is_empty());
}

#[test]
fn an_empty_plan_changes_nothing() {
    let env = Env::new();
    materialize(&env.root, &old_tree());
    let before = snapshot(&env.root);
    assert_eq!(
        apply(&env.root, vec![], &opts(&env, false)).unwrap(),
        AcceptReport::default()
    );
    assert_eq!(snapshot(&env.root), before);
    env.assert_clean();
}

#[test]
fn odd_names_survive_the_journal() {
    use std::os::unix::ffi::OsStrExt;
    let mut env = Env::new();
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9 new\nline");
    let long = "n".repeat(255);
    let mut plan = vec![env.write("placeholder", b"x", 0o644, Base::Absent)];
    let PlanOp::WriteFile { content, perms, .. } = plan.remove(0) else {
        unreachable!()
    };
    plan.push(PlanOp::WriteFile {
        path: PathBuf::from(odd),
        content,
        perms,
        base: Base::Absent,
        base_at: None,
    });
    plan.push(env.write(&long, b"long", 0o644, Base::Absent));
    apply(&env.root, plan, &opts(&env, false)).unwrap();
    assert_eq!(std::fs::read(env.root.join(odd)).unwrap(), b"x");
    assert_eq!(std::fs::read(env.root.join(&long)).unwrap(), b"long");
    env.assert_clean();
}

/// Unmounts on drop, also when the test fails.
struct Mounted(PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn targets_on_a_nested_mount_are_placed_across_file_systems() {
    let mut env = Env::new();
    let mnt = env.root.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let none: Option<&str> = None;
    if let Err(e) = nix::mount::mount(
        Some("tmpfs"),
        &mnt,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        none,
    ) {
        println!("skipped: cannot mount a tmpfs here ({e})");
        return;
    }
    let _guard = Mounted(mnt.clone());
    std::fs::write(mnt.join("x"), "old x").unwrap();
    std::fs::write(mnt.join("y"), "old y").unwrap();
    let plan = vec![
        PlanOp::Mkdir {
            path: p("mnt/d"),
            perms: perms(0o755),
            base: Base::Absent,
            base_at: None,
        },
        env.write("mnt/x", b"new x", 0o600, env.base("mnt/x")),
        env.write("mnt/d/n", b"new n", 0o644, Base::Absent),
        PlanOp::Symlink {
            path: p("mnt/l"),
            target: p("x"),
            base: Base::Absent,
            base_at: None,
        },
        PlanOp::Delete {
            path: p("mnt/y"),
            base: env.base("mnt/y"),
            base_at: None,
        },
    ];
    apply(&env.root, plan, &opts(&env, false)).unwrap();
    let s = snapshot(&mnt);
    let mut want = Snap::new();
    want.insert(p("x"), file("new x", 0o600));
    want.insert(p("d"), Entry::Dir(0o755));
    want.insert(p("d/n"), file("new n", 0o644));
    want.insert(p("l"), Entry::Link(p("x")));
    assert_eq!(s, want);
    env.assert_clean();
}

/// Accept never writes set-user-ID/set-group-ID bits of files or file capabilities, and
/// reports the paths it left without them; a directory's set-group-ID bit stays.
#[test]
fn set_id_bits_and_file_capabilities_are_never_written() {
    let mut env = Env::new();
    let mut suid = env.write("suid", b"x", 0o4755, Base::Absent);
    if let PlanOp::WriteFile { perms, .. } = &mut suid {
        perms.xattrs = Some(vec![
            (
                b"security.capability".to_vec(),
                vec![1, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (b"user.kept".to_vec(), b"1".to_vec()),
        ]);
    }
    let plan = vec![
        PlanOp::Mkdir {
            path: p("shared"),
            perms: perms(0o2775),
            base: Base::Absent,
            base_at: None,
        },
        suid,
        env.write("sgid", b"y", 0o2755, Base::Absent),
        env.write("plain", b"z", 0o755, Base::Absent),
    ];
    let report = apply(&env.root, plan, &opts(&env, false)).unwrap();
    assert_eq!(report.privileges_dropped, vec![p("suid"), p("sgid")]);
    let mode = |n: &str| {
        std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(env.root.join(n)).unwrap().permissions(),
        ) & 0o7777
    };
    assert_eq!(mode("suid"), 0o755);
    assert_eq!(mode("sgid"), 0o755);
    assert_eq!(mode("plain"), 0o755);
    assert_eq!(mode("shared"), 0o2775);
    let names = xattr_names(&env.root.join("suid"));
    assert_eq!(names, vec!["user.kept".to_string()]);
    assert!(report.privileges_note().unwrap().contains("suid, sgid"));
}

fn xattr_names(path: &std::path::Path) -> Vec<String> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: listxattr into a buffer of the given length.
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0);
    buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

//! Shade's state dir inside the project (the home as the project): no plan may move,
//! replace or write it or an ancestor of it, and recovery and undo refuse journals and
//! history shade could not have written (red team round 6: a branch swapped `.local` for a
//! forged tree, whose journal recovery replayed at `/` and whose history `shade undo`
//! replayed). Device nodes are not accepted either.
#![allow(clippy::unwrap_used)]

mod accept_common;

use accept_common::{perms, Env};
use shade_fusefs::accept::{apply, recover, AcceptError, AcceptOptions};
use shade_fusefs::state::StateDir;
use shade_fusefs::undo::{undo, UndoOptions};
use shade_fusefs::{Base, PlanOp};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

/// An env whose state dir is `<project>/.local/state/shade`, with one accept recorded.
fn home_env() -> Env {
    let mut env = Env::new();
    env.state = StateDir::at(env.root.join(".local/state/shade"));
    std::fs::create_dir_all(env.state.root()).unwrap();
    std::fs::write(env.root.join("a.txt"), "v1").unwrap();
    let op = env.write("a.txt", b"v2", 0o644, env.base("a.txt"));
    apply(&env.root, vec![op], &opts(&env)).unwrap();
    env
}

fn opts(env: &Env) -> AcceptOptions {
    AcceptOptions {
        force: false,
        state: env.state.clone(),
        reads: Vec::new(),
        own: None,
    }
}

fn entries(env: &Env) -> usize {
    std::fs::read_dir(env.state.history().join("entries"))
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name();
            n.to_string_lossy().ends_with(".json")
        })
        .count()
}

fn refused(r: Result<shade_fusefs::accept::AcceptReport, AcceptError>, path: &str) {
    match r {
        Err(AcceptError::Unsafe { path: got, reason }) => {
            assert_eq!(got, p(path), "{reason}");
            assert!(reason.contains("state directory"), "{reason}");
        }
        other => panic!("expected a refusal at {path}, got {other:?}"),
    }
}

#[test]
fn no_plan_moves_replaces_or_writes_the_state_dir_or_an_ancestor() {
    let mut env = home_env();
    assert_eq!(entries(&env), 1);
    let rename_away = PlanOp::RenameDir {
        from: p(".local"),
        to: p(".local-old"),
        base_from: env.base(".local"),
        base_to: Base::Absent,
    };
    // The pre-check an interactive session asks first says the same, writing nothing.
    let checked = shade_fusefs::accept::check_plan(
        &env.root,
        std::slice::from_ref(&rename_away),
        &[],
        false,
        None,
        Some(env.state.root()),
    );
    match checked {
        Err(AcceptError::Unsafe { path, reason }) => {
            assert_eq!(path, p(".local"));
            assert!(reason.contains("state directory"), "{reason}");
        }
        other => panic!("the pre-check let a rename of the state dir's parent by: {other:?}"),
    }
    refused(apply(&env.root, vec![rename_away], &opts(&env)), ".local");
    std::fs::create_dir_all(env.root.join("forged/state/shade/journals")).unwrap();
    let rename_onto = PlanOp::RenameDir {
        from: p("forged"),
        to: p(".local"),
        base_from: env.base("forged"),
        base_to: env.base(".local"),
    };
    refused(apply(&env.root, vec![rename_onto], &opts(&env)), ".local");
    let delete = PlanOp::Delete {
        path: p(".local/state"),
        base: env.base(".local/state"),
        base_at: None,
    };
    refused(apply(&env.root, vec![delete], &opts(&env)), ".local/state");
    let inside = env.write(
        ".local/state/shade/journals/ffff-1.json",
        b"{}",
        0o600,
        Base::Absent,
    );
    refused(
        apply(&env.root, vec![inside], &opts(&env)),
        ".local/state/shade/journals/ffff-1.json",
    );
    // Even behind an op that is fine, nothing of the plan is written.
    let fine = env.write("b.txt", b"b", 0o644, Base::Absent);
    let replace = PlanOp::Symlink {
        path: p(".local/state/shade"),
        target: p("/tmp"),
        base: env.base(".local/state/shade"),
        base_at: None,
    };
    refused(
        apply(&env.root, vec![fine, replace], &opts(&env)),
        ".local/state/shade",
    );
    assert!(!env.root.join("b.txt").exists());
    assert!(env.state.history().join("entries").is_dir());
    assert_eq!(entries(&env), 1, "the refusals recorded nothing");
    // A mode change of an ancestor is fine; a file beside the state dir too.
    let chmod = PlanOp::SetPerms {
        path: p(".local"),
        perms: perms(0o700),
        base: env.base(".local"),
        base_at: None,
    };
    let beside = env.write(".local/other.txt", b"x", 0o644, Base::Absent);
    apply(&env.root, vec![chmod, beside], &opts(&env)).unwrap();
    assert_eq!(
        std::fs::metadata(env.root.join(".local"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
}

#[test]
fn a_symlinked_ancestor_of_the_state_dir_is_protected_by_both_names() {
    let mut env = Env::new();
    std::fs::create_dir_all(env.root.join("dotfiles/local/state")).unwrap();
    std::os::unix::fs::symlink("dotfiles/local", env.root.join(".local")).unwrap();
    env.state = StateDir::at(env.root.join(".local/state/shade"));
    std::fs::create_dir_all(env.state.root()).unwrap();
    let swap = PlanOp::Delete {
        path: p(".local"),
        base: env.base(".local"),
        base_at: None,
    };
    refused(apply(&env.root, vec![swap], &opts(&env)), ".local");
    let away = PlanOp::RenameDir {
        from: p("dotfiles"),
        to: p("dotfiles-old"),
        base_from: env.base("dotfiles"),
        base_to: Base::Absent,
    };
    refused(apply(&env.root, vec![away], &opts(&env)), "dotfiles");
}

/// Another shade's state dir inside the project (red team round 8, route 3): one only its
/// marker names (no registry or environment lists it) is off limits to accept too: nothing
/// of the plan is written.
#[test]
fn another_state_dir_inside_the_project_is_refused() {
    let mut env = Env::new();
    std::fs::create_dir_all(env.root.join("work/st2/history")).unwrap();
    std::fs::write(env.root.join("work/st2/SHADE-STATE-DIR"), "marker").unwrap();
    let forge = env.write("work/st2/history/entry", b"forged", 0o644, Base::Absent);
    let ok = env.write("b.txt", b"fine", 0o644, Base::Absent);
    match apply(&env.root, vec![ok, forge], &opts(&env)) {
        Err(AcceptError::Unsafe { path, reason }) => {
            assert_eq!(path, p("work/st2/history/entry"), "{reason}");
            assert!(reason.contains("state-dir marker"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!env.root.join("b.txt").exists());
    assert!(!env.root.join("work/st2/history/entry").exists());
}

#[test]
fn device_nodes_are_not_accepted_fifos_and_sockets_are() {
    let env = Env::new();
    for (mode, what) in [
        (libc::S_IFCHR, "character device"),
        (libc::S_IFBLK, "block device"),
    ] {
        let op = PlanOp::Special {
            path: p("node"),
            mode: mode | 0o666,
            rdev: 0,
            perms: perms(0o666),
            base: Base::Absent,
            base_at: None,
        };
        match apply(&env.root, vec![op], &opts(&env)) {
            Err(AcceptError::Unsafe { reason, .. }) => assert!(reason.contains(what), "{reason}"),
            other => panic!("{what} accepted: {other:?}"),
        }
        assert!(std::fs::symlink_metadata(env.root.join("node")).is_err());
    }
    let fifo = PlanOp::Special {
        path: p("fifo"),
        mode: libc::S_IFIFO | 0o644,
        rdev: 0,
        perms: perms(0o644),
        base: Base::Absent,
        base_at: None,
    };
    apply(&env.root, vec![fifo], &opts(&env)).unwrap();
    use std::os::unix::fs::FileTypeExt;
    let m = std::fs::symlink_metadata(env.root.join("fifo")).unwrap();
    assert!(m.file_type().is_fifo());
    // A socket node (a program's bound socket left in the tree) reaches nothing without its
    // listener; accept gives the tree a plain run gives (fidelity's test).
    let sock = PlanOp::Special {
        path: p("sock"),
        mode: libc::S_IFSOCK | 0o755,
        rdev: 0,
        perms: perms(0o755),
        base: Base::Absent,
        base_at: None,
    };
    apply(&env.root, vec![sock], &opts(&env)).unwrap();
    let m = std::fs::symlink_metadata(env.root.join("sock")).unwrap();
    assert!(m.file_type().is_socket());
}

/// Plant journal `id` (JSON as accept writes it) with one `Place` of staged `0` onto `path`.
fn forge_journal(env: &Env, id: &str, root: &Path, staging: &str, path: &str) -> PathBuf {
    let dir = env.state.journals();
    std::fs::create_dir_all(&dir).unwrap();
    let j = serde_json::json!({
        "version": 2,
        "id": id,
        "root": root.to_str().unwrap(),
        "staging": staging,
        "phase": "Committed",
        "ops": [{"Place": {"n": 0, "path": path, "symlink": false, "pre": "Absent"}}],
        "set_aside": [],
    });
    let f = dir.join(format!("{id}.json"));
    std::fs::write(&f, serde_json::to_vec(&j).unwrap()).unwrap();
    f
}

#[test]
fn recovery_refuses_forged_journals_and_leaves_them() {
    let env = Env::new();
    let out = env.dir.join("outside");
    std::fs::create_dir_all(env.root.join("stg")).unwrap();
    std::fs::write(env.root.join("stg/0"), "PWNED").unwrap();
    // A root of "/" and a staging path with slashes: would write anywhere on the host.
    let target = out.join("pwned");
    let rel_target = target.strip_prefix("/").unwrap().to_str().unwrap();
    let staging = env.root.join("stg");
    let staging = staging.strip_prefix("/").unwrap().to_str().unwrap();
    let slashed = forge_journal(&env, "ffff-1", Path::new("/"), staging, rel_target);
    let e = recover(&env.state).unwrap_err().to_string();
    assert!(e.contains("ffff-1"), "{e}");
    assert!(slashed.exists(), "the refused journal is left as it is");
    assert!(!target.exists());
    std::fs::remove_file(&slashed).unwrap();
    // The project's root but a staging that is not `.shade-accept-<id>`.
    let f = forge_journal(&env, "ffff-2", &env.root, "stg", "planted");
    let e = recover(&env.state).unwrap_err().to_string();
    assert!(e.contains("staging"), "{e}");
    assert!(f.exists() && !env.root.join("planted").exists());
    std::fs::remove_file(&f).unwrap();
    // A path going up out of the project.
    std::fs::create_dir_all(env.root.join(".shade-accept-ffff-3")).unwrap();
    std::fs::write(env.root.join(".shade-accept-ffff-3/0"), "PWNED").unwrap();
    let f = forge_journal(
        &env,
        "ffff-3",
        &env.root,
        ".shade-accept-ffff-3",
        "../escaped",
    );
    let e = recover(&env.state).unwrap_err().to_string();
    assert!(e.contains(".."), "{e}");
    assert!(f.exists() && !env.dir.join("escaped").exists());
    // A well-formed journal that is writable by others is not shade's.
    std::fs::remove_file(&f).unwrap();
    let f = forge_journal(&env, "ffff-3", &env.root, ".shade-accept-ffff-3", "planted");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o646)).unwrap();
    let e = recover(&env.state).unwrap_err().to_string();
    assert!(e.contains("not shade's own"), "{e}");
    assert!(f.exists() && !env.root.join("planted").exists());
    // Made shade's own, the same journal is finished: the checks refuse only forgeries.
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    recover(&env.state).unwrap();
    assert_eq!(
        std::fs::read_to_string(env.root.join("planted")).unwrap(),
        "PWNED"
    );
}

#[test]
fn undo_refuses_a_forged_history_entry() {
    let mut env = Env::new();
    std::fs::write(env.root.join("a.txt"), "v1").unwrap();
    let op = env.write("a.txt", b"v2", 0o644, env.base("a.txt"));
    apply(&env.root, vec![op], &opts(&env)).unwrap();
    let entries = env.state.history().join("entries");
    let changes = std::fs::read_dir(&entries)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "changes"))
        .unwrap();
    let good = std::fs::read(&changes).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v[0]["path"] = serde_json::json!("../a.txt");
    std::fs::write(&changes, serde_json::to_vec(&v).unwrap()).unwrap();
    let e = undo(&env.state, &env.root, None, &UndoOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("refusing to undo"), "{e}");
    assert_eq!(
        std::fs::read_to_string(env.root.join("a.txt")).unwrap(),
        "v2"
    );
    // An entry file that others may write is not believed at all.
    std::fs::write(&changes, &good).unwrap();
    let entry = changes.with_extension("json");
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = undo(&env.state, &env.root, None, &UndoOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not shade's own"), "{e}");
    assert_eq!(
        std::fs::read_to_string(env.root.join("a.txt")).unwrap(),
        "v2"
    );
    // An entry for another root is not this project's to undo.
    std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut ev: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
    ev["root"] = serde_json::json!(env.dir.to_str().unwrap());
    std::fs::write(&entry, serde_json::to_vec(&ev).unwrap()).unwrap();
    assert!(undo(&env.state, &env.root, None, &UndoOptions::default()).is_err());
    assert_eq!(
        std::fs::read_to_string(env.root.join("a.txt")).unwrap(),
        "v2"
    );
    // Put back as shade wrote it, the undo runs.
    ev["root"] = serde_json::json!(std::fs::canonicalize(&env.root).unwrap().to_str().unwrap());
    std::fs::write(&entry, serde_json::to_vec(&ev).unwrap()).unwrap();
    undo(&env.state, &env.root, None, &UndoOptions::default()).unwrap();
    assert_eq!(
        std::fs::read_to_string(env.root.join("a.txt")).unwrap(),
        "v1"
    );
}

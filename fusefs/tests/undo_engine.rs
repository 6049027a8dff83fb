//! Undo through the engine, without a mount: every kind of op an accept applies (a directory
//! renamed with a file changed inside it, a file replaced by a directory and back, modes,
//! links, deleted trees) is put back exactly, and the undo itself can be undone.
#![allow(clippy::unwrap_used)]

mod accept_common;

use accept_common::{file, materialize, perms, snapshot, Entry, Env, Snap};
use shade_fusefs::accept::{apply, AcceptOptions};
use shade_fusefs::undo::{undo, UndoError, UndoOptions};
use shade_fusefs::{Base, PlanOp};
use std::path::PathBuf;

fn opts(env: &Env) -> AcceptOptions {
    AcceptOptions {
        force: false,
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
fn undo_puts_back_every_kind_of_op_and_can_be_undone_itself() {
    let mut env = Env::new();
    materialize(&env.root, &old_tree());
    let before = snapshot(&env.root);
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
    apply(&env.root, plan, &opts(&env)).unwrap();
    let after = snapshot(&env.root);
    assert_ne!(before, after);

    let dry = undo(
        &env.state,
        &env.root,
        None,
        &UndoOptions {
            dry_run: true,
            ..UndoOptions::default()
        },
    )
    .unwrap();
    assert!(dry.undo_id.is_none());
    assert_eq!(snapshot(&env.root), after, "a dry run writes nothing");

    let r = undo(&env.state, &env.root, None, &UndoOptions::default()).unwrap();
    assert_eq!(snapshot(&env.root), before, "{r:?}");
    env.assert_clean();
    // Nothing left to undo but the undo itself, which puts the accept back.
    assert!(matches!(
        undo(&env.state, &env.root, None, &UndoOptions::default()),
        Err(UndoError::NotFound(_))
    ));
    let again = undo(
        &env.state,
        &env.root,
        r.undo_id.as_deref(),
        &UndoOptions::default(),
    )
    .unwrap();
    assert_eq!(snapshot(&env.root), after, "{again:?}");
    env.assert_clean();
}

#[test]
fn a_change_inside_a_renamed_directory_is_kept_with_keep_mine() {
    let mut env = Env::new();
    materialize(&env.root, &old_tree());
    let plan = vec![
        PlanOp::RenameDir {
            from: p("old"),
            to: p("new"),
            base_from: env.base("old"),
            base_to: Base::Absent,
        },
        env.write("new/x", b"new x", 0o644, env.base("old/x")),
    ];
    apply(&env.root, plan, &opts(&env)).unwrap();
    std::fs::write(env.root.join("new/y"), "the user's y").unwrap();
    let refused = undo(&env.state, &env.root, None, &UndoOptions::default());
    let Err(UndoError::Conflicts { kept, .. }) = refused else {
        panic!("{refused:?}");
    };
    assert!(kept.iter().any(|k| k.path == p("new/y")), "{kept:?}");
    let r = undo(
        &env.state,
        &env.root,
        None,
        &UndoOptions {
            keep_mine: true,
            ..UndoOptions::default()
        },
    )
    .unwrap();
    // The user's file and the directory holding it stay; old/x is back.
    assert_eq!(
        std::fs::read_to_string(env.root.join("new/y")).unwrap(),
        "the user's y"
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("old/x")).unwrap(),
        "old x"
    );
    assert!(!r.kept.is_empty());
}

/// Every file below the history's object store.
fn stored(env: &Env) -> usize {
    std::fs::read_dir(env.state.history().join("objects"))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

#[test]
fn a_rename_through_a_temporary_name_stores_only_what_was_overwritten_and_undoes_exactly() {
    let mut env = Env::new();
    materialize(&env.root, &old_tree());
    let before = snapshot(&env.root);
    // As a branch's plan has it: to a temporary name at the root, then to its place; a
    // write inside it after.
    let plan = vec![
        PlanOp::RenameDir {
            from: p("old"),
            to: p(".shade-move-t-0"),
            base_from: env.base("old"),
            base_to: Base::Absent,
        },
        PlanOp::RenameDir {
            from: p(".shade-move-t-0"),
            to: p("sub/new"),
            base_from: env.base("old"),
            base_to: Base::Absent,
        },
        env.write("sub/new/x", b"new x", 0o644, env.base("old/x")),
    ];
    apply(&env.root, plan, &opts(&env)).unwrap();
    let after = snapshot(&env.root);
    // old/x was overwritten: its content is kept; old/y only moved: it is not.
    assert_eq!(stored(&env), 1);
    let r = undo(&env.state, &env.root, None, &UndoOptions::default()).unwrap();
    assert_eq!(snapshot(&env.root), before, "{r:?}");
    assert_eq!(r.renamed, vec![(p("sub/new"), p("old"))]);
    env.assert_clean();
    let again = undo(
        &env.state,
        &env.root,
        r.undo_id.as_deref(),
        &UndoOptions::default(),
    )
    .unwrap();
    assert_eq!(snapshot(&env.root), after, "{again:?}");
    env.assert_clean();
}

//! A deep directory chain (a branch makes one 2,000 deep in a second) is accepted whole and
//! right: accept walks it keeping the directories of the last walk open, and forgets them
//! where an op of the plan replaced or removed one (a directory turned into a file).
#![allow(clippy::unwrap_used)]

mod accept_common;

use accept_common::{perms, Env};
use shade_fusefs::accept::{apply, AcceptOptions};
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

fn mkdir(path: PathBuf) -> PlanOp {
    PlanOp::Mkdir {
        path,
        perms: perms(0o755),
        base: Base::Absent,
        base_at: None,
    }
}

#[test]
fn a_deep_chain_is_accepted_whole() {
    let mut env = Env::new();
    let mut plan = Vec::new();
    let mut p = PathBuf::new();
    for _ in 0..1500 {
        p.push("d");
        plan.push(mkdir(p.clone()));
    }
    let leaf = p.join("leaf");
    plan.push(env.write(leaf.to_str().unwrap(), b"x", 0o644, Base::Absent));
    let report = apply(&env.root, plan, &opts(&env)).unwrap();
    assert_eq!(report.created_dirs, 1500);
    assert_eq!(std::fs::read(env.root.join(&leaf)).unwrap(), b"x");
    env.assert_clean();
}

#[test]
fn directories_replaced_on_the_way_are_walked_again() {
    let mut env = Env::new();
    std::fs::create_dir_all(env.root.join("a/b/c")).unwrap();
    std::fs::write(env.root.join("a/b/c/old"), "old").unwrap();
    std::fs::create_dir_all(env.root.join("x/y")).unwrap();
    let mut plan = vec![env.write("a/b/c/new", b"new", 0o644, Base::Absent)];
    // x/y, a directory, becomes a file; then a file beside it.
    plan.push(PlanOp::Delete {
        path: "x/y".into(),
        base: env.base("x/y"),
        base_at: None,
    });
    plan.push(env.write("x/y", b"file now", 0o644, Base::Absent));
    plan.push(env.write("x/w", b"w", 0o644, Base::Absent));
    let report = apply(&env.root, plan, &opts(&env)).unwrap();
    assert!(report.not_applied.is_empty(), "{report:?}");
    let names = |d: &str| {
        let mut v: Vec<String> = std::fs::read_dir(env.root.join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("a/b/c"), ["new", "old"]);
    assert_eq!(std::fs::read(env.root.join("x/y")).unwrap(), b"file now");
    assert_eq!(names("x"), ["w", "y"]);
    env.assert_clean();
}

/// A chain already in the project, a file written at each of its levels: every lookup of
/// pre-flight, history and apply keeps the directories of the last walk open, so each
/// level is opened a few times in all, not once per op below it (1,000 levels opened
/// 3,005,003 directories when each lookup walked from the root; 6,003 now).
#[test]
fn an_existing_deep_chain_is_walked_in_linear_work() {
    let depth = 1000;
    let mut env = Env::new();
    let chain: PathBuf = std::iter::repeat_n("d", depth).collect();
    std::fs::create_dir_all(env.root.join(&chain)).unwrap();
    let mut plan = Vec::new();
    let mut p = PathBuf::new();
    for _ in 0..depth {
        p.push("d");
        plan.push(env.write(p.join("f").to_str().unwrap(), b"x", 0o644, Base::Absent));
    }
    let before = shade_fusefs::accept::dirs_opened();
    let report = apply(&env.root, plan, &opts(&env)).unwrap();
    let opened = shade_fusefs::accept::dirs_opened() - before;
    assert!(report.not_applied.is_empty(), "{report:?}");
    assert!(
        opened < 10 * depth as u64,
        "{opened} directories opened for a plan over {depth} levels"
    );
    assert_eq!(
        std::fs::read(env.root.join(&chain).join("f")).unwrap(),
        b"x"
    );
    env.assert_clean();
}

/// Undoing the accept of a new deep chain looks each level up through one walker and reads
/// the tree it removes once, from its outermost directory (each level's own subtree read
/// again was quadratic in the depth, and each lookup walked from the root).
#[test]
fn undoing_a_deep_chain_is_linear_work() {
    let depth = 1000;
    let mut env = Env::new();
    let mut plan = Vec::new();
    let mut p = PathBuf::new();
    for _ in 0..depth {
        p.push("d");
        plan.push(mkdir(p.clone()));
        plan.push(env.write(p.join("f").to_str().unwrap(), b"x", 0o644, Base::Absent));
    }
    apply(&env.root, plan, &opts(&env)).unwrap();
    let before = shade_fusefs::accept::dirs_opened();
    let report = shade_fusefs::undo::undo(
        &env.state,
        &env.root,
        None,
        &shade_fusefs::undo::UndoOptions::default(),
    )
    .unwrap();
    let opened = shade_fusefs::accept::dirs_opened() - before;
    eprintln!("undo of a {depth}-deep chain opened {opened} directories");
    assert!(
        opened < 20 * depth as u64,
        "{opened} directories opened to undo {depth} levels: {report:?}"
    );
    assert!(!env.root.join("d").exists(), "{report:?}");
    env.assert_clean();
}

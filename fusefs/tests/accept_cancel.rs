//! A termination signal (Ctrl-C) before an accept's commit point cancels it: nothing is
//! written and the project is as before (a hostile branch's huge file must not hold the
//! user's terminal hostage). A test binary of its own: the signal is process-wide.
#![allow(clippy::unwrap_used)]

mod accept_common;

use accept_common::{perms, Env};
use shade_fusefs::accept::{apply, AcceptOptions, DeferSignals};
use shade_fusefs::{Base, PlanOp};

fn opts(env: &Env) -> AcceptOptions {
    AcceptOptions {
        force: false,
        state: env.state.clone(),
        reads: Vec::new(),
        own: None,
    }
}

/// A content file holding `data`.
fn content(env: &Env, name: &str, data: &[u8]) -> std::fs::File {
    let p = env.dir.join(name);
    std::fs::write(&p, data).unwrap();
    std::fs::File::open(&p).unwrap()
}

#[test]
fn a_signal_before_the_commit_point_cancels_the_accept() {
    let env = Env::new();
    std::fs::write(env.root.join("a"), "old\n").unwrap();
    let outer = DeferSignals::for_cleanup();
    // SAFETY: signalling this thread (handled before raise returns); the guard notes it
    // instead of exiting.
    unsafe {
        libc::raise(libc::SIGINT);
    }
    assert_eq!(outer.pending(), [libc::SIGINT]);
    let mut plan = vec![PlanOp::WriteFile {
        path: "a".into(),
        content: content(&env, "new", b"new\n"),
        perms: perms(0o644),
        base: env.base("a"),
        base_at: None,
    }];
    plan.push(PlanOp::WriteFile {
        path: "b".into(),
        content: content(&env, "b", b"b\n"),
        perms: perms(0o644),
        base: Base::Absent,
        base_at: None,
    });
    let e = apply(&env.root, plan, &opts(&env)).unwrap_err();
    assert!(e.to_string().contains("cancelled"), "{e}");
    assert_eq!(outer.take(), [libc::SIGINT]);
    assert_eq!(
        std::fs::read_to_string(env.root.join("a")).unwrap(),
        "old\n"
    );
    assert!(!env.root.join("b").exists());
    env.assert_clean();
}

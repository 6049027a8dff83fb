#![allow(clippy::unwrap_used)]
mod accept_common;
use accept_common::{perms, Env};
use shade_fusefs::accept::{apply, dirs_opened, AcceptOptions};
use shade_fusefs::{Base, PlanOp};
use std::path::PathBuf;
#[test]
fn bench() {
    let depths: Vec<usize> = std::env::var("DEPTHS")
        .unwrap_or("1000,2000".into())
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    for &depth in &depths {
        // A: a new chain.
        let mut env = Env::new();
        let mut plan = Vec::new();
        let mut p = PathBuf::new();
        for _ in 0..depth {
            p.push("d");
            plan.push(PlanOp::Mkdir {
                path: p.clone(),
                perms: perms(0o755),
                base: Base::Absent,
                base_at: None,
            });
        }
        let leaf = p.join("leaf");
        plan.push(env.write(leaf.to_str().unwrap(), b"x", 0o644, Base::Absent));
        let opts = AcceptOptions {
            force: false,
            state: env.state.clone(),
            reads: Vec::new(),
            own: None,
        };
        let (t, n) = (std::time::Instant::now(), dirs_opened());
        apply(&env.root, plan, &opts).unwrap();
        eprintln!(
            "BENCH new chain depth {depth}: {:?}, {} dirs opened",
            t.elapsed(),
            dirs_opened() - n
        );
        // B: an existing chain, a file written at each level.
        let mut env = Env::new();
        let mut p = PathBuf::new();
        for _ in 0..depth {
            p.push("d");
        }
        std::fs::create_dir_all(env.root.join(&p)).unwrap();
        let mut plan = Vec::new();
        let mut p = PathBuf::new();
        for _ in 0..depth {
            p.push("d");
            plan.push(env.write(p.join("f").to_str().unwrap(), b"x", 0o644, Base::Absent));
        }
        let opts = AcceptOptions {
            force: false,
            state: env.state.clone(),
            reads: Vec::new(),
            own: None,
        };
        let (t, n) = (std::time::Instant::now(), dirs_opened());
        apply(&env.root, plan, &opts).unwrap();
        eprintln!(
            "BENCH existing chain depth {depth}: {:?}, {} dirs opened",
            t.elapsed(),
            dirs_opened() - n
        );
    }
}

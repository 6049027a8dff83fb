//! The branch's metadata budget (`BranchLimits::metadata`) holds for what a rename moves:
//! every path below a renamed directory is kept again under its new name, so a directory
//! of many files moved under a chain of long names grew shade's memory by files × depth
//! while only the renamed entry was charged (red team round 9: 493 MiB against 16 MiB).
#![allow(clippy::unwrap_used)]

use shade_fusefs::{Branch, BranchLimits};
use std::fs;

mod branch_common;
use branch_common::{opts, require_root, serial};

#[test]
fn a_rename_that_lengthens_every_path_below_past_the_budget_is_refused() {
    require_root();
    let _s = serial();
    let tmp = tempfile::Builder::new()
        .prefix("shade-budget-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = tmp.path().join("project");
    fs::create_dir(&p).unwrap();
    fs::write(p.join("a"), "a\n").unwrap();
    let mut o = opts(&tmp.path().join("state"));
    o.limits = BranchLimits {
        size: None,
        metadata: Some(2 << 20),
    };
    let b = Branch::create(&p, &o).unwrap();
    let m = b.mountpoint().to_path_buf();
    // 2,000 new files, each known to the kernel.
    fs::create_dir(m.join("d")).unwrap();
    for i in 0..2000 {
        fs::write(m.join(format!("d/f{i}")), "").unwrap();
        fs::metadata(m.join(format!("d/f{i}"))).unwrap();
    }
    // A chain of 8 names of 255 bytes: 2 KiB more on each of those paths, past 2 MiB.
    let name = "n".repeat(255);
    let mut deep = m.clone();
    for _ in 0..8 {
        deep.push(&name);
        fs::create_dir(&deep).unwrap();
    }
    let err = fs::rename(m.join("d"), deep.join("d")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(
        m.join("d/f1999").exists(),
        "the refused rename moved something"
    );
    assert!(!deep.join("d").exists());
    // Exchanged with an empty directory down there: refused the same way.
    fs::create_dir(deep.join("x")).unwrap();
    let exchanged = nix::fcntl::renameat2(
        None,
        &m.join("d"),
        None,
        &deep.join("x"),
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    );
    assert_eq!(exchanged, Err(nix::errno::Errno::ENOSPC));
    // A rename that does not lengthen the paths still works.
    fs::rename(m.join("d"), m.join("e")).unwrap();
    assert!(m.join("e/f1999").exists());
    drop(b);
    shade_fusefs::drain_branch_pool();
}

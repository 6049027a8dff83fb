//! A branch whose lower is another branch's mount: what a speculation in a `--shadow`
//! session would be. Its accept writes into the outer branch, never into the project.
#![allow(clippy::unwrap_used)]

mod common;

use common::Fixture;
use shade_fusefs::{AcceptFlags, Branch};
use std::fs;
use std::os::unix::fs::MetadataExt;

fn drop_caches() {
    // Makes the kernel forget the outer mount's unused dentries and inodes (FORGET).
    let _ = std::process::Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

#[test]
fn inner_accept_lands_in_outer_branch_after_caches_dropped() {
    common::require_fuse_root();
    let fx = Fixture::new();
    fx.write("a.txt", "lower a\n");
    fx.write("b.txt", "lower b\n");
    fx.write("sub/c.txt", "lower c\n");
    fx.write("gone.txt", "to delete\n");
    let outer = Branch::create(&fx.project, &fx.options()).unwrap();
    let om = outer.mountpoint().to_path_buf();
    // A live edit in the outer branch.
    fs::write(om.join("a.txt"), "outer edit\n").unwrap();
    let ino_b1 = fs::metadata(om.join("b.txt")).unwrap().ino();
    let inner = Branch::create(&om, &fx.options()).unwrap();
    let im = inner.mountpoint().to_path_buf();
    assert_eq!(
        fs::read_to_string(im.join("a.txt")).unwrap(),
        "outer edit\n"
    );
    fs::write(im.join("b.txt"), "inner b\n").unwrap();
    fs::write(im.join("a.txt"), "inner a\n").unwrap();
    fs::write(im.join("sub/new.txt"), "inner new\n").unwrap();
    fs::remove_file(im.join("gone.txt")).unwrap();
    drop_caches();
    // Were the number to change here, the accept below would refuse b.txt and gone.txt
    // as "changed meanwhile".
    assert_eq!(fs::metadata(om.join("b.txt")).unwrap().ino(), ino_b1);
    inner.check_accept(AcceptFlags::default()).unwrap();
    inner.accept(AcceptFlags::default()).unwrap();
    assert_eq!(fx.read("a.txt"), "lower a\n");
    assert_eq!(fx.read("b.txt"), "lower b\n");
    assert_eq!(fs::read_to_string(om.join("b.txt")).unwrap(), "inner b\n");
    assert_eq!(fs::read_to_string(om.join("a.txt")).unwrap(), "inner a\n");
    assert_eq!(
        fs::read_to_string(om.join("sub/new.txt")).unwrap(),
        "inner new\n"
    );
    assert!(!om.join("gone.txt").exists());
    outer.accept(AcceptFlags::default()).unwrap();
    assert_eq!(fx.read("b.txt"), "inner b\n");
    assert_eq!(fx.read("sub/new.txt"), "inner new\n");
    assert!(!fx.project.join("gone.txt").exists());
    common::assert_no_shade_mounts(&fx.options().state);
}

#[test]
fn inner_sees_later_outer_writes_and_refuses_a_conflicting_accept() {
    common::require_fuse_root();
    let fx = Fixture::new();
    fx.write("a.txt", "lower a\n");
    fx.write("sub/c.txt", "lower c\n");
    let outer = Branch::create(&fx.project, &fx.options()).unwrap();
    let om = outer.mountpoint().to_path_buf();
    let inner = Branch::create(&om, &fx.options()).unwrap();
    let im = inner.mountpoint().to_path_buf();
    // Read (and so cached) in the inner branch, then changed through the outer mount.
    assert_eq!(fs::read_to_string(im.join("a.txt")).unwrap(), "lower a\n");
    assert!(fs::read_dir(im.join("sub")).unwrap().count() == 1);
    fs::write(om.join("a.txt"), "outer later\n").unwrap();
    fs::write(om.join("sub/d.txt"), "outer new\n").unwrap();
    assert_eq!(
        fs::read_to_string(im.join("a.txt")).unwrap(),
        "outer later\n"
    );
    assert_eq!(
        fs::read_to_string(im.join("sub/d.txt")).unwrap(),
        "outer new\n"
    );
    // The inner branch edits c.txt; the outer then changes it too: accept must refuse.
    fs::write(im.join("sub/c.txt"), "inner c\n").unwrap();
    fs::write(im.join("e.txt"), "inner e\n").unwrap();
    fs::write(om.join("sub/c.txt"), "outer c\n").unwrap();
    match inner.check_accept(AcceptFlags::default()) {
        Err(shade_fusefs::AcceptError::Conflicts(c)) => {
            assert_eq!(c.len(), 1, "{c:?}");
            assert_eq!(c[0].path, std::path::Path::new("sub/c.txt"));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        inner.accept(AcceptFlags::default()),
        Err(shade_fusefs::AcceptError::Conflicts(_))
    ));
    assert_eq!(
        fs::read_to_string(om.join("sub/c.txt")).unwrap(),
        "outer c\n"
    );
    assert!(
        !om.join("e.txt").exists(),
        "nothing of a refused accept lands"
    );
    assert_eq!(fx.read("sub/c.txt"), "lower c\n");
    drop(outer);
    common::assert_no_shade_mounts(&fx.options().state);
}

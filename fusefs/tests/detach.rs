//! Idle branches without a FUSE connection (issue 31, scale) on real mounts: a branch that
//! let its connection go (`Branch::detach`) and takes one again (`Branch::attach`) — the one
//! another branch used meanwhile, or a new mount — sees exactly its own changes (contents,
//! listings, attributes, negative entries, page cache) and nothing of the other branch,
//! sees what the user changed in between, keeps accept's conflict base, and many detached
//! branches hold no thread or descriptor each. As root and as the plain user.
#![allow(clippy::unwrap_used)]

use shade_fusefs::{AcceptFlags, Branch};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod branch_common;
use branch_common::{git, opts, require_root, serial, sh};

/// A small git project, all committed.
fn project(root: &Path) -> PathBuf {
    let p = root.join("project");
    fs::create_dir_all(p.join("d/e")).unwrap();
    for (f, c) in [
        ("a.txt", "alpha\n"),
        ("b.txt", "bravo\n"),
        ("c.txt", "charlie\n"),
        ("u.txt", "user's\n"),
        ("z.txt", "zulu\n"),
        ("s.sh", "echo hi\n"),
        ("d/x.txt", "x\n"),
        ("d/e/y.txt", "y\n"),
    ] {
        fs::write(p.join(f), c).unwrap();
    }
    sh(&p, "find . -exec touch -h -d @1500000000 {} +");
    git(&p, "init -q");
    git(&p, "add -A");
    git(&p, "commit -q -m init");
    p
}

/// What `ls`, `stat` (inode numbers left out: see `own_numbers`), `cat` and `git status`
/// show of a tree.
fn view(dir: &Path) -> String {
    let mut out = sh(
        dir,
        "find . -mindepth 1 -path ./.git -prune -o -print | sort | \
         xargs stat -c '%n %F %s %a %u %g %h %Y'; \
         ls -laR --ignore=.git --time-style=+ . | grep -v ' \\.\\.\\?$' | grep -v '^total'; \
         for f in $(find . -path ./.git -prune -o -type f -print | sort); do echo \"== $f\"; cat \"$f\"; done",
    );
    out.push_str("-- git status\n");
    out.push_str(&git(dir, "status --porcelain"));
    out
}

/// The inode numbers of objects a branch made or changed: they stay the branch's across a
/// detach.
fn own_numbers(dir: &Path, names: &str) -> String {
    sh(dir, &format!("stat -c '%n %i' {names}"))
}

/// Warm the kernel's caches of the mount and change everything one can through real
/// programs (`tag` makes the changes of two branches differ).
fn make_changes(m: &Path, tag: &str) {
    view(m);
    let missing = sh(m, "stat -c %n later.txt 2>&1; echo rc=$?");
    assert!(missing.contains("rc=1"), "{missing}");
    sh(
        m,
        &format!(
            "echo {tag} > a.txt; rm b.txt; mv c.txt c-{tag}.txt; chmod 755 s.sh; \
             echo {tag}-later > later.txt; mkdir -p new-{tag}/deep; echo n > new-{tag}/deep/n.txt; \
             echo {tag} >> d/x.txt; mv d/e d/e-{tag}; touch -d @1000000000 u.txt; \
             cat a.txt later.txt d/x.txt c-{tag}.txt new-{tag}/deep/n.txt > /dev/null"
        ),
    );
    assert_eq!(
        fs::read_to_string(m.join("a.txt")).unwrap(),
        format!("{tag}\n")
    );
}

/// Two branches of one project take turns on connections; each sees only its own changes.
/// Returns whether they took turns on one connection (the pool may refuse a connection
/// that another mount namespace copied meanwhile: other tests' sandboxes on this machine).
fn two_branches_take_turns(tmp: &Path, pool: usize) -> bool {
    shade_fusefs::set_pool_size(pool);
    let p = project(tmp);
    let native = view(&p);
    let state = tmp.join("state");
    let owned = "a.txt later.txt c-one.txt new-one new-one/deep/n.txt d/x.txt s.sh";

    let mut b1 = Branch::create(&p, &opts(&state)).unwrap();
    let m1 = b1.mountpoint().to_path_buf();
    assert_eq!(view(&m1), native);
    make_changes(&m1, "one");
    let v1 = view(&m1);
    let n1 = own_numbers(&m1, owned);
    let reads1 = b1.reads_recorded();
    let changes1 = b1.changeset(false).changes;
    b1.detach().unwrap();
    assert!(b1.is_detached());
    assert!(
        !b1.mountpoint().exists(),
        "a detached branch names no directory"
    );
    assert_eq!(b1.changeset(false).changes, changes1, "changes kept");
    assert_eq!(b1.reads_recorded(), reads1, "accept's base kept");

    // Branch 2 takes the connection (pooled) and sees the pristine project, then makes
    // changes of its own to the same names.
    let mut b2 = Branch::create(&p, &opts(&state)).unwrap();
    let m2 = b2.mountpoint().to_path_buf();
    let mut turns = b2.reused_connection() && m2 == m1;
    assert_eq!(view(&m2), native, "nothing of branch 1 in branch 2");
    make_changes(&m2, "two");
    let v2 = view(&m2);
    b2.detach().unwrap();

    // Branch 1 again: on branch 2's connection (pooled), or a new mount.
    b1.attach().unwrap();
    let m1 = b1.mountpoint().to_path_buf();
    turns &= m1 == m2;
    assert_eq!(view(&m1), v1, "branch 1 sees exactly its own changes");
    assert_eq!(
        own_numbers(&m1, owned),
        n1,
        "its objects keep their numbers"
    );
    assert!(b1.reads_recorded() >= reads1);
    // The user changes a file neither branch touched while branch 1 is detached again.
    b1.detach().unwrap();
    fs::write(p.join("z.txt"), "the user's new zulu\n").unwrap();
    b1.attach().unwrap();
    let m1 = b1.mountpoint().to_path_buf();
    assert_eq!(
        fs::read_to_string(m1.join("z.txt")).unwrap(),
        "the user's new zulu\n"
    );
    fs::write(p.join("z.txt"), "zulu\n").unwrap();
    sh(&p, "touch -d @1500000000 z.txt");

    // Branch 2 back too, both attached at once (one of them on a new mount).
    b2.attach().unwrap();
    let m2 = b2.mountpoint().to_path_buf();
    assert_ne!(m1, m2);
    assert_eq!(view(&m2), v2, "branch 2 sees exactly its own changes");
    assert_eq!(view(&m1), v1, "and branch 1 its own");

    // Branch 1 writes after re-attaching, and its accept is conflict-checked against what
    // it read: the project gets branch 1's changes.
    sh(&m1, "echo more >> later.txt");
    b1.detach().unwrap();
    b1.accept(AcceptFlags::default()).unwrap();
    assert_eq!(fs::read_to_string(p.join("a.txt")).unwrap(), "one\n");
    assert_eq!(
        fs::read_to_string(p.join("later.txt")).unwrap(),
        "one-later\nmore\n"
    );
    assert!(!p.join("b.txt").exists());
    assert!(p.join("d/e-one/y.txt").exists());
    // Branch 2 read a.txt before the accept changed it: its accept is refused.
    b2.detach().unwrap();
    assert!(
        b2.accept(AcceptFlags::default()).is_err(),
        "branch 2's conflict base is kept across detach"
    );
    shade_fusefs::drain_branch_pool();
    assert!(
        shade_mounts_under(&state).is_empty(),
        "{:?}",
        shade_mounts_under(&state)
    );
    let left: Vec<_> = fs::read_dir(state.join("branches"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "state left: {left:?}");
    turns
}

/// [`two_branches_take_turns`] until the two took turns on one connection (at most 5 tries).
fn take_turns_on_one_connection(tmp: &Path) {
    for i in 0..5 {
        if two_branches_take_turns(&tmp.join(format!("try{i}")), 2) {
            return;
        }
        eprintln!("try {i}: the connection was not pooled (a copy in another namespace?)");
    }
    panic!("in 5 tries the two branches never took turns on one connection");
}

#[test]
fn a_reattached_branch_sees_its_own_changes_on_a_pooled_connection() {
    require_root();
    let _s = serial();
    let tmp = tempfile::Builder::new()
        .prefix("shade-detach-")
        .tempdir_in("/var/tmp")
        .unwrap();
    take_turns_on_one_connection(tmp.path());
}

#[test]
fn a_reattached_branch_sees_its_own_changes_without_a_pool() {
    require_root();
    let _s = serial();
    let tmp = tempfile::Builder::new()
        .prefix("shade-detach-")
        .tempdir_in("/var/tmp")
        .unwrap();
    assert!(!two_branches_take_turns(tmp.path(), 0));
    shade_fusefs::set_pool_size(2);
}

/// A pooled-connection test's project and state dir, in a temp dir that lives as long as
/// the first value.
fn pooled_project() -> (tempfile::TempDir, PathBuf, PathBuf) {
    shade_fusefs::set_pool_size(2);
    let tmp = tempfile::Builder::new()
        .prefix("shade-detach-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");
    (tmp, p, state)
}

/// Drop the branch and the pool: nothing of the state dir stays mounted.
fn drop_all(b: Branch, state: &Path) {
    drop(b);
    shade_fusefs::drain_branch_pool();
    assert!(shade_mounts_under(state).is_empty());
}

#[test]
fn a_branch_something_refers_into_stays_attached() {
    require_root();
    let _s = serial();
    let (_tmp, p, state) = pooled_project();
    let mut b = Branch::create(&p, &opts(&state)).unwrap();
    let m = b.mountpoint().to_path_buf();
    fs::write(m.join("a.txt"), "mine\n").unwrap();
    let held = fs::File::open(m.join("d")).unwrap();
    let why = b.detach().unwrap_err();
    // (A copy of the mount in another namespace would not keep it attached: the pool does
    // not hand such a connection to any branch.)
    assert!(why.contains("refers into it"), "{why}");
    assert!(!b.is_detached());
    assert_eq!(fs::read_to_string(m.join("a.txt")).unwrap(), "mine\n");
    drop(held);
    b.detach().unwrap();
    drop_all(b, &state);
}

/// A branch whose warm-up walk (`Branch::warm_up`: it lists every directory through the
/// mount) is still going detaches anyway: the walk is only speed, and it ends first. It
/// used to count as something referring into the mount (CI: an idle speculation's shadow
/// could not be detached under load).
#[test]
fn a_branch_still_warming_up_detaches() {
    require_root();
    let _s = serial();
    let (_tmp, p, state) = pooled_project();
    // Wide directories: the walk spends its time listing them, a directory open all along.
    for d in 0..10 {
        let d = p.join(format!("w/{d}"));
        fs::create_dir_all(&d).unwrap();
        for i in 0..2000 {
            fs::write(d.join(format!("file-with-a-long-name-{i}")), "").unwrap();
        }
    }
    let mut b = Branch::create(&p, &opts(&state)).unwrap();
    fs::write(b.mountpoint().join("a.txt"), "mine\n").unwrap();
    b.warm_up().unwrap();
    // Let the walk get going: it lists the big directories now.
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(
        !b.warmed(),
        "the walk ended before the detach: make the tree bigger"
    );
    b.detach().unwrap();
    assert!(b.is_detached());
    b.attach().unwrap();
    assert_eq!(
        fs::read_to_string(b.mountpoint().join("a.txt")).unwrap(),
        "mine\n"
    );
    drop_all(b, &state);
}

/// Many detached branches: threads and descriptors do not grow with them, and each sees
/// its own change when it attaches again.
#[test]
fn many_detached_branches_hold_no_threads_or_descriptors() {
    require_root();
    let _s = serial();
    let (_tmp, p, state) = pooled_project();
    let count = |d: &str| fs::read_dir(d).unwrap().count();
    let mut warm = Branch::create(&p, &opts(&state)).unwrap();
    warm.detach().unwrap();
    let (threads0, fds0) = (count("/proc/self/task"), count("/proc/self/fd"));
    let mut all = Vec::new();
    for i in 0..60 {
        // Half made attached, half made detached and attached to write.
        let mut b = if i % 2 == 0 {
            Branch::create(&p, &opts(&state)).unwrap()
        } else {
            let mut b = Branch::create_detached(&p, &opts(&state)).unwrap();
            assert!(b.is_detached());
            b.attach().unwrap();
            b
        };
        fs::write(
            b.mountpoint().join(format!("new-{i}.txt")),
            format!("{i}\n"),
        )
        .unwrap();
        fs::write(b.mountpoint().join("a.txt"), format!("a{i}\n")).unwrap();
        b.detach().unwrap();
        all.push(b);
    }
    let (threads1, fds1) = (count("/proc/self/task"), count("/proc/self/fd"));
    assert!(
        threads1 <= threads0 + 4,
        "threads grew with detached branches: {threads0} → {threads1}"
    );
    // One memory file per changed file's contents (content.rs), nothing per branch else.
    assert!(
        fds1 <= fds0 + 2 * 60 + 8,
        "descriptors grew past the branches' contents: {fds0} → {fds1}"
    );
    for (i, b) in all.iter_mut().enumerate().rev() {
        b.attach().unwrap();
        let m = b.mountpoint().to_path_buf();
        assert_eq!(
            fs::read_to_string(m.join("a.txt")).unwrap(),
            format!("a{i}\n")
        );
        let mine = format!("new-{i}.txt");
        let names: Vec<String> = fs::read_dir(&m)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("new-"))
            .collect();
        assert_eq!(names, vec![mine], "branch {i} lists only its own new file");
        b.detach().unwrap();
    }
    drop(all);
    drop(warm);
    shade_fusefs::drain_branch_pool();
    assert!(shade_mounts_under(&state).is_empty());
}

fn shade_mounts_under(state: &Path) -> Vec<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = state.to_str().unwrap();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(want))
        .map(str::to_string)
        .collect()
}

/// Not a test on its own: run as the plain user by the test below.
#[test]
#[ignore = "run as the plain user by the test below, not a test on its own"]
fn helper_detach_as_plain_user() {
    if std::env::var_os("SHADE_DETACH_USER_HELPER").is_none() {
        return;
    }
    assert!(
        !nix::unistd::geteuid().is_root(),
        "meant for the plain user"
    );
    let tmp = tempfile::Builder::new()
        .prefix("shade-detach-user-")
        .tempdir_in("/var/tmp")
        .unwrap();
    take_turns_on_one_connection(&tmp.path().join("pooled"));
    assert!(!two_branches_take_turns(&tmp.path().join("unpooled"), 0));
    shade_fusefs::set_pool_size(2);
    println!("detach-as-user-ok");
}

#[test]
fn a_reattached_branch_sees_its_own_changes_as_the_plain_user() {
    require_root();
    let user = nix::unistd::User::from_name("shadetest")
        .unwrap()
        .expect("the plain test user shadetest (scripts/setup.sh makes it)");
    let out = Command::new("runuser")
        .args(["-u", "shadetest", "--", "env", "SHADE_DETACH_USER_HELPER=1"])
        .arg(format!("HOME={}", user.dir.display()))
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_detach_as_plain_user",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_remove("SHADE_BRANCH_POOL")
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("detach-as-user-ok"),
        "as the plain user:\n{text}"
    );
}

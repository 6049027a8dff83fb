//! Warm connections from the pool (issue 31) on real mounts: a branch that takes a
//! connection an earlier branch used carries nothing of it — contents, listings, attributes,
//! negative entries, page cache, reads — and sees the project as it is now (changed by the
//! user meanwhile, or by the earlier branch's accept). The pool is emptied at exit, and a
//! `kill -9` leaves nothing `cleanup_stale` does not remove.
#![allow(clippy::unwrap_used)]

use shade_fusefs::{cleanup_stale, AcceptFlags, Branch, StateDir};
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod branch_common;
use branch_common::{git, opts, require_root, serial, sh};

/// A small git project: files, a directory, a script, all committed.
fn project(root: &Path) -> PathBuf {
    let p = root.join("project");
    fs::create_dir_all(p.join("d/e")).unwrap();
    fs::write(p.join("a.txt"), "alpha\n").unwrap();
    fs::write(p.join("b.txt"), "bravo\n").unwrap();
    fs::write(p.join("c.txt"), "charlie\n").unwrap();
    fs::write(p.join("u.txt"), "user's\n").unwrap();
    fs::write(p.join("s.sh"), "echo hi\n").unwrap();
    fs::write(p.join("d/x.txt"), "x\n").unwrap();
    fs::write(p.join("d/e/y.txt"), "y\n").unwrap();
    // Old times: git's index then holds no racily clean entries, which any `git status`
    // would check again and rewrite the index for.
    sh(&p, "find . -exec touch -h -d @1500000000 {} +");
    git(&p, "init -q");
    git(&p, "add -A");
    git(&p, "commit -q -m init");
    p
}

/// What `ls`, `stat`, `cat` and `git status` show of a tree (the root's own line left out:
/// a branch's root is node 1).
fn view(dir: &Path) -> String {
    let mut out = sh(
        dir,
        "find . -mindepth 1 -path ./.git -prune -o -print | sort | \
         xargs stat -c '%n %F %s %a %u %g %i %h %Y'; \
         ls -laR --ignore=.git --time-style=+ . | grep -v ' \\.\\.\\?$' | grep -v '^total'; \
         for f in $(find . -path ./.git -prune -o -type f -print | sort); do echo \"== $f\"; cat \"$f\"; done",
    );
    out.push_str("-- git status\n");
    out.push_str(&git(dir, "status --porcelain"));
    out
}

/// Warm the kernel's caches of the mount and change everything one can, through real
/// programs: writes, deletes, renames, chmod, a negative entry turned into a file, a new
/// directory, and page cache of the changed files.
fn make_changes(m: &Path) {
    view(m);
    let missing = sh(m, "stat -c %n later.txt 2>&1; echo rc=$?");
    assert!(missing.contains("rc=1"), "{missing}");
    sh(
        m,
        "echo changed > a.txt; rm b.txt; mv c.txt c2.txt; chmod 755 s.sh; \
         echo later > later.txt; mkdir -p newdir/deep; echo n > newdir/deep/n.txt; \
         echo more >> d/x.txt; mv d/e d/e2; touch -d @1000000000 u.txt; \
         cat a.txt later.txt d/x.txt c2.txt newdir/deep/n.txt > /dev/null",
    );
    assert_eq!(fs::read_to_string(m.join("a.txt")).unwrap(), "changed\n");
    assert!(m.join("later.txt").exists());
}

#[test]
fn a_reused_connection_shows_the_pristine_project() {
    require_root();
    let _serial = serial();
    shade_fusefs::set_pool_size(2);
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let native = view(&p);
    let state = tmp.path().join("state");

    let b1 = Branch::create(&p, &opts(&state)).unwrap();
    let m1 = b1.mountpoint().to_path_buf();
    assert!(!b1.reused_connection());
    assert_eq!(view(&m1), native, "a new branch shows the project");
    make_changes(&m1);
    assert!(!b1.changeset(false).changes.is_empty());
    assert!(b1.reads_recorded() > 0);
    b1.abort();

    // The user changes a file the branch read (its pages are cached) while the connection
    // waits in the pool.
    fs::write(p.join("d/e/y.txt"), "the user's new y\n").unwrap();
    sh(&p, "touch -d @1500000001 d/e/y.txt");
    let native = view(&p);

    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(b2.reused_connection(), "the pooled connection was taken");
    assert_eq!(b2.mountpoint(), m1, "the same mount");
    assert_eq!(
        b2.reads_recorded(),
        0,
        "accept's conflict base starts empty"
    );
    assert!(b2.changeset(false).changes.is_empty());
    assert_eq!(view(&m1), native, "branch 2 sees the project as it is now");
    assert_eq!(
        fs::read_to_string(m1.join("d/e/y.txt")).unwrap(),
        "the user's new y\n"
    );
    // A read-only git status left no change, and branch 2 works as any branch.
    assert!(
        b2.changeset(false).changes.is_empty(),
        "git status changed nothing"
    );
    sh(&m1, "echo two > a.txt");
    assert_eq!(fs::read_to_string(m1.join("a.txt")).unwrap(), "two\n");
    assert_eq!(fs::read_to_string(p.join("a.txt")).unwrap(), "alpha\n");
    drop(b2);
    assert!(shade_fusefs::drain_branch_pool() >= 1);
    assert!(!is_mounted(&m1), "drained: unmounted");
    assert!(!m1.exists(), "drained: its directory removed");
}

#[test]
fn a_connection_reused_after_an_accept_shows_the_accepted_project() {
    require_root();
    let _serial = serial();
    shade_fusefs::set_pool_size(2);
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");

    let b1 = Branch::create(&p, &opts(&state)).unwrap();
    let m = b1.mountpoint().to_path_buf();
    make_changes(&m);
    b1.accept(AcceptFlags::default()).unwrap();
    assert_eq!(fs::read_to_string(p.join("a.txt")).unwrap(), "changed\n");
    let native = view(&p);

    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(b2.reused_connection());
    assert_eq!(b2.reads_recorded(), 0);
    assert_eq!(view(&m), native, "branch 2 sees the accepted project");
    // (Its `git status` may rewrite `.git/index`, as in a fresh branch: the accepted files
    // are as new as the index the native `git status` wrote, which git takes as racy.)
    let changes = b2.changeset(false).changes;
    assert!(
        changes.iter().all(|c| c.path == Path::new(".git/index")),
        "nothing of branch 1 shows as a change: {changes:?}"
    );
    drop(b2);
    shade_fusefs::drain_branch_pool();
    assert!(!is_mounted(&m));
}

#[test]
fn a_parked_connection_takes_no_change_and_hands_none_on() {
    require_root();
    let _serial = serial();
    shade_fusefs::set_pool_size(2);
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");
    let b1 = Branch::create(&p, &opts(&state)).unwrap();
    let m = b1.mountpoint().to_path_buf();
    b1.abort();
    // Opened while the connection waits in the pool, as a stray process of the user's
    // could (one holding a reference when the branch ended gets no pooled connection: see
    // the tests below).
    let held = fs::File::open(&m).unwrap();
    let via = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&held)
    ));
    assert!(
        fs::write(via.join("stray.txt"), "stray\n").is_err(),
        "the parked connection refuses new files"
    );
    assert!(
        fs::write(via.join("a.txt"), "stray\n").is_err(),
        "and writes"
    );
    let _ = sh(
        &via,
        "chmod 777 s.sh; mkdir sd; ln -s a.txt sl; rm -f b.txt",
    );
    // Let go first: a connection something still refers into is not handed on (below).
    drop(held);
    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(b2.reused_connection());
    assert_eq!(
        b2.reads_recorded(),
        0,
        "no read of the parked time is the branch's"
    );
    let changes = b2.changeset(false).changes;
    assert!(changes.is_empty(), "nothing reached branch 2: {changes:?}");
    assert_eq!(view(&m), view(&p));
    drop(b2);
    shade_fusefs::drain_branch_pool();
}

/// A process that opened the parked connection (a stray process of the user's: only they
/// reach the state directory) and still holds it when a branch comes keeps the branch off
/// that connection: it would see the branch's files.
#[test]
fn a_parked_connection_held_open_is_not_handed_on() {
    require_root();
    let _serial = serial();
    shade_fusefs::set_pool_size(2);
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");
    let b1 = Branch::create(&p, &opts(&state)).unwrap();
    let m = b1.mountpoint().to_path_buf();
    b1.abort();
    let held = fs::File::open(&m).unwrap();
    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    fs::write(b2.mountpoint().join("new.txt"), "b2\n").unwrap();
    let via = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&held)
    ));
    let seen = fs::read_to_string(via.join("new.txt"));
    let reused = b2.reused_connection();
    drop(b2);
    drop(held);
    shade_fusefs::drain_branch_pool();
    assert!(!reused, "the branch took a connection a process held open");
    assert!(
        seen.is_err(),
        "the held descriptor reads the new branch: {seen:?}"
    );
}

#[test]
fn the_pool_keeps_at_most_its_size_and_lets_idle_connections_go() {
    require_root();
    let _serial = serial();
    shade_fusefs::drain_branch_pool();
    shade_fusefs::set_pool_size(1);
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");
    let b1 = Branch::create(&p, &opts(&state)).unwrap();
    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    let (m1, m2) = (b1.mountpoint().to_path_buf(), b2.mountpoint().to_path_buf());
    drop(b1);
    drop(b2);
    assert_eq!(shade_fusefs::pooled_count(), 1, "one per project");
    assert!(!is_mounted(&m1), "the older one was unmounted");
    assert!(is_mounted(&m2));
    // Idle too long: the reaper unmounts it.
    shade_fusefs::set_pool_idle(Duration::from_millis(200));
    let start = Instant::now();
    // The reaper takes it out of the pool, then unmounts it and removes its directory.
    let gone = || {
        shade_fusefs::pooled_count() == 0
            && !is_mounted(&m2)
            && fs::read_dir(state.join("branches")).unwrap().count() == 0
    };
    while !gone() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "an idle connection was kept past its idle limit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    shade_fusefs::set_pool_idle(Duration::from_secs(60));
    assert!(!is_mounted(&m2));
    assert_eq!(fs::read_dir(state.join("branches")).unwrap().count(), 0);
}

fn is_mounted(m: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = m.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want))
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

/// Not a test on its own: the process the lifecycle test starts (and kills or lets end).
/// It pools one connection of `SHADE_POOL_HELPER_PROJECT`, says so, and waits.
#[test]
#[ignore = "the process the lifecycle test starts, not a test on its own"]
fn helper_hold_a_pooled_connection() {
    let (Some(project), Some(state), Some(how)) = (
        std::env::var_os("SHADE_POOL_HELPER_PROJECT"),
        std::env::var_os("SHADE_POOL_HELPER_STATE"),
        std::env::var_os("SHADE_POOL_HELPER"),
    ) else {
        return;
    };
    shade_fusefs::set_pool_size(1);
    let b = Branch::create(Path::new(&project), &opts(Path::new(&state))).unwrap();
    fs::write(b.mountpoint().join("a.txt"), "changed in helper\n").unwrap();
    drop(b);
    assert_eq!(shade_fusefs::pooled_count(), 1);
    println!("pooled");
    if how == "wait" {
        // Killed by the test; ends by itself if the test is gone.
        std::thread::sleep(Duration::from_secs(120));
    }
    // "exit": the harness returns and the process exits; the pool is emptied at exit.
}

/// Start the helper; wait (bounded) until it has pooled its connection.
fn helper(p: &Path, state: &Path, how: &str) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_hold_a_pooled_connection",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SHADE_POOL_HELPER", how)
        .env("SHADE_POOL_HELPER_PROJECT", p)
        .env("SHADE_POOL_HELPER_STATE", state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("pooled") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the helper did not pool a connection in 60 s");
    }
    child
}

fn wait_bounded(child: &mut std::process::Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the helper did not end in 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_pool_is_emptied_at_exit_and_after_kill_9_by_cleanup() {
    require_root();
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");

    // A process that ends normally takes its pooled connection with it.
    let mut child = helper(&p, &state, "exit");
    assert!(wait_bounded(&mut child).success());
    assert_eq!(shade_mounts_under(&state), Vec::<String>::new());
    assert_eq!(fs::read_dir(state.join("branches")).unwrap().count(), 0);

    // One killed leaves its connection mounted (dead); cleanup finds it by its owner.
    let mut child = helper(&p, &state, "wait");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_bounded(&mut child);
    assert_eq!(
        shade_mounts_under(&state).len(),
        1,
        "left behind by kill -9"
    );
    let cleaned = cleanup_stale(&StateDir::at(state.clone()));
    assert_eq!(cleaned.len(), 1);
    assert_eq!(shade_mounts_under(&state), Vec::<String>::new());
    assert_eq!(fs::read_dir(state.join("branches")).unwrap().count(), 0);
    assert_eq!(fs::read_to_string(p.join("a.txt")).unwrap(), "alpha\n");
}

// ----- references held past a branch's end ---------------------------------------------
//
// Whatever still refers into a connection when its branch is dropped — an fd (O_PATH too:
// no OPEN reaches us), a cwd — would reach the next branch through a reused connection.
// Each test holds one, makes the next branch, uses it, and checks the next branch saw none
// of it: the connection was torn down instead of pooled.

/// A branch of a fresh project with pooling on, and what is left to check it with.
fn held_setup() -> (tempfile::TempDir, PathBuf, PathBuf, Branch) {
    require_root();
    shade_fusefs::set_pool_size(2);
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-held-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");
    let b1 = Branch::create(&p, &opts(&state)).unwrap();
    // Warm it, as a command would.
    view(b1.mountpoint());
    (tmp, p, state, b1)
}

/// The next branch of `p` saw nothing of the held reference: `a.txt` is the project's.
fn pristine_after(p: &Path, state: &Path, touch: impl FnOnce(&Path)) {
    let b2 = Branch::create(p, &opts(state)).unwrap();
    touch(b2.mountpoint());
    assert_eq!(
        fs::read_to_string(b2.mountpoint().join("a.txt")).unwrap(),
        "alpha\n",
        "a reference held into branch 1 wrote into branch 2"
    );
    assert!(
        b2.changeset(false).changes.is_empty(),
        "branch 2 has changes it never made: {:?}",
        b2.changeset(false).changes
    );
    assert!(
        !b2.reused_connection(),
        "a connection something still referred into was reused"
    );
    drop(b2);
    shade_fusefs::drain_branch_pool();
}

#[test]
fn an_open_fd_held_past_the_branch_does_not_reach_the_next_one() {
    let _serial = serial();
    let (_tmp, p, state, b1) = held_setup();
    let mut held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(b1.mountpoint().join("a.txt"))
        .unwrap();
    drop(b1);
    pristine_after(&p, &state, |_| {
        use std::io::Write;
        // Fails (the connection is gone) — or, reused, writes into the next branch.
        let _ = held.write_all(b"owned\n");
    });
}

#[test]
fn an_o_path_fd_held_past_the_branch_does_not_reach_the_next_one() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let _serial = serial();
    let (_tmp, p, state, b1) = held_setup();
    // O_PATH sends no OPEN: only the kernel knows it is there.
    let held = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(b1.mountpoint().join("a.txt"))
        .unwrap();
    drop(b1);
    pristine_after(&p, &state, |_| {
        let again = format!("/proc/self/fd/{}", held.as_raw_fd());
        let _ = fs::write(again, "owned\n");
    });
}

#[test]
fn a_cwd_left_in_the_branch_does_not_reach_the_next_one() {
    use std::io::Write;
    let _serial = serial();
    let (_tmp, p, state, b1) = held_setup();
    // A process that stays in the branch and writes when told to.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("read go; echo owned > a.txt; echo done")
        .current_dir(b1.mountpoint().join("d"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(b1);
    pristine_after(&p, &state, |m2| {
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
        drop(stdin);
        wait_bounded(&mut child);
        assert!(
            !m2.join("d/a.txt").exists(),
            "a process whose cwd was in branch 1 created a file in branch 2"
        );
    });
    let _ = child.wait();
}

#[test]
fn what_the_last_command_left_going_away_does_not_cost_the_next_branch_its_warm_connection() {
    let _serial = serial();
    let (_tmp, p, state, b1) = held_setup();
    // As a command's sandbox does as it ends: a namespace with a copy of the mount, and a
    // process whose cwd is in it, both gone a moment after the branch is dropped.
    let mut copy = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sleep", "0.15"])
        .spawn()
        .unwrap();
    let mut cwd = Command::new("sleep")
        .arg("0.15")
        .current_dir(b1.mountpoint().join("d"))
        .spawn()
        .unwrap();
    // The copy exists before the branch goes.
    wait_for_copy(&copy);
    drop(b1);
    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(
        b2.reused_connection(),
        "the next branch got a cold connection while the last command's namespace and \
         process went away"
    );
    assert_eq!(
        fs::read_to_string(b2.mountpoint().join("a.txt")).unwrap(),
        "alpha\n"
    );
    wait_bounded(&mut copy);
    wait_bounded(&mut cwd);
    drop(b2);
    shade_fusefs::drain_branch_pool();
}

/// Wait (bounded) until `child` is in a mount namespace of its own.
fn wait_for_copy(child: &std::process::Child) {
    let ours = fs::read_link("/proc/self/ns/mnt").unwrap();
    let start = Instant::now();
    while fs::read_link(format!("/proc/{}/ns/mnt", child.id()))
        .ok()
        .as_ref()
        == Some(&ours)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "unshare did not start"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A command on the branch, run through the sandbox as shade runs them.
fn run_on(b: &Branch, p: &Path, iso: shade_fusefs::sandbox::Isolation) {
    use shade_fusefs::sandbox::{run, Output, RunSpec};
    let mut spec = RunSpec::new(
        p.to_path_buf(),
        b.mountpoint().to_path_buf(),
        p.to_path_buf(),
        vec!["sh".into(), "-c".into(), "cat a.txt".into()],
    );
    spec.isolation = iso;
    spec.output = Output::Capture { cap: 1 << 16 };
    spec.timeout = Some(Duration::from_secs(60));
    let out = run(&spec).unwrap();
    assert_eq!(
        out.termination,
        shade_fusefs::sandbox::Termination::Exited(0),
        "{out:?}"
    );
}

#[test]
fn a_connection_an_unconfined_or_socket_allowed_command_used_is_not_reused() {
    use shade_fusefs::sandbox::Isolation;
    let _serial = serial();
    let (_tmp, p, state, b1) = held_setup();
    // Confined with no way for a descriptor out (network off: its own abstract sockets):
    // reused.
    run_on(
        &b1,
        &p,
        Isolation {
            network: true,
            ..Isolation::default()
        },
    );
    drop(b1);
    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(
        b2.reused_connection(),
        "a contained command's connection is pooled"
    );
    // Unconfined: it could have handed an fd to anything.
    run_on(
        &b2,
        &p,
        Isolation {
            unconfined: true,
            ..Isolation::default()
        },
    );
    drop(b2);
    let b3 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(
        !b3.reused_connection(),
        "an unconfined command's connection was reused"
    );
    // An allowed socket: SCM_RIGHTS to whoever listens there. (Allowed for the rest of
    // this process: the last test here that runs commands.)
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("s");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    shade_fusefs::sandbox::allow_sockets([sock.clone()]);
    run_on(
        &b3,
        &p,
        Isolation {
            network: true,
            ..Isolation::default()
        },
    );
    drop(b3);
    let b4 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(
        !b4.reused_connection(),
        "a connection whose command had an allowed socket was reused"
    );
    drop(b4);
    shade_fusefs::drain_branch_pool();
}

/// Not a test on its own: run as the plain user by
/// `references_held_past_a_branch_do_not_reach_the_next_one_as_the_plain_user`.
#[test]
#[ignore = "run as the plain user by the test below, not a test on its own"]
fn helper_held_references_as_plain_user() {
    if std::env::var_os("SHADE_POOL_USER_HELPER").is_none() {
        return;
    }
    assert!(
        !nix::unistd::geteuid().is_root(),
        "meant for the plain user"
    );
    shade_fusefs::set_pool_size(2);
    let tmp = tempfile::Builder::new()
        .prefix("shade-pool-user-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let p = project(tmp.path());
    let state = tmp.path().join("state");
    // Nothing held: the connection is reused (fusermount3 mounted it).
    let b1 = Branch::create(&p, &opts(&state)).unwrap();
    view(b1.mountpoint());
    drop(b1);
    let b2 = Branch::create(&p, &opts(&state)).unwrap();
    assert!(b2.reused_connection(), "the plain user's pool works");
    // An fd held past the branch: the next branch gets a fresh connection.
    let mut held = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(b2.mountpoint().join("a.txt"))
        .unwrap();
    drop(b2);
    pristine_after(&p, &state, |_| {
        use std::io::Write;
        let _ = held.write_all(b"owned\n");
    });
    println!("held-references-ok");
}

#[test]
fn references_held_past_a_branch_do_not_reach_the_next_one_as_the_plain_user() {
    require_root();
    let user = nix::unistd::User::from_name("shadetest")
        .unwrap()
        .expect("the plain test user shadetest (scripts/setup.sh makes it)");
    let out = Command::new("runuser")
        .args(["-u", "shadetest", "--", "env", "SHADE_POOL_USER_HELPER=1"])
        .arg(format!("HOME={}", user.dir.display()))
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "helper_held_references_as_plain_user",
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
        out.status.success() && text.contains("held-references-ok"),
        "as the plain user:\n{text}"
    );
}

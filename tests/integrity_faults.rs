//! Fault injection through the real `shade` binary (issue 3): a daemon killed mid-branch,
//! the user editing the same files while a branch runs, a 2 GiB write, bad input and
//! isolation. Each test prints its figure; the real tree must never get a partial write.
#![allow(clippy::unwrap_used)]

mod common;

/// One module so `cargo test -- --skip integrity::` can leave these to scripts/integrity.sh.
mod integrity {
    use super::common;

    use common::{assert_no_shade_mounts, Fixture};
    use std::collections::BTreeSet;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};
    use std::process::{Output, Stdio};
    use std::time::{Duration, Instant};

    fn out(o: &Output) -> String {
        format!(
            "status {:?}\nstdout:\n{}\nstderr:\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !ok() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Branch directories currently under the state dir.
    fn branches(fx: &Fixture) -> Vec<PathBuf> {
        fs::read_dir(fx.state.branches())
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    }

    fn assert_clean_state(fx: &Fixture) {
        assert_no_shade_mounts(&fx.state);
        assert!(branches(fx).is_empty(), "stores left: {:?}", branches(fx));
    }

    /// Byte-exact view of a tree: names as raw bytes, file contents as bytes.
    fn raw_tree(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut v = Vec::new();
        fn rec(root: &Path, dir: &Path, v: &mut Vec<(Vec<u8>, Vec<u8>)>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let rel = p
                    .strip_prefix(root)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec();
                let md = fs::symlink_metadata(&p).unwrap();
                if md.is_dir() {
                    v.push((rel, b"<dir>".to_vec()));
                    rec(root, &p, v);
                } else if md.file_type().is_symlink() {
                    v.push((
                        rel,
                        fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec(),
                    ));
                } else {
                    v.push((rel, fs::read(&p).unwrap()));
                }
            }
        }
        rec(dir, dir, &mut v);
        v.sort();
        v
    }

    /// Kill -9 shade while its command is writing, at several moments: the real tree stays
    /// byte-identical and the next start leaves no dead mount and no store.
    #[test]
    fn killed_daemon_mid_branch_leaves_the_tree_untouched() {
        let fx = Fixture::new();
        for i in 0..50 {
            fx.write(&format!("src/f{i}.txt"), &format!("original {i}\n"));
        }
        let before = raw_tree(&fx.project);
        let pidfile = fx.tmp.path().join("cmd.pid");
        let delays_ms = [0u64, 20, 50, 100, 200, 400, 700, 1000];
        let script = format!(
            "echo $$ > {}; i=0; while true; do i=$((i+1)); \
         for f in src/*.txt; do echo \"branch $i\" >> \"$f\"; done; \
         mkdir -p new/$i && echo x > new/$i/f; mv src/f1.txt src/g$i.txt 2>/dev/null; \
         rm -f src/f2.txt; done",
            pidfile.display()
        );
        for &d in &delays_ms {
            let _ = fs::remove_file(&pidfile);
            let mut child = fx
                .shade()
                .args(["run", "--accept", "--", "sh", "-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(d));
            child.kill().unwrap();
            child.wait().unwrap();
            // The command outlives its killed supervisor: stop it (it only touches the branch).
            if let Ok(pid) = fs::read_to_string(&pidfile) {
                let pid: i32 = pid.trim().parse().unwrap();
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            assert!(
                raw_tree(&fx.project) == before,
                "tree changed (kill after {d} ms)"
            );
            let o = fx.shade().arg("recover").output().unwrap();
            assert!(o.status.success(), "{}", out(&o));
            assert_clean_state(&fx);
            assert!(raw_tree(&fx.project) == before);
        }
        println!(
        "daemon crash: {} kill -9 trials ({delays_ms:?} ms), 0 changed trees, 0 dead mounts or stores after recover",
        delays_ms.len()
    );
    }

    /// The user edits, deletes and creates the same and neighbouring files while a branch
    /// works on them. Accept must name exactly the overlapping paths, write nothing, and the
    /// branch must have seen the user's new content of files it did not touch.
    #[test]
    fn concurrent_user_edits_are_all_detected_and_nothing_is_clobbered() {
        let fx = Fixture::new();
        let n = 40;
        for i in 0..n {
            fx.write(&format!("e{i}"), &format!("base e{i}\n")); // the branch edits these
            fx.write(&format!("d{i}"), &format!("base d{i}\n")); // the branch deletes these
            fx.write(&format!("r{i}"), &format!("base r{i}\n")); // the branch renames these
            fx.write(&format!("u{i}"), &format!("base u{i}\n")); // the branch only reads these
        }
        let sync = fx.tmp.path().join("sync");
        fs::create_dir(&sync).unwrap();
        // Written by the command for real (the test's temporary directory is shared with
        // it), whose root is the sandbox's unprivileged id when the tests run as root.
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&sync, fs::Permissions::from_mode(0o777)).unwrap();
        }
        // Phase 1 changes files; then it waits for the user; phase 2 checks that every file
        // the branch did not touch shows the user's content (inotify invalidation is
        // asynchronous: poll), and records the result for the test.
        let script = format!(
        "set -e; for i in $(seq 0 {last}); do echo branch >> e$i; rm d$i; mv r$i r$i.moved; \
         echo branch > c$i; done; touch {s}/phase1; \
         while [ ! -e {s}/go ] && [ -e {s}/phase1 ]; do sleep 0.01; done; \
         for i in $(seq 0 {last}); do t=0; \
           while [ \"$(cat u$i 2>/dev/null)\" != \"user u$i\" ]; do t=$((t+1)); [ $t -lt 500 ] || break; sleep 0.01; done; \
           [ \"$(cat u$i)\" = \"user u$i\" ] && echo ok >> {s}/seen; \
           [ \"$(cat n$i)\" = \"user n$i\" ] && echo ok >> {s}/seen-new; \
         done; exit 0",
        last = n - 1,
        s = sync.display()
    );
        let child = fx
            .shade()
            .args(["run", "--accept", "--json", "--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("phase 1", Duration::from_secs(60), || {
            sync.join("phase1").exists()
        });
        // Inject: every 4th index of each kind overlaps the branch; all u/n files are
        // neighbours the branch never wrote.
        let mut injected = BTreeSet::new();
        for i in (0..n).step_by(4) {
            fx.write(&format!("e{i}"), "user edit\n"); // edit vs edit
            injected.insert(format!("e{i}"));
            fs::remove_file(fx.project.join(format!("d{}", i + 1))).unwrap_or(());
            fx.write(&format!("d{i}"), "user edit\n"); // edit vs delete
            injected.insert(format!("d{i}"));
            fx.write(&format!("r{i}"), "user edit\n"); // edit vs rename source
            injected.insert(format!("r{i}"));
            fx.write(&format!("c{i}"), "user create\n"); // create vs create
            injected.insert(format!("c{i}"));
        }
        for i in (2..n).step_by(4) {
            fs::remove_file(fx.project.join(format!("e{i}"))).unwrap(); // delete vs edit
            injected.insert(format!("e{i}"));
        }
        // d{i+1} deleted by both: same outcome, not a conflict either way; left out of the count.
        for i in 0..n {
            fx.write(&format!("u{i}"), &format!("user u{i}\n"));
            fx.write(&format!("n{i}"), &format!("user n{i}\n"));
        }
        let user_tree = raw_tree(&fx.project);
        fs::write(sync.join("go"), "").unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(124), "{}", out(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["accepted"], false);
        let detected: BTreeSet<String> = v["conflicts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["path"].as_str().unwrap().to_string())
            .collect();
        let both_deleted: BTreeSet<String> =
            (0..n).step_by(4).map(|i| format!("d{}", i + 1)).collect();
        let missed: Vec<_> = injected.difference(&detected).collect();
        let extra: Vec<_> = detected
            .difference(&injected)
            .filter(|p| !both_deleted.contains(*p))
            .collect();
        assert!(missed.is_empty(), "conflicts not detected: {missed:?}");
        assert!(extra.is_empty(), "false conflicts: {extra:?}");
        assert!(
            raw_tree(&fx.project) == user_tree,
            "the real tree is not exactly the user's"
        );
        let seen = fs::read_to_string(sync.join("seen")).unwrap_or_default();
        let seen_new = fs::read_to_string(sync.join("seen-new")).unwrap_or_default();
        assert_eq!(
            seen.lines().count(),
            n,
            "branch saw the user's edits of untouched files"
        );
        assert_eq!(
            seen_new.lines().count(),
            n,
            "branch saw the user's new files"
        );
        assert_clean_state(&fx);
        println!(
        "concurrent user edits: injected {} conflicts, detected {} ({} of them on paths both sides deleted), \
         missed 0, clobbered 0; branch saw {n}/{n} user edits and {n}/{n} user-created files",
        injected.len(),
        detected.len(),
        detected.intersection(&both_deleted).count()
    );
    }

    /// Peak memory of a process: VmHWM (resident) from /proc.
    fn vm_hwm_kib(pid: u32) -> Option<u64> {
        let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        s.lines()
            .find(|l| l.starts_with("VmHWM:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// Bytes held in memfds (not mapped, so not in VmRSS): the in-memory part of contents.
    fn memfd_kib(pid: u32) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            return 0;
        };
        dir.flatten()
            .filter(|e| {
                fs::read_link(e.path())
                    .is_ok_and(|l| l.as_os_str().as_bytes().starts_with(b"/memfd:"))
            })
            .filter_map(|e| fs::metadata(e.path()).ok())
            .map(|m| m.blocks() / 2)
            .sum()
    }

    /// A 2 GiB write in a branch keeps shade's resident memory plus its in-memory contents
    /// under the 256 MiB content budget + 200 MiB.
    #[test]
    fn writing_2_gib_keeps_memory_bounded() {
        let fx = Fixture::new();
        let mut child = fx
            .shade()
            .args([
                "run",
                "--",
                "sh",
                "-c",
                "dd if=/dev/zero of=big bs=1M count=2048 status=none && stat -c %s big",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut peak_rss = 0;
        let mut peak_memfd = 0;
        let mut peak_total = 0;
        while child.try_wait().unwrap().is_none() {
            if let Some(h) = vm_hwm_kib(pid) {
                peak_rss = peak_rss.max(h);
                let m = memfd_kib(pid);
                peak_memfd = peak_memfd.max(m);
                peak_total = peak_total.max(h + m);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", out(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "2147483648");
        let budget_kib = (256 + 200) * 1024;
        println!(
            "2 GiB write: shade peak RSS (VmHWM) {} MiB, peak memfd contents {} MiB, \
         sum {} MiB, budget 256 MiB contents + 200 MiB",
            peak_rss / 1024,
            peak_memfd / 1024,
            peak_total / 1024
        );
        assert!(peak_rss > 0, "never sampled shade's memory");
        assert!(
            peak_rss + peak_memfd <= budget_kib,
            "memory over budget: rss {peak_rss} KiB + memfd {peak_memfd} KiB"
        );
        assert!(!fx.project.join("big").exists());
        assert_clean_state(&fx);
    }

    /// The user edits a file the branch renamed: accept must report a conflict and write
    /// nothing (it used to accept and keep both names).
    #[test]
    fn edited_rename_source_is_a_conflict() {
        let fx = Fixture::new();
        fx.write("r", "base\n");
        let sync = fx.tmp.path().join("moved");
        let script = format!("mv r r.moved; touch {}; sleep 1", sync.display());
        let child = fx
            .shade()
            .args(["run", "--accept", "--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("the rename", Duration::from_secs(30), || sync.exists());
        fx.write("r", "user edit\n");
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(124), "{}", out(&o));
        assert_eq!(fx.read("r"), "user edit\n");
        assert!(!fx.project.join("r.moved").exists());
    }

    fn shade_err_line(o: &Output) -> String {
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(125), "{}", out(o));
        assert_eq!(err.lines().count(), 1, "one clear line: {err}");
        err.trim().to_string()
    }

    /// Run `script` in a fresh branch of the fixture's project (`-C project`).
    fn run_in(fx: &Fixture, extra: &[&str], script: &str) -> Output {
        fx.shade()
            .arg("run")
            .args(extra)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap()
    }

    fn as_nobody(cmd: &str) -> Output {
        std::process::Command::new("setpriv")
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "sh",
                "-c",
                cmd,
            ])
            .output()
            .unwrap()
    }

    /// Nonexistent and unreadable project directories are one clear error (exit 125) and
    /// leave nothing behind.
    #[test]
    fn bad_project_dirs_are_clear_errors() {
        let fx = Fixture::new();
        let o = fx
            .shade()
            .args(["run", "-C", "/nonexistent/shade-project", "--", "true"])
            .output()
            .unwrap();
        let e1 = shade_err_line(&o);
        assert!(e1.contains("/nonexistent/shade-project"), "{e1}");
        // Unreadable: root reads everything, so shade runs as nobody on a 0700 root-owned dir.
        let locked = fx.tmp.path().join("locked");
        fs::create_dir(&locked).unwrap();
        fs::write(locked.join("secret"), "s").unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o700)).unwrap();
        // A copy nobody can execute wherever the checkout lives (e.g. under 0700 /root).
        let bin = fx.tmp.path().join("shade");
        fs::copy(env!("CARGO_BIN_EXE_shade"), &bin).unwrap();
        let state = fx.tmp.path().join("nobody-state");
        fs::create_dir(&state).unwrap();
        std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
        let o = as_nobody(&format!(
            "SHADE_STATE_DIR={} exec {} run -C {}/sub -- true",
            state.display(),
            bin.display(),
            locked.display()
        ));
        let e2 = shade_err_line(&o);
        assert!(e2.contains("ermission denied"), "{e2}");
        let o = as_nobody(&format!(
            "SHADE_STATE_DIR={} exec {} run -C {} -- true",
            state.display(),
            bin.display(),
            locked.display()
        ));
        let e3 = shade_err_line(&o);
        assert!(
            e3.contains("ermission denied") && e3.contains(&locked.display().to_string()),
            "{e3}"
        );
        assert_eq!(e3.matches("ermission denied").count(), 1, "said once: {e3}");
        assert_eq!(fs::read_to_string(locked.join("secret")).unwrap(), "s");
        println!("bad input: nonexistent dir -> {e1:?}; unreadable dir (as nobody) -> {e3:?}");
    }

    /// A project that is itself a mount point, and one reached through a symlink, behave
    /// like any project: the command runs at the real path, accept lands in the real dir.
    #[test]
    fn mount_point_and_symlinked_projects_work() {
        let fx = Fixture::new();
        let mnt = fx.tmp.path().join("tmpfs-project");
        fs::create_dir(&mnt).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &mnt,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=16m"),
        )
        .unwrap();
        fs::write(mnt.join("a"), "a\n").unwrap();
        let o = fx
            .shade()
            .arg("run")
            .arg("-C")
            .arg(&mnt)
            .args([
                "--accept",
                "--",
                "sh",
                "-c",
                "pwd; echo b >> a; echo n > new",
            ])
            .output()
            .unwrap();
        let ok_mount = o.status.success()
            && fs::read_to_string(mnt.join("a")).unwrap() == "a\nb\n"
            && fs::read_to_string(mnt.join("new")).unwrap() == "n\n";
        let report = out(&o);
        nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH).unwrap();
        assert!(ok_mount, "mount point project: {report}");
        assert!(report.contains(&mnt.display().to_string()), "{report}");

        fx.write("a", "a\n");
        let link = fx.tmp.path().join("link-to-project");
        std::os::unix::fs::symlink(&fx.project, &link).unwrap();
        let o = fx
            .shade()
            .arg("run")
            .arg("-C")
            .arg(&link)
            .args(["--accept", "--", "sh", "-c", "pwd; echo b >> a"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", out(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).lines().next().unwrap(),
            fx.project.display().to_string(),
            "runs at the resolved real path"
        );
        assert_eq!(fx.read("a"), "a\nb\n");
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_clean_state(&fx);
        println!("bad input: project on its own tmpfs mount -> accepted correctly; project via symlink -> runs at the real path, accepted, symlink kept");
    }

    /// A process outside the branch keeps the branch mount busy (cwd and an open file in
    /// it) when the command ends: shade still finishes, detaches the mount, removes the
    /// store, and the real tree is untouched.
    #[test]
    fn busy_branch_mount_is_detached() {
        let fx = Fixture::new();
        fx.write("a", "a\n");
        let child = fx
            .shade()
            .args(["run", "--", "sh", "-c", "echo b > a; sleep 2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("the branch mount", Duration::from_secs(30), || {
            branches(&fx).iter().any(|b| b.join("mnt/a").exists())
        });
        let mnt = branches(&fx)[0].join("mnt");
        let held = fx.tmp.path().join("held");
        let mut holder = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("exec 3<a; touch {}; sleep 30", held.display()),
            ])
            .current_dir(&mnt)
            .spawn()
            .unwrap();
        wait_for("the holder", Duration::from_secs(30), || held.exists());
        let o = child.wait_with_output().unwrap();
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(o.status.success(), "{}", out(&o));
        assert_eq!(fx.read("a"), "a\n");
        assert_clean_state(&fx);
        println!("bad input: branch mount held busy by an outside process -> exit 0, mount detached, store removed");
    }

    /// A command that leaves a setsid daemon behind: the daemon is killed with the branch
    /// and never writes anything into the real tree.
    #[test]
    fn escaped_daemon_is_killed_and_never_writes() {
        let fx = Fixture::new();
        let o = run_in(
        &fx,
        &["--accept"],
        "setsid sh -c 'sleep 1; echo late > late.txt; echo late > /dev/null' >/dev/null 2>&1 < /dev/null & echo now > now.txt",
    );
        assert!(o.status.success(), "{}", out(&o));
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(fx.read("now.txt"), "now\n");
        assert!(
            !fx.project.join("late.txt").exists(),
            "the daemon wrote into the real tree"
        );
        assert_clean_state(&fx);
        println!("bad input: setsid daemon left behind -> killed, no late write, no mount left");
    }

    /// Names with newlines and invalid UTF-8, and a 255-byte name, survive a branch and an
    /// accept byte for byte; --json stays valid JSON; a 256-byte name is ENAMETOOLONG.
    #[test]
    fn odd_names_round_trip_and_json_stays_valid() {
        let fx = Fixture::new();
        let long255 = "x".repeat(255);
        let long256 = "y".repeat(256);
        let script = format!(
        "printf 'nl\\n' > \"$(printf 'new\\nline')\" && printf 'bad\\n' > \"$(printf 'inv\\377\\376')\" \
         && printf '255\\n' > {long255} && mkdir \"$(printf 'dir\\nx')\" && \
         if (printf 'no' > {long256}) 2>err.txt; then exit 9; fi; \
         grep -q 'too long' err.txt && rm err.txt"
    );
        let expected_dir = fx.tmp.path().join("expected");
        fs::create_dir(&expected_dir).unwrap();
        let st = std::process::Command::new("sh")
            .args(["-c", &script])
            .current_dir(&expected_dir)
            .status()
            .unwrap();
        assert!(st.success(), "the script works on a plain directory");
        let o = run_in(&fx, &["--accept", "--json"], &script);
        assert!(o.status.success(), "{}", out(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("--json output is not JSON ({e}): {}", out(&o)));
        assert_eq!(v["accepted"], true, "{}", out(&o));
        assert!(
            raw_tree(&fx.project) == raw_tree(&expected_dir),
            "accepted tree differs"
        );
        println!(
        "bad input: names with newline / invalid UTF-8 / 255 bytes accepted byte-exact, --json valid ({} changes), 256-byte name -> ENAMETOOLONG",
        v["changes"].as_array().map(|a| a.len()).unwrap_or(0)
    );
    }

    /// A command that fills the disk store (a 24 MiB tmpfs as state dir, memory budget 0)
    /// gets ENOSPC inside the branch; shade reports it, the real tree is untouched and
    /// nothing is left in the state dir.
    #[test]
    fn full_disk_store_is_enospc_and_leaves_nothing() {
        let fx = Fixture::new();
        fx.write("a", "a\n");
        let before = raw_tree(&fx.project);
        let state = fx.tmp.path().join("small-state");
        fs::create_dir(&state).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &state,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=24m"),
        )
        .unwrap();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_shade"))
            .env("SHADE_STATE_DIR", &state)
            .env("SHADE_MEMORY_BUDGET", "0")
            .current_dir(&fx.project)
            .args([
                "run",
                "--accept",
                "--",
                "sh",
                "-c",
                "echo b >> a; dd if=/dev/zero of=big bs=1M count=64 status=none",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        // The branch server's pooled connections are its own: it is ended first.
        common::stop_branch_servers(&state);
        let left: Vec<_> = fs::read_dir(state.join("branches"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let df = nix::sys::statvfs::statvfs(&state).unwrap();
        let used = (df.blocks() - df.blocks_free()) * df.fragment_size();
        nix::mount::umount2(&state, nix::mount::MntFlags::MNT_DETACH).unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_ne!(o.status.code(), Some(0), "{}", out(&o));
        assert!(err.contains("No space left on device"), "{}", out(&o));
        assert!(err.contains("not accepted"), "{}", out(&o));
        assert!(raw_tree(&fx.project) == before, "the real tree changed");
        assert!(left.is_empty(), "left in the state dir: {left:?}");
        assert!(used < 1 << 20, "the store still uses {used} bytes");
        println!(
        "bad input: 64 MiB into a 24 MiB store -> ENOSPC in the branch (exit {:?}), not accepted, real tree untouched, store empty",
        o.status.code()
    );
    }

    /// A branch replaces a directory with a symlink to a directory outside the project and
    /// writes "into" it (with a private /tmp, so the write itself stays private). Accept
    /// must create the symlink and never write through it; a real directory the user swaps
    /// for a symlink before accept must not be followed either.
    #[test]
    fn accept_never_follows_a_symlink_out_of_the_project() {
        let fx = Fixture::new();
        fx.write("sub/keep.txt", "k\n");
        fx.write("dir/old.txt", "o\n");
        let outside = PathBuf::from(format!("/tmp/shade-outside-{}", std::process::id()));
        let _ = fs::remove_dir_all(&outside);
        fs::create_dir(&outside).unwrap();
        let o = run_in(
            &fx,
            &["--accept", "--private-tmp"],
            &format!(
                "mkdir -p {o} && rm -r sub && ln -s {o} sub && echo evil > sub/evil.txt && \
             echo evil2 > {o}/evil2.txt",
                o = outside.display()
            ),
        );
        assert!(o.status.success(), "{}", out(&o));
        assert_eq!(fs::read_link(fx.project.join("sub")).unwrap(), outside);
        let first: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();

        // The user swaps a directory the branch writes into for a symlink to outside.
        let sync = fx.tmp.path().join("wrote");
        let child = fx
            .shade()
            .args([
                "run",
                "--accept",
                "--",
                "sh",
                "-c",
                &format!("echo new > dir/new.txt; touch {}; sleep 1", sync.display()),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("the branch write", Duration::from_secs(30), || {
            sync.exists()
        });
        fs::rename(fx.project.join("dir"), fx.tmp.path().join("dir-aside")).unwrap();
        std::os::unix::fs::symlink(&outside, fx.project.join("dir")).unwrap();
        let o2 = child.wait_with_output().unwrap();
        let second: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        let _ = fs::remove_dir_all(&outside);
        assert!(
            first.is_empty(),
            "accept wrote outside the project: {first:?}"
        );
        assert!(
            second.is_empty(),
            "accept followed the user's symlink: {second:?}"
        );
        assert_ne!(o2.status.code(), Some(0), "{}", out(&o2));
        assert_clean_state(&fx);
        println!(
        "isolation: symlink to an outside dir made in the branch -> accepted as a symlink, 0 files written outside; \
         user-swapped symlink before accept -> refused (exit {:?}), 0 files outside",
        o2.status.code()
    );
    }
}

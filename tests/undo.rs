//! `shade log` and `shade undo` end to end: accepts through the real binary, a real mount,
//! real programs; then the way back, its conflicts, its crash safety and the retention.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;
use common::{snapshot, Fixture};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `shade ARGS` in the fixture's project with its own (empty unless given) config file,
/// killed and failed after `secs`.
fn shade(fx: &Fixture, args: &[&str], envs: &[(&str, &str)], secs: u64) -> Output {
    let config = fx.tmp.path().join("config.toml");
    if !config.exists() {
        std::fs::write(&config, "").unwrap();
    }
    let mut c = fx.shade();
    c.args(args)
        .env("SHADE_CONFIG", &config)
        .env_remove("CARGO_TARGET_DIR");
    for (k, v) in envs {
        c.env(k, v);
    }
    within(c, secs)
}

fn within(mut cmd: Command, secs: u64) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: signalling the process group this test started.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let _ = rx.recv_timeout(Duration::from_secs(10));
            panic!("shade did not finish within {secs} s");
        }
    }
}

fn run_accept(fx: &Fixture, script: &str) -> Output {
    let o = shade(fx, &["run", "--accept", "--", "sh", "-c", script], &[], 300);
    assert!(o.status.success(), "{}", out(&o));
    o
}

fn log_json(fx: &Fixture) -> Vec<serde_json::Value> {
    let o = shade(fx, &["log", "--json"], &[], 60);
    assert!(o.status.success(), "{}", out(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn undo_json(fx: &Fixture, extra: &[&str]) -> (Output, serde_json::Value) {
    let mut args = vec!["undo", "--json"];
    args.extend_from_slice(extra);
    let o = shade(fx, &args, &[], 300);
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&o)));
    (o, v)
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn undo_puts_back_an_edit_a_new_file_a_deletion_a_rename_a_chmod_a_symlink_and_a_binary() {
    let fx = Fixture::new();
    fx.write("edit.txt", "one\ntwo\n");
    fx.write("gone.txt", "deleted by the command\n");
    fx.write("old-name.txt", "renamed\n");
    fx.write("run.sh", "echo hi\n");
    set_mode(&fx.project.join("run.sh"), 0o644);
    std::os::unix::fs::symlink("edit.txt", fx.project.join("link")).unwrap();
    std::fs::write(fx.project.join("blob.bin"), [0u8, 1, 2, 255, 0, 7]).unwrap();
    fx.write("dir/keep.txt", "kept\n");
    let before = snapshot(&fx.project);

    run_accept(
        &fx,
        "sed -i s/two/TWO/ edit.txt && echo fresh > new.txt && rm gone.txt && \
         mv old-name.txt new-name.txt && chmod 755 run.sh && ln -sfn run.sh link && \
         printf '\\377\\376\\000' > blob.bin && mkdir -p made/deep && echo x > made/deep/f && \
         rm -r dir",
    );
    let after = snapshot(&fx.project);
    assert_ne!(before, after);

    let log = log_json(&fx);
    assert!(!log.is_empty(), "the history is still in place: {log:?}");
    let id = log[0]["id"].as_str().unwrap().to_string();
    assert_eq!(log[0]["undoable"], true);
    assert!(log[0]["origin"].as_str().unwrap().contains("run --accept"));
    let paths: Vec<&str> = log[0]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap())
        .collect();
    for p in [
        "edit.txt",
        "new.txt",
        "gone.txt",
        "new-name.txt",
        "run.sh",
        "link",
        "blob.bin",
    ] {
        assert!(paths.contains(&p), "{p} not in {paths:?}");
    }

    // A dry run changes nothing and says what would happen.
    let o = shade(&fx, &["undo", "--dry-run"], &[], 60);
    assert!(o.status.success(), "{}", out(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("would remove new.txt"), "{text}");
    assert!(text.contains("would restore gone.txt"), "{text}");
    assert_eq!(snapshot(&fx.project), after);

    let (o, v) = undo_json(&fx, &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(v["id"], id.as_str());
    assert_eq!(snapshot(&fx.project), before, "{}", out(&o));
    assert_eq!(
        std::fs::read(fx.project.join("blob.bin")).unwrap(),
        [0u8, 1, 2, 255, 0, 7]
    );

    // The undo is in the history and can itself be undone: the accept comes back.
    let log = log_json(&fx);
    assert_eq!(log.len(), 2);
    assert_eq!(log[1]["undone_by"], v["undo_id"]);
    assert_eq!(log[0]["undoes"], id.as_str());
    let undo_id = v["undo_id"].as_str().unwrap().to_string();
    // With nothing else to undo, `shade undo` says so.
    let o = shade(&fx, &["undo"], &[], 60);
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    let o = shade(&fx, &["undo", &undo_id], &[], 120);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(snapshot(&fx.project), after);
}

#[test]
fn a_user_edit_after_the_accept_refuses_the_undo_and_keep_mine_keeps_it() {
    let fx = Fixture::new();
    fx.write("a.txt", "a0\n");
    fx.write("b.txt", "b0\n");
    run_accept(&fx, "echo a1 > a.txt; echo b1 > b.txt; echo c1 > c.txt");
    // The user edits a.txt and puts a file into a directory... and edits c.txt.
    fx.write("a.txt", "mine\n");
    fx.write("c.txt", "my c\n");
    let mid = snapshot(&fx.project);

    let (o, v) = undo_json(&fx, &[]);
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    assert_eq!(v["ok"], false);
    let kept: Vec<&str> = v["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["path"].as_str().unwrap())
        .collect();
    assert_eq!(kept, ["a.txt", "c.txt"], "{v}");
    assert_eq!(snapshot(&fx.project), mid, "a refused undo writes nothing");
    let o = shade(&fx, &["undo"], &[], 60);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("a.txt") && err.contains("--keep-mine"),
        "{}",
        out(&o)
    );

    let o = shade(&fx, &["undo", "--keep-mine"], &[], 120);
    assert!(o.status.success(), "{}", out(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("kept as it is: a.txt"), "{text}");
    assert_eq!(fx.read("a.txt"), "mine\n");
    assert_eq!(fx.read("c.txt"), "my c\n");
    assert_eq!(fx.read("b.txt"), "b0\n");
}

#[test]
fn undo_refuses_to_remove_a_directory_the_user_put_a_file_in() {
    let fx = Fixture::new();
    run_accept(&fx, "mkdir -p gen && echo g > gen/out.txt");
    fx.write("gen/mine.txt", "mine\n");
    let (o, v) = undo_json(&fx, &[]);
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    assert!(v["kept"].to_string().contains("gen/mine.txt"), "{v}");
    let o = shade(&fx, &["undo", "--keep-mine"], &[], 120);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(fx.read("gen/mine.txt"), "mine\n");
}

#[test]
fn undo_of_an_older_accept_under_a_newer_one_touching_other_paths() {
    let fx = Fixture::new();
    fx.write("a.txt", "a0\n");
    fx.write("b.txt", "b0\n");
    run_accept(&fx, "echo a1 > a.txt");
    let first = log_json(&fx)[0]["id"].as_str().unwrap().to_string();
    run_accept(&fx, "echo b1 > b.txt; echo n > n.txt");
    let o = shade(&fx, &["undo", &first], &[], 120);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(fx.read("a.txt"), "a0\n");
    assert_eq!(fx.read("b.txt"), "b1\n", "the newer accept stays");
    assert_eq!(fx.read("n.txt"), "n\n");
    // An older accept whose path a newer one changed again is a conflict.
    run_accept(&fx, "echo b2 > b.txt");
    let log = log_json(&fx);
    let second = log
        .iter()
        .find(|e| e["paths"].to_string().contains("n.txt"))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let o = shade(&fx, &["undo", &second], &[], 120);
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    assert_eq!(fx.read("b.txt"), "b2\n");
    assert!(fx.project.join("n.txt").exists());
}

#[test]
fn retention_evicts_the_oldest_accepts_and_says_so() {
    let fx = Fixture::new();
    std::fs::write(
        fx.tmp.path().join("config.toml"),
        "[history]\nkeep_accepts = 2\n",
    )
    .unwrap();
    fx.write("f.txt", "0\n");
    for i in 1..=3 {
        run_accept(&fx, &format!("echo {i} > f.txt; echo {i} > only{i}.txt"));
    }
    let log = log_json(&fx);
    assert_eq!(log.len(), 3);
    assert_eq!(log[2]["evicted"], true, "{log:?}");
    assert_eq!(log[2]["undoable"], false);
    assert_eq!(log[1]["evicted"], false);
    let oldest = log[2]["id"].as_str().unwrap();
    let o = shade(&fx, &["undo", oldest], &[], 60);
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("retention"),
        "{}",
        out(&o)
    );
    // Its earlier content ("0\n") is no longer stored; the kept ones' are.
    let objects: Vec<PathBuf> = std::fs::read_dir(fx.state.history().join("objects"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let contents: Vec<Vec<u8>> = objects.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!contents.contains(&b"0\n".to_vec()), "{contents:?}");
    assert!(contents.contains(&b"1\n".to_vec()), "{contents:?}");
    let text = String::from_utf8_lossy(&shade(&fx, &["log"], &[], 60).stdout).to_string();
    assert!(text.contains("evicted"), "{text}");
}

/// A small deterministic generator for kill points.
fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

#[test]
fn killed_at_random_points_an_undo_of_2000_files_is_old_or_new_after_recover() {
    const N: usize = 2000;
    let fx = Fixture::new();
    for i in 0..N {
        fx.write(&format!("d{}/f{i}.txt", i % 20), &format!("old {i}\n"));
    }
    let old = snapshot(&fx.project);
    run_accept(
        &fx,
        "for f in d*/f*.txt; do echo new >> \"$f\"; done; rm d0/f0.txt; echo n > added.txt",
    );
    let new = snapshot(&fx.project);
    let id = log_json(&fx)[0]["id"].as_str().unwrap().to_string();

    let mut seed = 0x5eed_u64;
    let mut points: Vec<u64> = vec![1, 2, 3, 4, 2005, 2006, 2007, 4010];
    for _ in 0..6 {
        points.push(1 + lcg(&mut seed) % 6200);
    }
    let mut finished = 0;
    let mut killed_any = 0;
    for kill in points {
        let k = kill.to_string();
        let o = shade(
            &fx,
            &["undo", &id],
            &[("SHADE_FAULT_KILL_AT_STEP", k.as_str())],
            300,
        );
        let killed = o.status.code().is_none();
        killed_any += usize::from(killed);
        let r = shade(&fx, &["recover"], &[], 300);
        assert!(r.status.success(), "kill at {kill}: {}", out(&r));
        let now = snapshot(&fx.project);
        let log = log_json(&fx);
        let orig = log.iter().find(|e| e["id"] == id.as_str()).unwrap();
        if now == new {
            assert!(
                orig["undone_by"].is_null(),
                "kill at {kill}: tree is the accepted one, but the history says undone: {orig}"
            );
        } else {
            assert!(
                now == old,
                "kill at {kill} (killed: {killed}): the tree is neither before nor after the \
                 accept: {}",
                out(&o)
            );
            finished += 1;
            // The history says so, and redoing it brings the accept back.
            let by = orig["undone_by"].as_str().unwrap_or_else(|| {
                panic!("kill at {kill}: tree undone but the history does not say so: {orig}")
            });
            let o = shade(&fx, &["undo", by], &[], 300);
            assert!(o.status.success(), "{}", out(&o));
            assert!(snapshot(&fx.project) == new, "redo after kill at {kill}");
        }
    }
    assert!(
        finished > 0,
        "no kill point let the undo reach its commit point"
    );
    assert!(killed_any > 0, "no kill point was reached");
}

/// `shade recover --drop ID` gives an interrupted accept up: the history then says so —
/// rolled back when it was dropped before its commit point (nothing of it in the project),
/// never finished after it — instead of claiming its after-state, and `shade undo` refuses
/// it with that reason (and skips it by default).
#[test]
fn a_dropped_journal_is_said_in_the_log_and_undo_refuses_it() {
    let mut seen = std::collections::BTreeSet::new();
    for kill in 1..=60u64 {
        let fx = Fixture::new();
        fx.write("a.txt", "old a\n");
        fx.write("b.txt", "old b\n");
        let k = kill.to_string();
        let o = shade(
            &fx,
            &[
                "run",
                "--accept",
                "--",
                "sh",
                "-c",
                "echo new > a.txt; echo new > b.txt; echo c > c.txt",
            ],
            &[("SHADE_FAULT_KILL_AT_STEP", k.as_str())],
            300,
        );
        if o.status.code().is_some() {
            // Past the accept's last step: nothing was killed; all points are covered.
            assert!(o.status.success(), "{}", out(&o));
            break;
        }
        let journals: Vec<String> = std::fs::read_dir(fx.state.journals())
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_suffix(".json").map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        // (Any other shade command would recover the journal first: read the state.)
        let entries = fx.state.history().join("entries");
        let Some(id) = journals
            .iter()
            .find(|j| entries.join(format!("{j}.json")).exists())
        else {
            // Killed before the history entry (or after the journal was gone): nothing
            // claims an after-state.
            continue;
        };
        let d = shade(&fx, &["recover", "--drop", id], &[], 60);
        assert!(d.status.success(), "kill at {kill}: {}", out(&d));
        let log = log_json(&fx);
        let e = log.iter().find(|e| e["id"] == id.as_str()).unwrap();
        let how = e["dropped"]
            .as_str()
            .unwrap_or_else(|| panic!("kill at {kill}: the log still claims the accept: {e}"));
        assert_eq!(e["undoable"], false, "{e}");
        if how == "rolled_back" {
            assert_eq!(fx.read("a.txt"), "old a\n", "kill at {kill}");
            assert_eq!(fx.read("b.txt"), "old b\n", "kill at {kill}");
            assert!(!fx.project.join("c.txt").exists(), "kill at {kill}");
        } else {
            assert_eq!(how, "unfinished", "{e}");
        }
        let text = shade(&fx, &["log"], &[], 60);
        let text = String::from_utf8_lossy(&text.stdout).into_owned();
        let word = if how == "rolled_back" {
            "rolled back"
        } else {
            "never finished"
        };
        assert!(text.contains(word), "kill at {kill}: {text}");
        let before = snapshot(&fx.project);
        let u = shade(&fx, &["undo", id], &[], 60);
        assert!(!u.status.success(), "kill at {kill}: {}", out(&u));
        assert!(
            String::from_utf8_lossy(&u.stderr).contains("cannot be undone"),
            "kill at {kill}: {}",
            out(&u)
        );
        let u = shade(&fx, &["undo"], &[], 60);
        assert!(!u.status.success(), "kill at {kill}: {}", out(&u));
        assert!(
            String::from_utf8_lossy(&u.stderr).contains("nothing to undo"),
            "kill at {kill}: {}",
            out(&u)
        );
        assert!(
            snapshot(&fx.project) == before,
            "kill at {kill}: undo wrote"
        );
        let r = shade(&fx, &["recover"], &[], 60);
        assert!(r.status.success(), "{}", out(&r));
        seen.insert(how.to_string());
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["rolled_back", "unfinished"],
        "both kinds of dropped journal were met"
    );
}

/// Shade's state dir inside the project (the home as the project): a command that moves an
/// ancestor of it away and puts a forged tree in its place is refused at accept (the state
/// dir stays, nothing is written), and a forged journal (root `/`, a staging path with
/// slashes) or history entry (a `..` path) planted there is refused by `shade recover` and
/// `shade undo` and left as it is (red team round 6, 07-10).
#[test]
fn a_state_dir_inside_the_project_cannot_be_swapped_nor_forged_records_replayed() {
    let fx = Fixture::new();
    fx.write("a.txt", "old a\n");
    let inside = fx.project.join(".local/state/shade");
    std::fs::create_dir_all(&inside).unwrap();
    let st = inside.to_str().unwrap();
    let env = [("SHADE_STATE_DIR", st)];
    let sh = |args: &[&str]| shade(&fx, args, &env, 300);
    let o = sh(&["run", "--accept", "--", "sh", "-c", "echo new > a.txt"]);
    assert!(o.status.success(), "{}", out(&o));
    let forge = "mkdir -p x/state/shade/history/entries x/state/shade/journals && \
                 echo '{}' > x/state/shade/journals/ffff-1.json && \
                 mv .local .local-old && mv x .local";
    let o = sh(&["run", "--accept", "--", "sh", "-c", forge]);
    // The branch refuses the rename of a parent of its hidden state dir at once (EBUSY);
    // the accept engine would refuse it too (fusefs/tests/accept_state_dir.rs).
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("busy"), "{}", out(&o));
    assert!(inside.join("history/entries").is_dir());
    assert!(!fx.project.join(".local-old").exists());
    assert!(!inside.join("journals/ffff-1.json").exists());
    let log = shade(&fx, &["log", "--json"], &env, 60);
    let log: Vec<serde_json::Value> = serde_json::from_slice(&log.stdout).unwrap();
    assert!(!log.is_empty(), "the history is still in place: {log:?}");

    // A journal planted by other means: root "/", staging a path with slashes.
    let target = fx.tmp.path().join("outside-pwned");
    std::fs::create_dir_all(fx.project.join("stg")).unwrap();
    std::fs::write(fx.project.join("stg/0"), "PWNED").unwrap();
    let j = serde_json::json!({
        "version": 2, "id": "ffff-1", "root": "/",
        "staging": fx.project.join("stg").strip_prefix("/").unwrap().to_str().unwrap(),
        "phase": "Committed",
        "ops": [{"Place": {"n": 0, "path": target.strip_prefix("/").unwrap().to_str().unwrap(),
                 "symlink": false, "pre": "Absent"}}],
        "set_aside": [],
    });
    let jp = inside.join("journals/ffff-1.json");
    std::fs::create_dir_all(jp.parent().unwrap()).unwrap();
    std::fs::write(&jp, serde_json::to_vec(&j).unwrap()).unwrap();
    let o = sh(&["recover"]);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(!target.exists(), "{}", out(&o));
    assert!(jp.exists(), "the refused journal is left: {}", out(&o));
    let o = sh(&["run", "--", "true"]);
    assert!(!target.exists(), "{}", out(&o));
    std::fs::remove_file(&jp).unwrap();

    // A history entry naming a path outside the project.
    let changes = std::fs::read_dir(inside.join("history/entries"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "changes"))
        .unwrap();
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&changes).unwrap()).unwrap();
    v[0]["path"] = serde_json::json!("../escaped");
    std::fs::write(&changes, serde_json::to_vec(&v).unwrap()).unwrap();
    let o = sh(&["undo"]);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("refusing to undo"),
        "{}",
        out(&o)
    );
    assert_eq!(fx.read("a.txt"), "new\n");
    assert!(!fx.tmp.path().join("escaped").exists());
}

/// Bytes the history holds on disk (allocated, as `du` counts them).
fn history_bytes(fx: &Fixture) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(p: &Path, sum: &mut u64) {
        let Ok(rd) = std::fs::read_dir(p) else {
            return;
        };
        for e in rd {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            *sum += m.blocks() * 512;
            if m.is_dir() {
                walk(&e.path(), sum);
            }
        }
    }
    let mut sum = 0;
    walk(&fx.state.history(), &mut sum);
    sum
}

/// `len` bytes no file system stores as holes nor dedups.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len / 8)
        .flat_map(|_| lcg(&mut s).to_le_bytes())
        .collect()
}

fn big_tree(fx: &Fixture, dir: &str, mib: usize) {
    std::fs::create_dir_all(fx.project.join(dir).join("sub")).unwrap();
    for i in 0..mib / 10 {
        let at = if i % 2 == 0 {
            format!("{dir}/f{i}.bin")
        } else {
            format!("{dir}/sub/f{i}.bin")
        };
        std::fs::write(fx.project.join(at), noise(10 << 20, i as u64 + 7)).unwrap();
    }
    fx.write(&format!("{dir}/small.txt"), "small\n");
}

#[test]
fn a_renamed_tree_is_not_copied_into_the_history_and_undo_renames_it_back() {
    let fx = Fixture::new();
    big_tree(&fx, "big", 50);
    let before = snapshot(&fx.project);
    let held = history_bytes(&fx);
    run_accept(&fx, "mv big big2");
    assert!(fx.project.join("big2/sub").is_dir());
    let grew = history_bytes(&fx) - held;
    // The tree is 50 MiB; the history keeps its listing, never its contents.
    assert!(grew < 1 << 20, "the history grew by {grew} bytes");
    let log = log_json(&fx);
    assert_eq!(log[0]["undoable"], true, "{log:?}");
    assert_eq!(log[0]["renamed"][0][0], "big", "{log:?}");
    assert_eq!(log[0]["renamed"][0][1], "big2", "{log:?}");
    let inode = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(fx.project.join(p)).unwrap().ino()
    };
    let ino = inode("big2/f0.bin");

    let (o, v) = undo_json(&fx, &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(snapshot(&fx.project), before, "{}", out(&o));
    assert_eq!(v["renamed"][0][0], "big2", "{v}");
    assert_eq!(v["renamed"][0][1], "big", "{v}");
    // Renamed back, not copied back: the very same file.
    assert_eq!(inode("big/f0.bin"), ino);
    assert!(history_bytes(&fx) - held < 1 << 20);
    // And the undo redoes as a rename too.
    let o = shade(&fx, &["undo", v["undo_id"].as_str().unwrap()], &[], 120);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(inode("big2/f0.bin"), ino);
    assert!(!fx.project.join("big").exists());
}

#[test]
fn undo_of_a_rename_with_writes_inside_puts_back_exactly() {
    let fx = Fixture::new();
    fx.write("a/keep.txt", "kept as is\n");
    fx.write("a/edit.txt", "before\n");
    fx.write("a/gone.txt", "deleted after the rename\n");
    fx.write("a/in/deep.txt", "deep\n");
    fx.write("a/moved/m.txt", "moved inside\n");
    fx.write("b/old.txt", "b was here\n");
    fx.write("other/x.txt", "x\n");
    fx.write("nest/inner/i.txt", "inner\n");
    fx.write("file.txt", "a file renamed\n");
    set_mode(&fx.project.join("a/in"), 0o700);
    let before = snapshot(&fx.project);
    run_accept(
        &fx,
        // A rename over an existing directory, writes, a delete, a new file and a mode
        // inside the renamed tree; a rename inside it; nested renames; a file rename; and
        // something new where the old name was.
        "rm -r b && mv a b && echo after > b/edit.txt && rm b/gone.txt && echo new > b/new.txt \
         && chmod 755 b/in && mv b/moved b/moved2 && mkdir a && echo fresh > a/f && \
         mv nest/inner nest/inner2 && mv nest nest2 && mv file.txt file2.txt",
    );
    let after = snapshot(&fx.project);
    assert_eq!(
        std::fs::read_to_string(fx.project.join("b/edit.txt")).unwrap(),
        "after\n"
    );
    let (o, v) = undo_json(&fx, &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(snapshot(&fx.project), before, "{}", out(&o));
    assert!(!fx.project.join("b/new.txt").exists());
    // The undo of the undo is the accept again.
    let o = shade(&fx, &["undo", v["undo_id"].as_str().unwrap()], &[], 120);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(snapshot(&fx.project), after);
}

#[test]
fn undo_of_a_rename_refuses_when_the_renamed_tree_changed_since() {
    let fx = Fixture::new();
    fx.write("a/x.txt", "x\n");
    fx.write("a/y.txt", "y\n");
    run_accept(&fx, "mv a b");
    let after = snapshot(&fx.project);
    // A file the user put in the renamed directory, and one they changed.
    fx.write("b/mine.txt", "mine\n");
    let (o, v) = undo_json(&fx, &[]);
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    let kept = v["kept"].to_string();
    assert!(kept.contains("b/mine.txt"), "{v}");
    std::fs::remove_file(fx.project.join("b/mine.txt")).unwrap();
    fx.write("b/y.txt", "z\n"); // same size: the accept never read it, its times tell
    let (o, v) = undo_json(&fx, &[]);
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    assert!(v["kept"].to_string().contains("b/y.txt"), "{v}");
    // Nothing undone.
    assert!(!fx.project.join("a").exists());
    assert!(fx.project.join("b/x.txt").exists());
    fx.write("b/y.txt", "y\n");
    assert_eq!(snapshot(&fx.project), after);
    // A same-size edit whose mtime is set back as it was (`touch -r`): its ctime tells.
    let x = fx.project.join("b/x.txt");
    let was = std::fs::metadata(&x).unwrap().modified().unwrap();
    fx.write("b/x.txt", "q\n");
    std::fs::File::options()
        .write(true)
        .open(&x)
        .unwrap()
        .set_modified(was)
        .unwrap();
    let (o, v) = undo_json(&fx, &[]);
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    assert!(v["kept"].to_string().contains("b/x.txt"), "{v}");
    assert_eq!(std::fs::read_to_string(&x).unwrap(), "q\n");
    fx.write("b/x.txt", "x\n");
    // A symlink in the renamed directory's place is not followed.
    std::fs::rename(fx.project.join("b"), fx.project.join("real")).unwrap();
    std::os::unix::fs::symlink("real", fx.project.join("b")).unwrap();
    let (o, _) = undo_json(&fx, &[]);
    assert_ne!(o.status.code(), Some(0), "{}", out(&o));
    assert!(fx.project.join("real/x.txt").exists());
    assert!(!fx.project.join("a").exists());
}

#[test]
fn an_accept_past_the_history_limit_is_refused_or_with_force_recorded_not_undoable() {
    let fx = Fixture::new();
    std::fs::write(
        fx.tmp.path().join("config.toml"),
        "[history]\nmax_size = \"4MiB\"\n",
    )
    .unwrap();
    std::fs::write(fx.project.join("big.bin"), noise(8 << 20, 3)).unwrap();
    fx.write("small.txt", "small\n");
    let held = history_bytes(&fx);
    // Refused: the command must not decide that what it deletes cannot be had back.
    let o = shade(
        &fx,
        &[
            "run",
            "--accept",
            "--",
            "sh",
            "-c",
            "rm big.bin && echo changed > small.txt",
        ],
        &[],
        300,
    );
    assert!(!o.status.success(), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        err.contains("could not be undone") && err.contains("nothing was written"),
        "{}",
        out(&o)
    );
    assert!(fx.project.join("big.bin").exists());
    assert_eq!(fx.read("small.txt"), "small\n");
    // With --force it goes ahead, not undoable.
    let o = shade(
        &fx,
        &[
            "run",
            "--accept",
            "--force",
            "--",
            "sh",
            "-c",
            "rm big.bin && echo changed > small.txt",
        ],
        &[],
        300,
    );
    assert!(o.status.success(), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(err.contains("cannot be undone"), "{}", out(&o));
    assert!(!fx.project.join("big.bin").exists());
    assert!(history_bytes(&fx) - held < 1 << 20, "nothing was copied");
    let log = log_json(&fx);
    assert_eq!(log[0]["undoable"], false, "{log:?}");
    assert!(log[0]["not_kept"].as_str().unwrap().contains("max_size"));
    let text = String::from_utf8_lossy(&shade(&fx, &["log"], &[], 60).stdout).to_string();
    assert!(text.contains("not undoable"), "{text}");
    let o = shade(&fx, &["undo"], &[], 60);
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot be undone"),
        "{}",
        out(&o)
    );
    // A rename needs no room: under the same limit it is undoable.
    std::fs::create_dir(fx.project.join("d")).unwrap();
    std::fs::write(fx.project.join("d/big.bin"), noise(8 << 20, 5)).unwrap();
    let before = snapshot(&fx.project);
    run_accept(&fx, "mv d d2");
    let o = shade(&fx, &["undo"], &[], 120);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(snapshot(&fx.project), before);
}

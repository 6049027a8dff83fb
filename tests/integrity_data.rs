//! Data integrity under load (issue 3): contents copied up from lower keep every byte the
//! branch did not write, concurrent create/rename/unlink/write loops leave a tree the kernel
//! shows consistently and that accept reproduces exactly, and files the branch creates
//! and deletes give their memory back. fsx and stress-ng run from `scripts/integrity.sh`.
#![allow(clippy::unwrap_used)]

mod common;

/// One module so `cargo test -- --skip integrity::` can leave these to scripts/integrity.sh.
mod integrity {
    use super::common;

    use common::{snapshot, Fixture};
    use shade_fusefs::{AcceptFlags, ChangeKind};
    use std::collections::{BTreeMap, HashSet};
    use std::fs::{self, OpenOptions};
    use std::os::unix::fs::FileExt;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    /// xorshift64*: fixed seeds make every run do the same operations.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
        /// `min + below(span)` random bytes.
        fn chunk(&mut self, min: u64, span: u64) -> Vec<u8> {
            let n = min + self.below(span);
            self.bytes(n as usize)
        }
    }

    /// A file copied up from lower and then written at random offsets (and sometimes
    /// truncated or extended) reads back exactly like a model of it, through the mount and
    /// in the real file after accept; bytes the branch never wrote are lower's.
    #[test]
    fn copied_up_file_matches_a_model_of_random_writes() {
        let fx = Fixture::new();
        let mut rng = Rng(0x5eed_0001);
        let mut model = rng.bytes(3 << 20);
        fs::write(fx.project.join("big.bin"), &model).unwrap();
        let b = fx.branch();
        let path = b.mountpoint().join("big.bin");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let ops = 2000;
        for i in 0..ops {
            match rng.below(20) {
                0 => {
                    let len = rng.below(4 << 20) as usize;
                    f.set_len(len as u64).unwrap();
                    model.resize(len, 0);
                }
                _ => {
                    let off = rng.below(model.len() as u64 + 4096) as usize;
                    let data = rng.chunk(1, 70_000);
                    f.write_all_at(&data, off as u64).unwrap();
                    if model.len() < off + data.len() {
                        model.resize(off + data.len(), 0);
                    }
                    model[off..off + data.len()].copy_from_slice(&data);
                }
            }
            if i % 250 == 0 {
                assert_eq!(fs::read(&path).unwrap(), model, "after op {i}");
            }
        }
        drop(f);
        assert_eq!(fs::read(&path).unwrap(), model);
        b.accept(AcceptFlags::default()).unwrap();
        assert!(
            fs::read(fx.project.join("big.bin")).unwrap() == model,
            "accepted file differs from the model"
        );
        println!("copy-up model: {ops} random writes/truncates on a 3 MiB lower file, A-OK");
    }

    /// The same with a memory budget of 0, so every content lives in the disk store.
    #[test]
    fn spilled_file_matches_a_model_of_random_writes() {
        let fx = Fixture::new();
        let mut rng = Rng(0x5eed_0002);
        let opts = shade_fusefs::BranchOptions {
            memory_budget: 0,
            ..fx.options()
        };
        let mut model = rng.bytes(1 << 20);
        fs::write(fx.project.join("lower.bin"), &model).unwrap();
        let b = shade_fusefs::Branch::create(&fx.project, &opts).unwrap();
        let path = b.mountpoint().join("lower.bin");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        for i in 0..1000 {
            let off = rng.below(model.len() as u64) as usize;
            let data = rng.chunk(1, 20_000);
            f.write_all_at(&data, off as u64).unwrap();
            if model.len() < off + data.len() {
                model.resize(off + data.len(), 0);
            }
            model[off..off + data.len()].copy_from_slice(&data);
            if i % 200 == 0 {
                assert_eq!(fs::read(&path).unwrap(), model, "after op {i}");
            }
        }
        drop(f);
        assert_eq!(b.memory_used(), 0, "a zero budget keeps nothing in memory");
        assert_eq!(fs::read(&path).unwrap(), model);
        b.accept(AcceptFlags::default()).unwrap();
        assert!(fs::read(fx.project.join("lower.bin")).unwrap() == model);
        println!("disk-store model: 1000 random writes on a 1 MiB lower file, budget 0, A-OK");
    }

    /// Files created, written, reopened and deleted in a branch give back their memory once
    /// the kernel forgets them: a branch that churns through temp files must not grow.
    #[test]
    fn deleted_files_give_their_memory_back() {
        let fx = Fixture::new();
        fx.write("existing.txt", "x");
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        // An open of an existing file: the overlay may switch the kernel to no-open mode here.
        fs::read(m.join("existing.txt")).unwrap();
        for i in 0..200 {
            let p = m.join(format!("tmp{i}"));
            fs::write(&p, vec![7u8; 4096]).unwrap();
            assert_eq!(fs::read(&p).unwrap().len(), 4096);
            fs::remove_file(&p).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while b.memory_used() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            b.memory_used(),
            0,
            "200 created-and-deleted 4 KiB files still hold memory (a leaked handle or node)"
        );
    }

    /// fsstress-style: several workers with fixed seeds create, write, truncate, rename,
    /// link-free unlink, mkdir and rmdir over a small shared name space (so they collide),
    /// on top of a lower tree. Expected races (ENOENT, EEXIST, ENOTEMPTY…) are fine; any
    /// other error is a failure. Then the tree the kernel shows must be self-consistent,
    /// the changeset must explain every difference to lower, and accept must reproduce the
    /// mount exactly.
    #[test]
    fn concurrent_churn_leaves_a_consistent_tree() {
        churn_and_check(4, 15_000, false);
    }

    /// One worker: the same checks on a deterministic sequence of operations.
    #[test]
    fn sequential_churn_leaves_a_consistent_tree() {
        churn_and_check(1, 40_000, false);
    }

    /// With directory renames mixed in (seed 0xC0FFEE, one worker, deterministic).
    #[test]
    fn churn_with_directory_renames_leaves_a_consistent_tree() {
        churn_and_check(1, 40_000, true);
    }

    /// The same with four concurrent workers.
    #[test]
    fn concurrent_churn_with_directory_renames_leaves_a_consistent_tree() {
        churn_and_check(4, 15_000, true);
    }

    fn churn_and_check(workers: u64, ops: u64, dir_renames: bool) {
        let fx = Fixture::new();
        let mut seed_rng = Rng(0x5eed_0003);
        for d in 0..3 {
            for f in 0..6 {
                let data = seed_rng.chunk(1, 20_000);
                let p = fx.project.join(format!("d{d}/f{f}"));
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                fs::write(p, data).unwrap();
            }
        }
        let initial = snapshot(&fx.project);
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let m = m.clone();
                std::thread::spawn(move || churn(&m, 0xC0FFEE + w, ops, dir_renames))
            })
            .collect();
        let mut done = 0u64;
        let mut failures = Vec::new();
        for h in handles {
            let (ok, errs) = h.join().unwrap();
            done += ok;
            failures.extend(errs);
        }
        assert!(failures.is_empty(), "unexpected errors: {failures:#?}");

        let shown = walk_consistent(&m);
        let lower = snapshot(&fx.project);
        assert!(
            lower == initial,
            "the real tree changed while the branch ran: {}",
            first_difference(&initial, &lower)
        );
        let cs = b.changeset(true);
        let diag = |p: &Path| {
            let listed = fs::read_dir(m.join(p).parent().unwrap())
                .map(|d| {
                    d.flatten()
                        .any(|e| Some(e.file_name().as_os_str()) == p.file_name())
                })
                .unwrap_or(false);
            format!(
                "in the mount now: lstat {:?}, listed {listed}",
                fs::symlink_metadata(m.join(p)).map(|md| md.len())
            )
        };
        check_changeset_explains(&lower, &shown, &cs.changes, &diag);
        let n_changes = cs.changes.len();
        b.accept(AcceptFlags {
            include_ignored: true,
            force: false,
        })
        .unwrap();
        let accepted = snapshot(&fx.project);
        assert!(
            accepted == shown,
            "accept did not reproduce the mount: {}",
            first_difference(&shown, &accepted)
        );
        println!(
        "fsstress-style: {workers} workers x {ops} ops ({done} succeeded, directory renames: \
         {dir_renames}), {} paths, {n_changes} changes, mount consistent, changeset explains every difference, accept == mount",
        shown.len()
    );
    }

    /// A lower file renamed in the branch is gone from its old path after accept, also
    /// when the rename replaced another lower file; the user editing the old path
    /// meanwhile is a conflict.
    #[test]
    fn renamed_file_source_is_removed_on_accept() {
        let fx = Fixture::new();
        fx.write("d1/f0", "zero\n");
        fx.write("d1/f1", "one\n");
        fx.write("d1/f2", "two\n");
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        fs::rename(m.join("d1/f0"), m.join("d1/f9")).unwrap();
        fs::rename(m.join("d1/f2"), m.join("d1/f1")).unwrap();
        let shown = snapshot(&m);
        b.accept(AcceptFlags::default()).unwrap();
        assert_eq!(snapshot(&fx.project), shown);

        fx.write("r", "base\n");
        let b = fx.branch();
        fs::rename(b.mountpoint().join("r"), b.mountpoint().join("r.moved")).unwrap();
        fx.write("r", "user edit\n");
        let e = b.accept(AcceptFlags::default()).unwrap_err();
        assert!(format!("{e:?}").contains("\"r\""), "{e:?}");
        assert_eq!(fx.read("r"), "user edit\n");
        assert!(!fx.project.join("r.moved").exists());
    }

    /// A directory moved onto the place of a removed one, with a file in it replaced by
    /// a new directory: the old lower file at the literal path belongs to the removed
    /// directory, so it is no conflict (churn found this as a flaky false conflict).
    #[test]
    fn new_entry_in_a_directory_moved_over_a_removed_one_is_no_conflict() {
        let fx = Fixture::new();
        fx.write("d0/f0", "old zero\n");
        fx.write("d1/f0", "moved zero\n");
        fx.write("d1/f1", "moved one\n");
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        fs::remove_dir_all(m.join("d0")).unwrap();
        fs::rename(m.join("d1"), m.join("d0")).unwrap();
        fs::remove_file(m.join("d0/f0")).unwrap();
        fs::create_dir(m.join("d0/f0")).unwrap();
        fs::write(m.join("d0/f0/x"), "new\n").unwrap();
        let shown = snapshot(&m);
        b.accept(AcceptFlags::default()).unwrap();
        assert_eq!(snapshot(&fx.project), shown);
    }

    /// A lower directory emptied, removed and made again: the changeset must show the
    /// lower files that are gone (accept deletes them), not only the new files.
    #[test]
    fn recreated_directory_reports_its_hidden_lower_files() {
        let fx = Fixture::new();
        fx.write("d1/f0", "zero\n");
        fx.write("d1/f1", "one\n");
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        fs::remove_file(m.join("d1/f0")).unwrap();
        fs::remove_file(m.join("d1/f1")).unwrap();
        fs::remove_dir(m.join("d1")).unwrap();
        fs::create_dir(m.join("d1")).unwrap();
        fs::write(m.join("d1/f1"), "new\n").unwrap();
        let changes: Vec<String> = b
            .changeset(false)
            .changes
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert!(
            changes.iter().any(|c| c == "D d1/f0"),
            "the deletion accept will make is not shown: {changes:?}"
        );
        let shown = snapshot(&m);
        b.accept(AcceptFlags::default()).unwrap();
        assert_eq!(snapshot(&fx.project), shown);
    }

    /// A file deleted inside a renamed lower directory: accept deletes it from the moved
    /// directory (it used to report a false conflict), leaves no trash behind, and a user
    /// edit of that file meanwhile is still a conflict.
    #[test]
    fn deletion_inside_a_renamed_directory_is_accepted() {
        let fx = Fixture::new();
        fx.write("d2/f1", "one\n");
        fx.write("d2/f2", "two\n");
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        fs::rename(m.join("d2"), m.join("d3")).unwrap();
        fs::remove_file(m.join("d3/f2")).unwrap();
        fs::write(m.join("d3/f1"), "one, edited\n").unwrap();
        let shown = snapshot(&m);
        b.accept(AcceptFlags::default()).unwrap();
        assert_eq!(snapshot(&fx.project), shown);

        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        fs::rename(m.join("d3"), m.join("d4")).unwrap();
        fs::remove_file(m.join("d4/f1")).unwrap();
        fx.write("d3/f1", "user edit\n");
        let e = b.accept(AcceptFlags::default()).unwrap_err();
        assert!(format!("{e:?}").contains("d3/f1"), "{e:?}");
        assert_eq!(fx.read("d3/f1"), "user edit\n");
        assert!(!fx.project.join("d4").exists());
    }

    /// Two lower directories swapped through a third name, one file edited on the way.
    /// Accept moves every renamed directory to a temporary name first, so the cycle applies.
    #[test]
    fn swapped_directories_are_accepted() {
        let fx = Fixture::new();
        fx.write("d0/f2", "zero\n");
        fx.write("d2/f2", "two\n");
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        fs::rename(m.join("d2"), m.join("d3")).unwrap();
        fs::write(m.join("d3/f2"), "two, edited\n").unwrap();
        fs::rename(m.join("d0"), m.join("d2")).unwrap();
        fs::rename(m.join("d3"), m.join("d0")).unwrap();
        let shown = snapshot(&m);
        b.accept(AcceptFlags::default()).unwrap();
        assert_eq!(snapshot(&fx.project), shown);
    }

    /// A branch may move a lower directory beneath a new directory that took its old name;
    /// accept must then move it aside first instead of refusing.
    #[test]
    fn nested_directory_rename_is_accepted() {
        let fx = Fixture::new();
        fx.write("d1/f", "one\n");
        fx.write("d3/g", "three\n");
        let b = fx.branch();
        let m = b.mountpoint().to_path_buf();
        fs::rename(m.join("d1"), m.join("d3/x")).unwrap();
        fs::create_dir(m.join("d1")).unwrap();
        fs::rename(m.join("d3"), m.join("d1/y")).unwrap();
        let shown = snapshot(&m);
        b.accept(AcceptFlags::default()).unwrap();
        assert_eq!(snapshot(&fx.project), shown);
    }

    fn churn(m: &Path, seed: u64, ops: u64, dir_renames: bool) -> (u64, Vec<String>) {
        let mut rng = Rng(seed);
        let mut ok = 0;
        let mut errs = Vec::new();
        let name = |rng: &mut Rng| -> PathBuf {
            let d = rng.below(4);
            if rng.below(4) == 0 {
                PathBuf::from(format!("d{d}"))
            } else {
                PathBuf::from(format!("d{d}/f{}", rng.below(8)))
            }
        };
        for _ in 0..ops {
            let p = m.join(name(&mut rng));
            let r: std::io::Result<()> = match rng.below(10) {
                0..=2 => {
                    let data = rng.chunk(0, 30_000);
                    let off = rng.below(20_000);
                    OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(&p)
                        .and_then(|f| f.write_all_at(&data, off))
                }
                3 => OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .and_then(|f| f.set_len(rng.below(25_000))),
                4 | 5 => {
                    // Same depth: a directory moved beneath a new directory of its old name
                    // is a known accept limitation (`nested_directory_rename_is_accepted`).
                    let mut q = m.join(name(&mut rng));
                    while q.components().count() != p.components().count() {
                        q = m.join(name(&mut rng));
                    }
                    if !dir_renames && fs::symlink_metadata(&p).is_ok_and(|md| md.is_dir()) {
                        continue;
                    }
                    fs::rename(&p, &q)
                }
                6 => fs::remove_file(&p),
                7 => fs::create_dir(&p),
                8 => fs::remove_dir(&p),
                _ => fs::read(&p).map(|_| ()),
            };
            match r {
                Ok(()) => ok += 1,
                Err(e) if expected_race(&e) => {}
                Err(e) => errs.push(format!("{}: {e}", p.display())),
            }
        }
        (ok, errs)
    }

    /// Errors that concurrent workers cause each other, not the file system.
    fn expected_race(e: &std::io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(
                libc::ENOENT
                    | libc::EEXIST
                    | libc::ENOTEMPTY
                    | libc::ENOTDIR
                    | libc::EISDIR
                    | libc::EINVAL
                    | libc::EBUSY
            )
        )
    }

    /// Walk the mount and check what the kernel shows: no duplicate names in a listing,
    /// every listed entry can be looked up with the type the listing gave, and every file
    /// reads exactly as many bytes as its size says.
    fn walk_consistent(root: &Path) -> Vec<(PathBuf, String)> {
        fn rec(dir: &Path) {
            let mut seen = HashSet::new();
            for e in fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                assert!(seen.insert(e.file_name()), "duplicate {:?}", e.path());
                let listed = e.file_type().unwrap();
                let md = fs::symlink_metadata(e.path())
                    .unwrap_or_else(|err| panic!("listed but not found: {:?}: {err}", e.path()));
                assert_eq!(listed.is_dir(), md.is_dir(), "{:?}", e.path());
                if md.is_file() {
                    let n = fs::read(e.path()).unwrap().len() as u64;
                    assert_eq!(n, md.len(), "size vs bytes read: {:?}", e.path());
                }
                if md.is_dir() {
                    rec(&e.path());
                }
            }
        }
        rec(root);
        snapshot(root)
    }

    /// Every difference between lower and the mount is covered by a change at that path or
    /// an ancestor (or the old side of a rename), and every change is a real difference.
    fn check_changeset_explains(
        lower: &[(PathBuf, String)],
        shown: &[(PathBuf, String)],
        changes: &[shade_fusefs::Change],
        diag: &dyn Fn(&Path) -> String,
    ) {
        let lower: BTreeMap<_, _> = lower.iter().cloned().collect();
        let shown: BTreeMap<_, _> = shown.iter().cloned().collect();
        // A change at `p` or an ancestor; for a directory also one beneath it (a new
        // directory with new files is listed by its files).
        let covered = |p: &Path| {
            let is_dir = shown.get(p).or(lower.get(p)).is_some_and(|v| v == "<dir>");
            changes.iter().any(|c| {
                p.starts_with(&c.path)
                    || c.old_path.as_ref().is_some_and(|o| p.starts_with(o))
                    || (is_dir && c.path.starts_with(p))
                    || (is_dir && c.old_path.as_ref().is_some_and(|o| o.starts_with(p)))
            })
        };
        for (p, v) in &shown {
            if lower.get(p) != Some(v) {
                assert!(
                    covered(p),
                    "{p:?} differs from lower but no change names it"
                );
            }
        }
        for p in lower.keys() {
            if !shown.contains_key(p) {
                assert!(
                    covered(p),
                    "{p:?} is gone but no change names it ({}); changes: {:#?}",
                    diag(p),
                    changes
                );
            }
        }
        for c in changes {
            match c.kind {
                ChangeKind::Added => {
                    assert!(shown.contains_key(&c.path), "added {:?} not shown", c.path);
                }
                ChangeKind::Deleted => {
                    assert!(!shown.contains_key(&c.path), "deleted {:?} shown", c.path);
                }
                ChangeKind::Modified => {
                    assert!(shown.contains_key(&c.path), "modified {:?} gone", c.path);
                    let under_rename = changes.iter().any(|r| {
                        r.kind == ChangeKind::Renamed && r.is_dir && c.path.starts_with(&r.path)
                    });
                    assert!(
                        lower.contains_key(&c.path) || under_rename,
                        "modified {:?} is neither in lower nor under a renamed directory",
                        c.path
                    );
                }
                ChangeKind::Renamed => {
                    assert!(
                        shown.contains_key(&c.path),
                        "renamed to {:?} not shown",
                        c.path
                    );
                    let old = c.old_path.as_ref().unwrap();
                    assert!(lower.contains_key(old), "renamed from {old:?} not in lower");
                }
            }
        }
    }

    fn first_difference(a: &[(PathBuf, String)], b: &[(PathBuf, String)]) -> String {
        let a: BTreeMap<_, _> = a.iter().cloned().collect();
        let b: BTreeMap<_, _> = b.iter().cloned().collect();
        for (p, v) in &a {
            match b.get(p) {
                None => return format!("{p:?} missing after accept"),
                Some(w) if w != v => return format!("{p:?} differs after accept"),
                _ => {}
            }
        }
        for p in b.keys() {
            if !a.contains_key(p) {
                return format!("{p:?} appeared after accept");
            }
        }
        String::from("none")
    }
}

#![allow(clippy::unwrap_used)]

use super::show::DIFF_MAX;
use super::*;
use crate::StateDir;
use std::os::unix::fs::PermissionsExt;

/// A hand-made layer: a host tree and one unit's upper over it, in a temp dir under /var/tmp.
struct Fx {
    _tmp: tempfile::TempDir,
    host: PathBuf,
    outside: PathBuf,
    upper: PathBuf,
}

fn fx(shift: u32) -> Fx {
    let tmp = tempfile::Builder::new()
        .prefix("shade-outside-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let host = tmp.path().join("host");
    let outside = tmp.path().join("outside");
    let upper = outside.join("u0/upper");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::create_dir_all(&upper).unwrap();
    // Created a moment in the past: the host files made below count as "before".
    let layer = Layer {
        created_ns: now_ns() + 1_000_000_000,
        shift,
        userxattr: false,
        units: vec![Unit {
            path: host.clone(),
            dir: "u0".into(),
        }],
    };
    std::fs::write(
        outside.join("layer.json"),
        serde_json::to_vec(&layer).unwrap(),
    )
    .unwrap();
    Fx {
        _tmp: tmp,
        host,
        outside,
        upper,
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn set_created(f: &Fx, created_ns: u64) {
    let p = f.outside.join("layer.json");
    let mut l: Layer = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    l.created_ns = created_ns;
    std::fs::write(&p, serde_json::to_vec(&l).unwrap()).unwrap();
}

fn whiteout(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; a 0:0 character device is overlayfs's whiteout (needs root).
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) };
    assert_eq!(
        r,
        0,
        "mknod whiteout (the unit tests run as root): {}",
        io::Error::last_os_error()
    );
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr {name}: {}", io::Error::last_os_error());
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

fn kinds(c: &OutsideChanges, f: &Fx) -> Vec<(String, OutsideKind)> {
    c.changes
        .iter()
        .map(|c| {
            (
                c.path.strip_prefix(&f.host).unwrap().display().to_string(),
                c.kind,
            )
        })
        .collect()
}

#[test]
fn no_layer_is_no_changes() {
    let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
    assert!(OutsideChanges::read(&tmp.path().join("outside"))
        .unwrap()
        .is_empty());
    assert!(OutsideChanges::read(tmp.path()).unwrap().is_empty());
}

#[test]
fn kinds_whiteouts_opaque_and_unchanged_copies() {
    let f = fx(0);
    let (h, u) = (&f.host, &f.upper);
    std::fs::write(h.join(".bashrc"), "a\n").unwrap();
    std::fs::write(u.join(".bashrc"), "a\nx\n").unwrap();
    // Copied up, unchanged: not listed.
    std::fs::write(h.join("same"), "same\n").unwrap();
    std::fs::write(u.join("same"), "same\n").unwrap();
    std::fs::set_permissions(
        u.join("same"),
        std::fs::metadata(h.join("same")).unwrap().permissions(),
    )
    .unwrap();
    // Deleted.
    std::fs::write(h.join("gone"), "g").unwrap();
    whiteout(&u.join("gone"));
    // A whiteout of something the host never had: nothing.
    whiteout(&u.join("never"));
    // File replaced by a symlink.
    std::fs::write(h.join("swap"), "s").unwrap();
    std::os::unix::fs::symlink("elsewhere", u.join("swap")).unwrap();
    // New file in a new directory.
    std::fs::create_dir(u.join(".claude")).unwrap();
    std::fs::write(u.join(".claude/state.json"), "{}").unwrap();
    // A merged dir with a change inside and one whose host entries the branch replaced.
    std::fs::create_dir_all(h.join("cfg/keep")).unwrap();
    std::fs::write(h.join("cfg/old"), "o").unwrap();
    std::fs::write(h.join("cfg/keep/k"), "k").unwrap();
    std::fs::create_dir(u.join("cfg")).unwrap();
    std::fs::set_permissions(
        u.join("cfg"),
        std::fs::metadata(h.join("cfg")).unwrap().permissions(),
    )
    .unwrap();
    std::fs::write(u.join("cfg/new"), "n").unwrap();
    std::fs::create_dir_all(h.join("opq/sub")).unwrap();
    std::fs::write(h.join("opq/a"), "a").unwrap();
    std::fs::create_dir(u.join("opq")).unwrap();
    std::fs::set_permissions(
        u.join("opq"),
        std::fs::metadata(h.join("opq")).unwrap().permissions(),
    )
    .unwrap();
    set_xattr(&u.join("opq"), "trusted.overlay.opaque", b"y");
    std::fs::write(u.join("opq/a"), "a").unwrap();
    // Mode change only.
    std::fs::write(h.join("script"), "#!/bin/sh\n").unwrap();
    std::fs::write(u.join("script"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(u.join("script"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(h.join("script"), std::fs::Permissions::from_mode(0o644)).unwrap();

    let c = OutsideChanges::read(&f.outside).unwrap();
    assert_eq!(
        kinds(&c, &f),
        vec![
            (".bashrc".into(), OutsideKind::Modified),
            (".claude".into(), OutsideKind::Added),
            (".claude/state.json".into(), OutsideKind::Added),
            ("cfg/new".into(), OutsideKind::Added),
            ("gone".into(), OutsideKind::Deleted),
            ("opq/sub".into(), OutsideKind::Deleted),
            ("script".into(), OutsideKind::Modified),
            ("swap".into(), OutsideKind::TypeChanged),
        ]
    );
    let swap = c.changes.iter().find(|c| c.path.ends_with("swap")).unwrap();
    assert_eq!(swap.target_new.as_deref(), Some(Path::new("elsewhere")));
    assert!(
        c.changes
            .iter()
            .find(|c| c.path.ends_with("opq/sub"))
            .unwrap()
            .is_dir
    );

    // Lines with `~` for the home; the diff of the text file.
    let lines = c.lines(Some(h));
    assert!(lines.contains(&"M ~/.bashrc".to_string()), "{lines:?}");
    assert!(
        lines.contains(&"M ~/script (mode 644 -> 755)".to_string()),
        "{lines:?}"
    );
    let d = c.changes[0].diff(Some(h));
    assert!(d.contains("diff --shade-outside ~/.bashrc"), "{d}");
    assert!(d.contains("+x\n"), "{d}");
    let json = serde_json::to_value(&c.changes[0]).unwrap();
    assert_eq!(json["kind"], "modified");
    assert_eq!(json["kept"], false);
}

#[test]
fn shifted_owners_map_back_and_foreign_ones_are_flagged() {
    let shift = 100_000;
    let f = fx(shift);
    let (h, u) = (&f.host, &f.upper);
    std::fs::write(h.join("f"), "1").unwrap();
    chown(&h.join("f"), 0, 0);
    std::fs::write(u.join("f"), "1").unwrap();
    std::fs::set_permissions(
        u.join("f"),
        std::fs::metadata(h.join("f")).unwrap().permissions(),
    )
    .unwrap();
    chown(&u.join("f"), shift, shift); // ns root = host root: unchanged
    std::fs::write(u.join("n"), "n").unwrap();
    chown(&u.join("n"), shift + 1000, shift + 1000);
    std::fs::write(u.join("x"), "x").unwrap();
    chown(&u.join("x"), 5, 5); // below the shift: not an id of the sandbox
    let c = OutsideChanges::read(&f.outside).unwrap();
    assert_eq!(
        kinds(&c, &f),
        vec![
            ("n".into(), OutsideKind::Added),
            ("x".into(), OutsideKind::Added)
        ]
    );
    assert_eq!(
        c.changes[0].owner_new,
        Some(Owner {
            uid: 1000,
            gid: 1000
        })
    );
    assert!(c.changes[1].foreign_owner && c.changes[1].owner_new.is_none());
}

#[test]
fn many_files_under_one_directory_are_one_line() {
    let f = fx(0);
    let reg = f.upper.join(".cargo/registry");
    std::fs::create_dir_all(&reg).unwrap();
    for i in 0..1204 {
        std::fs::write(reg.join(format!("crate{i}")), vec![b'x'; 1000]).unwrap();
    }
    std::fs::write(f.upper.join(".bashrc"), "x").unwrap();
    let c = OutsideChanges::read(&f.outside).unwrap();
    assert_eq!(c.changes.len(), 1207);
    let lines = c.lines(Some(&f.host));
    assert_eq!(
        lines,
        vec![
            "A ~/.bashrc".to_string(),
            "~/.cargo/: 1,204 files added, 1 MB".to_string()
        ]
    );
}

#[test]
fn big_and_binary_files_are_not_diffed() {
    let f = fx(0);
    std::fs::write(f.upper.join("big"), vec![b'a'; (DIFF_MAX + 10) as usize]).unwrap();
    std::fs::write(f.upper.join("bin"), b"\0\x01\x02").unwrap();
    let c = OutsideChanges::read(&f.outside).unwrap();
    let d = c.diff(Some(&f.host));
    assert!(d.contains("larger than 1 MiB"), "{d}");
    assert!(d.contains("Binary, absent -> 3 bytes"), "{d}");
}

#[test]
fn keep_writes_only_the_chosen_paths_and_journals() {
    let f = fx(0);
    let state = StateDir::at(f._tmp.path().join("state"));
    std::fs::write(f.host.join(".bashrc"), "a\n").unwrap();
    std::fs::write(f.host.join(".gitconfig"), "old\n").unwrap();
    std::fs::write(f.upper.join(".bashrc"), "a\nevil\n").unwrap();
    std::fs::write(f.upper.join(".gitconfig"), "new\n").unwrap();
    std::fs::set_permissions(
        f.upper.join(".gitconfig"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    std::fs::create_dir_all(f.upper.join(".claude/projects")).unwrap();
    std::fs::write(f.upper.join(".claude/projects/s.json"), "{}").unwrap();
    let mut c = OutsideChanges::read(&f.outside).unwrap();
    let keep = vec![
        f.host.join(".gitconfig"),
        f.host.join(".claude/projects/s.json"),
    ];
    c.check_keep(&keep).unwrap();
    let r = c.keep(&keep, &state).unwrap();
    assert_eq!(r.kept.len(), 4, "{:?}", r.kept); // .claude, .claude/projects, s.json, .gitconfig
    assert_eq!(
        std::fs::read_to_string(f.host.join(".gitconfig")).unwrap(),
        "new\n"
    );
    // set-user-ID stripped.
    let mode = std::fs::metadata(f.host.join(".gitconfig"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
    assert_eq!(r.accept.privileges_dropped.len(), 1);
    assert_eq!(
        std::fs::read_to_string(f.host.join(".claude/projects/s.json")).unwrap(),
        "{}"
    );
    assert_eq!(
        std::fs::read_to_string(f.host.join(".bashrc")).unwrap(),
        "a\n"
    );
    assert!(
        c.changes
            .iter()
            .find(|c| c.path.ends_with(".gitconfig"))
            .unwrap()
            .kept
    );
    assert!(
        !c.changes
            .iter()
            .find(|c| c.path.ends_with(".bashrc"))
            .unwrap()
            .kept
    );
    // No journal or scratch left behind.
    assert_eq!(std::fs::read_dir(state.journals()).unwrap().count(), 0);
    let left: Vec<_> = std::fs::read_dir(&f.host)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".shade-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn keep_deletes_and_directory_prefixes() {
    let f = fx(0);
    let state = StateDir::at(f._tmp.path().join("state"));
    std::fs::create_dir_all(f.host.join("d/sub")).unwrap();
    std::fs::write(f.host.join("d/sub/x"), "x").unwrap();
    std::fs::write(f.host.join("d/y"), "y").unwrap();
    std::fs::create_dir(f.upper.join("d")).unwrap();
    std::fs::set_permissions(
        f.upper.join("d"),
        std::fs::metadata(f.host.join("d")).unwrap().permissions(),
    )
    .unwrap();
    whiteout(&f.upper.join("d/sub"));
    std::fs::write(f.upper.join("d/y"), "y2").unwrap();
    let mut c = OutsideChanges::read(&f.outside).unwrap();
    assert_eq!(c.changes.len(), 2, "{:?}", c.changes);
    c.keep(&[f.host.join("d")], &state).unwrap();
    assert!(!f.host.join("d/sub").exists());
    assert_eq!(std::fs::read_to_string(f.host.join("d/y")).unwrap(), "y2");
}

#[test]
fn keep_refuses_a_path_the_host_changed_since_the_layer_was_made() {
    let f = fx(0);
    let state = StateDir::at(f._tmp.path().join("state"));
    std::fs::write(f.host.join(".gitconfig"), "old\n").unwrap();
    std::fs::write(f.host.join("other"), "o\n").unwrap();
    std::fs::write(f.upper.join(".gitconfig"), "new\n").unwrap();
    std::fs::write(f.upper.join("other"), "o2\n").unwrap();
    std::fs::write(f.upper.join("fresh"), "f\n").unwrap();
    let mut c = OutsideChanges::read(&f.outside).unwrap();
    // The layer was made before the user's edit below.
    set_created(&f, now_ns() - 1);
    c.layer.as_mut().unwrap().created_ns = now_ns() - 1;
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(f.host.join(".gitconfig"), "user's\n").unwrap();
    std::fs::write(f.host.join("fresh"), "user's\n").unwrap();
    let keep = vec![
        f.host.join(".gitconfig"),
        f.host.join("other"),
        f.host.join("fresh"),
    ];
    let e = c.keep(&keep, &state).unwrap_err();
    let KeepError::Conflicts(list) = &e else {
        panic!("{e}")
    };
    assert_eq!(list.len(), 2, "{e}");
    assert!(e.to_string().contains("changed on the host"), "{e}");
    assert!(e.to_string().contains("created on the host"), "{e}");
    // Nothing written, not even the path without a conflict.
    assert_eq!(
        std::fs::read_to_string(f.host.join(".gitconfig")).unwrap(),
        "user's\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.host.join("other")).unwrap(),
        "o\n"
    );
}

#[test]
fn keep_refuses_owners_the_user_could_not_give() {
    let shift = 100_000;
    let f = fx(shift);
    let state = StateDir::at(f._tmp.path().join("state"));
    std::fs::write(f.host.join("mine"), "m").unwrap();
    chown(&f.host.join("mine"), 1001, 1001);
    std::fs::write(f.upper.join("mine"), "m2").unwrap();
    chown(&f.upper.join("mine"), shift + 1001, shift + 1001); // kept owner: fine
    std::fs::write(f.upper.join("planted"), "p").unwrap();
    chown(&f.upper.join("planted"), shift + 4242, shift + 4242);
    let mut c = OutsideChanges::read(&f.outside).unwrap();
    let e = c.keep(&[f.host.join("planted")], &state).unwrap_err();
    assert!(matches!(e, KeepError::Refused { .. }), "{e}");
    assert!(!f.host.join("planted").exists());
    c.keep(&[f.host.join("mine")], &state).unwrap();
    let m = std::fs::metadata(f.host.join("mine")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1001, 1001));
    assert_eq!(std::fs::read_to_string(f.host.join("mine")).unwrap(), "m2");
}

#[test]
fn userxattr_layers_and_what_is_never_kept() {
    let f = fx(0);
    let p = f.outside.join("layer.json");
    let mut l: Layer = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    l.userxattr = true;
    std::fs::write(&p, serde_json::to_vec(&l).unwrap()).unwrap();
    let state = StateDir::at(f._tmp.path().join("state"));
    // An opaque directory marked the unprivileged way; the trusted name means nothing here.
    std::fs::create_dir_all(f.host.join("o/old")).unwrap();
    std::fs::create_dir(f.upper.join("o")).unwrap();
    std::fs::set_permissions(
        f.upper.join("o"),
        std::fs::metadata(f.host.join("o")).unwrap().permissions(),
    )
    .unwrap();
    set_xattr(&f.upper.join("o"), "user.overlay.opaque", b"y");
    std::fs::create_dir_all(f.host.join("t/keep")).unwrap();
    std::fs::create_dir(f.upper.join("t")).unwrap();
    std::fs::set_permissions(
        f.upper.join("t"),
        std::fs::metadata(f.host.join("t")).unwrap().permissions(),
    )
    .unwrap();
    set_xattr(&f.upper.join("t"), "trusted.overlay.opaque", b"y");
    // A renamed directory (its contents come from elsewhere) and a device node.
    std::fs::create_dir(f.upper.join("moved")).unwrap();
    set_xattr(
        &f.upper.join("moved"),
        "user.overlay.redirect",
        b"/elsewhere",
    );
    let c = CString::new(f.upper.join("dev").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; a character device 1:3 (needs root).
    assert_eq!(
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) },
        0
    );
    let mut c = OutsideChanges::read(&f.outside).unwrap();
    assert_eq!(
        kinds(&c, &f),
        vec![
            ("dev".into(), OutsideKind::Added),
            ("moved".into(), OutsideKind::Added),
            ("o/old".into(), OutsideKind::Deleted),
        ]
    );
    for (path, why) in [("moved", "renamed"), ("dev", "device")] {
        let e = c.keep(&[f.host.join(path)], &state).unwrap_err();
        assert!(
            matches!(e, KeepError::Refused { .. }) && e.to_string().contains(why),
            "{e}"
        );
        assert!(!f.host.join(path).exists());
    }
}

#[test]
fn an_extended_attribute_change_alone_is_listed_and_kept() {
    let f = fx(0);
    let (h, u) = (&f.host, &f.upper);
    // A file copied up with the same content, mode and owner, and one user attribute more.
    std::fs::write(h.join("tagged"), "same\n").unwrap();
    std::fs::write(u.join("tagged"), "same\n").unwrap();
    let perms = std::fs::metadata(h.join("tagged")).unwrap().permissions();
    std::fs::set_permissions(u.join("tagged"), perms).unwrap();
    set_xattr(&u.join("tagged"), "user.mark", b"agent");
    // overlayfs's own bookkeeping is not a change.
    std::fs::write(h.join("plain"), "p").unwrap();
    std::fs::write(u.join("plain"), "p").unwrap();
    let perms = std::fs::metadata(h.join("plain")).unwrap().permissions();
    std::fs::set_permissions(u.join("plain"), perms).unwrap();
    set_xattr(&u.join("plain"), "user.overlay.origin", b"x");
    // A directory whose attribute changed.
    std::fs::create_dir(h.join("d")).unwrap();
    std::fs::create_dir(u.join("d")).unwrap();
    let perms = std::fs::metadata(h.join("d")).unwrap().permissions();
    std::fs::set_permissions(u.join("d"), perms).unwrap();
    set_xattr(&u.join("d"), "user.colour", b"red");

    let mut c = OutsideChanges::read(&f.outside).unwrap();
    assert_eq!(
        kinds(&c, &f),
        vec![
            ("d".into(), OutsideKind::Modified),
            ("tagged".into(), OutsideKind::Modified),
        ]
    );
    let lines = c.lines(Some(h));
    assert!(
        lines.contains(&"M ~/tagged (extended attributes)".to_string()),
        "{lines:?}"
    );
    let tagged = c
        .changes
        .iter()
        .find(|c| c.path.ends_with("tagged"))
        .unwrap();
    assert!(tagged.diff(Some(h)).contains("extended attributes changed"));
    assert_eq!(
        serde_json::to_value(tagged).unwrap()["xattrs_changed"],
        true
    );

    let state = StateDir::at(f._tmp.path().join("state"));
    c.keep(&[h.join("tagged"), h.join("d")], &state).unwrap();
    assert_eq!(
        lgetxattr(&h.join("tagged"), b"user.mark").as_deref(),
        Some(&b"agent"[..])
    );
    assert_eq!(
        lgetxattr(&h.join("d"), b"user.colour").as_deref(),
        Some(&b"red"[..])
    );
    assert_eq!(std::fs::read_to_string(h.join("tagged")).unwrap(), "same\n");
}

/// A credential the sandbox hid or sanitized (red team round 5 route 5): the command's own
/// `~/.npmrc` and its edit of the sanitized `~/.gitconfig` are listed and diffed, but the
/// host's files, with their tokens, are never shown (an agent reads diffs through `shade
/// mcp`'s `diff`).
#[test]
fn masked_paths_never_show_the_host_side() {
    let f = fx(0);
    std::fs::write(f.host.join(".npmrc"), "//r/:_authToken=HOST-TOKEN-1\n").unwrap();
    std::fs::write(
        f.host.join(".gitconfig"),
        "[user]\n\tname = A\n[url \"https://HOST-TOKEN-2@h/\"]\n\tinsteadOf = https://h/\n",
    )
    .unwrap();
    std::fs::write(f.upper.join(".npmrc"), "mine\n").unwrap();
    std::fs::write(
        f.upper.join(".gitconfig"),
        "[user]\n\tname = A\n[x]\n\ty = z\n",
    )
    .unwrap();
    record_masked(
        &f.outside,
        &[f.host.join(".npmrc"), f.host.join(".gitconfig")],
    )
    .unwrap();
    // Recorded again (a later command): still one list.
    record_masked(&f.outside, &[f.host.join(".npmrc")]).unwrap();
    let c = OutsideChanges::read(&f.outside).unwrap();
    assert_eq!(c.changes.len(), 2, "{:?}", c.changes);
    assert!(c.changes.iter().all(|c| c.host_hidden));
    let lines = c.lines(Some(&f.host));
    assert!(
        lines.contains(&"M ~/.npmrc (over a credential hidden from the command)".to_string()),
        "{lines:?}"
    );
    let d = c.diff(Some(&f.host));
    assert!(!d.contains("HOST-TOKEN"), "{d}");
    assert!(d.contains("+mine") && d.contains("+\ty = z"), "{d}");
}

/// The directories bwrap made as mount points of hidden directories (deleted on the host
/// after the command's start found them) are not listed; a directory the command added
/// beside or inside such a chain is.
#[test]
fn mount_points_of_hidden_directories_are_not_changes() {
    let added = |p: &str, is_dir: bool| OutsideChange {
        path: PathBuf::from(p),
        kind: OutsideKind::Added,
        is_dir,
        size_old: None,
        mode_old: None,
        owner_old: None,
        target_old: None,
        size_new: None,
        mode_new: None,
        owner_new: None,
        target_new: None,
        foreign_owner: false,
        upper: None,
        redirected: false,
        metacopy: false,
        xattrs_changed: false,
        kept: false,
        host_hidden: false,
    };
    let hidden = vec![
        PathBuf::from("/var/tmp/t1/state"),
        PathBuf::from("/var/tmp/t2/state"),
    ];
    let mut changes = vec![
        added("/var/tmp/t1", true),
        added("/var/tmp/t1/state", true),
        added("/var/tmp/t2", true),
        added("/var/tmp/t2/mine.txt", false),
        added("/var/tmp/t2/state", true),
        added("/var/tmp/other", true),
    ];
    drop_mount_points(&mut changes, &hidden);
    let left: Vec<&str> = changes.iter().map(|c| c.path.to_str().unwrap()).collect();
    assert_eq!(
        left,
        ["/var/tmp/t2", "/var/tmp/t2/mine.txt", "/var/tmp/other"],
        "{left:?}"
    );
}

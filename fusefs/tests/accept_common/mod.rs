//! Helpers shared by the accept tests: a project + state dir in a temp dir, plan builders,
//! and a byte-exact snapshot of a tree.
#![allow(clippy::unwrap_used, dead_code)]

use shade_fusefs::{Base, Perms, PlanOp, StateDir};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// One object of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Dir(u32),
    File(Vec<u8>, u32),
    Link(PathBuf),
}

/// Every object under `root` (not `root` itself), by relative path.
pub type Snap = BTreeMap<PathBuf, Entry>;

pub fn snapshot(root: &Path) -> Snap {
    let mut out = Snap::new();
    walk(root, Path::new(""), &mut out);
    out
}

fn walk(root: &Path, rel: &Path, out: &mut Snap) {
    let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for n in names {
        let p = rel.join(&n);
        let full = root.join(&p);
        let m = std::fs::symlink_metadata(&full).unwrap();
        let mode = m.permissions().mode() & 0o7777;
        if m.file_type().is_symlink() {
            out.insert(p, Entry::Link(std::fs::read_link(&full).unwrap()));
        } else if m.is_dir() {
            out.insert(p.clone(), Entry::Dir(mode));
            walk(root, &p, out);
        } else {
            out.insert(p, Entry::File(std::fs::read(&full).unwrap(), mode));
        }
    }
}

/// Create `snap` under `root` (parents before children: BTreeMap order guarantees it).
pub fn materialize(root: &Path, snap: &Snap) {
    for (p, e) in snap {
        let full = root.join(p);
        match e {
            Entry::Dir(_) => std::fs::create_dir(&full).unwrap(),
            Entry::File(b, mode) => {
                std::fs::write(&full, b).unwrap();
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
            Entry::Link(t) => std::os::unix::fs::symlink(t, &full).unwrap(),
        }
    }
    // Directory modes last, so a 0500 dir does not block creating its children.
    for (p, e) in snap.iter().rev() {
        if let Entry::Dir(mode) = e {
            std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(*mode)).unwrap();
        }
    }
}

/// A project dir, a state dir and a place for branch contents, all in one temp dir.
pub struct Env {
    /// Owns (and on drop removes) `dir`, unless the env was opened on an existing dir.
    pub tmp: Option<tempfile::TempDir>,
    pub dir: PathBuf,
    pub root: PathBuf,
    pub state: StateDir,
    contents: PathBuf,
    next: usize,
}

impl Env {
    pub fn new() -> Env {
        Self::in_dir(tempfile::tempdir().unwrap())
    }

    pub fn in_dir(tmp: tempfile::TempDir) -> Env {
        let mut env = Self::at_existing(tmp.path());
        env.tmp = Some(tmp);
        env
    }

    /// An env on a dir another process prepared (not removed on drop).
    pub fn at_existing(dir: &Path) -> Env {
        let root = dir.join("project");
        let contents = dir.join("contents");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&contents).unwrap();
        let state = StateDir::at(dir.join("state"));
        Env {
            tmp: None,
            dir: dir.to_path_buf(),
            root,
            state,
            contents,
            next: 0,
        }
    }

    /// The base a branch would record for `p` now.
    pub fn base(&self, p: &str) -> Base {
        Base::observe(&self.root.join(p)).unwrap()
    }

    pub fn write(&mut self, p: &str, data: &[u8], mode: u32, base: Base) -> PlanOp {
        self.next += 1;
        let cp = self.contents.join(self.next.to_string());
        std::fs::File::create(&cp).unwrap().write_all(data).unwrap();
        let content = std::fs::File::open(&cp).unwrap();
        PlanOp::WriteFile {
            path: p.into(),
            content,
            perms: perms(mode),
            base,
            base_at: None,
        }
    }

    /// Nothing of accept's own is left: no scratch entries in the project, no journals.
    pub fn assert_clean(&self) {
        for p in snapshot(&self.root).keys() {
            assert!(
                !p.iter().any(|c| c.to_string_lossy().starts_with(".shade-")),
                "accept left {} in the project",
                p.display()
            );
        }
        if let Ok(rd) = std::fs::read_dir(self.state.journals()) {
            let left: Vec<_> = rd.map(|e| e.unwrap().file_name()).collect();
            assert!(left.is_empty(), "journals left: {left:?}");
        }
    }
}

pub fn perms(mode: u32) -> Perms {
    Perms {
        mode,
        ..Perms::default()
    }
}

pub fn file(data: &str, mode: u32) -> Entry {
    Entry::File(data.as_bytes().to_vec(), mode)
}

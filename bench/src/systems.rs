//! The systems under test and how each one shows the project: natively, as a shade
//! branch, through kernel overlayfs, through fuse-overlayfs — and, for branch creation
//! only, as a full copy (`cp -r`, `cp -r --reflink=auto`) or a `git worktree add`.

use crate::timing::run;
use crate::tree::Layout;
use anyhow::{Context, Result};
use nix::mount::MsFlags;
use shade_fusefs::{Branch, BranchOptions, StateDir};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A way of giving a process a writable view of the project.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Native,
    Shade,
    /// A shade branch after `Branch::warm_up` finished (a speculation's branch, made ahead).
    ShadeWarmed,
    KernelOverlay,
    FuseOverlayfs,
    /// BranchFS (`cargo install branchfs`): a FUSE branching filesystem for agents.
    BranchFs,
    CpR,
    CpReflink,
    GitWorktree,
}

impl System {
    /// Systems that give a live view (file operations are measured on these).
    pub const VIEWS: [System; 4] = [
        System::Native,
        System::Shade,
        System::KernelOverlay,
        System::FuseOverlayfs,
    ];
    /// Systems whose creation time is compared.
    pub const CREATORS: [System; 6] = [
        System::Shade,
        System::KernelOverlay,
        System::FuseOverlayfs,
        System::CpR,
        System::CpReflink,
        System::GitWorktree,
    ];

    /// Name in the report and JSON.
    pub fn name(self) -> &'static str {
        match self {
            System::Native => "native",
            System::Shade => "shade",
            System::ShadeWarmed => "shade, warmed up",
            System::KernelOverlay => "kernel overlayfs",
            System::FuseOverlayfs => "fuse-overlayfs",
            System::BranchFs => "BranchFS",
            System::CpR => "cp -r",
            System::CpReflink => "cp -r --reflink=auto",
            System::GitWorktree => "git worktree add",
        }
    }
}

/// shade branch options used throughout, so every measure sees the same configuration.
pub fn shade_options(layout: &Layout, threads: usize) -> BranchOptions {
    BranchOptions {
        state: StateDir::at(layout.state.clone()),
        memory_budget: 256 << 20,
        allow_other: false,
        threads,
        id_shift: None,
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh, empty directory under the scratch area (upper/work dirs, mount points, copies).
pub fn scratch(layout: &Layout, what: &str) -> Result<PathBuf> {
    let p = layout
        .work
        .join(format!("{what}-{}", SEQ.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
    Ok(p)
}

/// One live instance of a system over a source directory. Dropping it tears it down.
pub struct Instance {
    pub system: System,
    root: PathBuf,
    branch: Option<Branch>,
    mounted: Option<PathBuf>,
    /// Directories to delete on teardown (uppers, copies).
    owned: Vec<PathBuf>,
    git_dir: Option<PathBuf>,
    /// BranchFS's storage dir (its daemon's socket), for `branchfs unmount`.
    branchfs_storage: Option<PathBuf>,
}

impl Instance {
    /// Where processes see the project through this instance.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Bring `system` up over `src`. This is exactly the part branch creation times.
    pub fn create(
        system: System,
        src: &Path,
        layout: &Layout,
        prepared: Prepared,
        threads: usize,
    ) -> Result<Instance> {
        let mut inst = Instance {
            system,
            root: src.to_path_buf(),
            branch: None,
            mounted: None,
            owned: prepared.owned,
            git_dir: None,
            branchfs_storage: None,
        };
        match system {
            System::Native => {}
            System::Shade | System::ShadeWarmed => {
                let b = Branch::create(src, &shade_options(layout, threads))
                    .with_context(|| format!("creating a shade branch of {}", src.display()))?;
                if system == System::ShadeWarmed {
                    b.warm_up().context("starting the warm-up walk")?;
                    while !b.warmed() {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
                inst.root = b.mountpoint().to_path_buf();
                inst.branch = Some(b);
            }
            System::KernelOverlay => {
                let data = overlay_opts(src, &prepared.upper, &prepared.work);
                nix::mount::mount(
                    Some("overlay"),
                    &prepared.target,
                    Some("overlay"),
                    MsFlags::empty(),
                    Some(data.as_str()),
                )
                .with_context(|| format!("mount -t overlay -o {data}"))?;
                inst.root = prepared.target.clone();
                inst.mounted = Some(prepared.target);
            }
            System::FuseOverlayfs => {
                let data = overlay_opts(src, &prepared.upper, &prepared.work);
                run(
                    "fuse-overlayfs",
                    &[
                        OsStr::new("-o"),
                        OsStr::new(&data),
                        prepared.target.as_os_str(),
                    ],
                )?;
                inst.root = prepared.target.clone();
                inst.mounted = Some(prepared.target);
            }
            System::BranchFs => {
                // Its daemon mounts the base on `main`; a new branch is what an agent gets.
                let storage = prepared.upper.clone();
                let st = [OsStr::new("--storage"), storage.as_os_str()];
                let mut mount = vec![OsStr::new("mount"), OsStr::new("--base"), src.as_os_str()];
                mount.extend(st);
                mount.push(prepared.target.as_os_str());
                run("branchfs", &mount)?;
                inst.root = prepared.target.clone();
                inst.mounted = Some(prepared.target.clone());
                inst.branchfs_storage = Some(storage.clone());
                let mut create = vec![
                    OsStr::new("create"),
                    OsStr::new("bench"),
                    prepared.target.as_os_str(),
                ];
                create.extend(st);
                run("branchfs", &create)?;
            }
            System::CpR | System::CpReflink => {
                let mut args = vec![OsStr::new("-r")];
                if system == System::CpReflink {
                    args.push(OsStr::new("--reflink=auto"));
                }
                args.push(src.as_os_str());
                args.push(prepared.target.as_os_str());
                run("cp", &args)?;
                inst.root = prepared.target;
            }
            System::GitWorktree => {
                let git_dir = prepared
                    .git_dir
                    .context("git worktree needs the source's git dir")?;
                run(
                    "git",
                    &[
                        OsStr::new("--git-dir"),
                        git_dir.as_os_str(),
                        OsStr::new("worktree"),
                        OsStr::new("add"),
                        OsStr::new("-q"),
                        OsStr::new("--detach"),
                        prepared.target.as_os_str(),
                        OsStr::new("HEAD"),
                    ],
                )?;
                inst.root = prepared.target;
                inst.git_dir = Some(git_dir);
            }
        }
        Ok(inst)
    }

    /// Changes in the shade branch's changeset (`None` for other systems): a read-only
    /// command must leave none.
    pub fn changes(&self) -> Option<usize> {
        self.branch
            .as_ref()
            .map(|b| b.changeset(false).changes.len())
    }

    /// Tear down: unmount, remove the worktree, delete copies and uppers.
    pub fn close(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        drop(self.branch.take());
        if let (Some(storage), Some(m)) = (self.branchfs_storage.take(), &self.mounted) {
            // Lets its daemon exit with its last mount; the unmount below is the fallback.
            let _ = run(
                "branchfs",
                &[
                    OsStr::new("unmount"),
                    m.as_os_str(),
                    OsStr::new("--storage"),
                    storage.as_os_str(),
                ],
            );
            let still = crate::mounts::mounts_under(m).map_or(true, |l| l.iter().any(|p| p == m));
            if !still {
                self.mounted = None;
            }
        }
        if let Some(m) = self.mounted.take() {
            if nix::mount::umount2(&m, nix::mount::MntFlags::empty()).is_err() {
                nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH)
                    .with_context(|| format!("unmounting {}", m.display()))?;
            }
        }
        if let Some(g) = self.git_dir.take() {
            run(
                "git",
                &[
                    OsStr::new("--git-dir"),
                    g.as_os_str(),
                    OsStr::new("worktree"),
                    OsStr::new("remove"),
                    OsStr::new("--force"),
                    self.root.as_os_str(),
                ],
            )?;
        }
        for d in self.owned.drain(..) {
            std::fs::remove_dir_all(&d).with_context(|| format!("removing {}", d.display()))?;
        }
        Ok(())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("bench: tearing down {}: {e:#}", self.system.name());
        }
    }
}

/// Directories made ready before a creation is timed, so only the creation itself is.
pub struct Prepared {
    target: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    git_dir: Option<PathBuf>,
    owned: Vec<PathBuf>,
}

impl Prepared {
    /// Scratch dirs for `system`; `git_dir` is the repo whose worktree `src` is.
    pub fn new(system: System, layout: &Layout, git_dir: Option<&Path>) -> Result<Prepared> {
        let mut p = Prepared {
            target: PathBuf::new(),
            upper: PathBuf::new(),
            work: PathBuf::new(),
            git_dir: git_dir.map(Path::to_path_buf),
            owned: Vec::new(),
        };
        match system {
            System::Native | System::Shade | System::ShadeWarmed => {}
            System::KernelOverlay | System::FuseOverlayfs | System::BranchFs => {
                let d = scratch(layout, "overlay")?;
                for (sub, slot) in [
                    ("upper", &mut p.upper),
                    ("work", &mut p.work),
                    ("mnt", &mut p.target),
                ] {
                    *slot = d.join(sub);
                    std::fs::create_dir(&*slot)?;
                }
                p.owned.push(d);
            }
            System::CpR | System::CpReflink => {
                let d = scratch(layout, "copy")?;
                p.target = d.join("tree");
                p.owned.push(d);
            }
            System::GitWorktree => {
                let d = scratch(layout, "worktree")?;
                p.target = d.join("tree");
                p.owned.push(d);
            }
        }
        Ok(p)
    }
}

fn overlay_opts(lower: &Path, upper: &Path, work: &Path) -> String {
    format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    )
}

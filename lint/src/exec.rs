//! Running a checker inside a branch, at the project's real path: each process runs in the
//! branch sandbox (bubblewrap: the branch mount bound over the project directory, shade
//! and the real tree out of reach), so absolute paths (compile databases, venvs, cargo's
//! target dir) resolve into the branch and nothing can write through to the real tree. Batch checkers run through the
//! sandbox runner ([`shade_fusefs::sandbox`]); language servers, which live on and speak
//! over their stdio, are started by [`command`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use shade_fusefs::rootdir::RootDir;

/// A branch as a checker needs it: the real project path and where the branch is mounted.
#[derive(Clone)]
pub struct BranchView {
    /// Canonical real project directory (what processes see).
    pub project: PathBuf,
    /// The branch's mount point (what is bound over `project`).
    pub mount: PathBuf,
    /// Who runs batch checkers in it; `None`: the plain sandbox (branch bound at the
    /// project path, nothing more).
    pub runner: Option<std::sync::Arc<dyn Runner>>,
}

/// Runs a batch checker's command the way its branch's owner runs commands: an agent's
/// shadow applies its own sandbox (network, read-only rest, throw-away build caches) and
/// kills the command when the shadow closes.
pub trait Runner: Send + Sync {
    /// Run `spec` (project, mount, cwd, argv, env, output and timeout already set) to its
    /// end; `Err` is the runner's own failure.
    fn run(
        &self,
        spec: shade_fusefs::sandbox::RunSpec,
    ) -> Result<shade_fusefs::sandbox::RunOutcome, String>;
}

/// The plain sandbox, stoppable: a linter's own background runs, killed when it goes.
pub struct Stoppable(pub shade_fusefs::sandbox::Cancel);

impl Runner for Stoppable {
    fn run(
        &self,
        spec: shade_fusefs::sandbox::RunSpec,
    ) -> Result<shade_fusefs::sandbox::RunOutcome, String> {
        let o =
            shade_fusefs::sandbox::run_cancellable(&spec, &self.0).map_err(|e| e.to_string())?;
        if o.termination == shade_fusefs::sandbox::Termination::Cancelled {
            return Err("stopped: the linter is shutting down".into());
        }
        Ok(o)
    }
}

impl std::fmt::Debug for BranchView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BranchView")
            .field("project", &self.project)
            .field("mount", &self.mount)
            .field("runner", &self.runner.is_some())
            .finish()
    }
}

impl PartialEq for BranchView {
    fn eq(&self, other: &Self) -> bool {
        self.project == other.project && self.mount == other.mount
    }
}

impl Eq for BranchView {}

impl BranchView {
    /// The view of a live branch.
    pub fn of(branch: &shade_fusefs::Branch) -> BranchView {
        BranchView {
            project: branch.project().to_path_buf(),
            mount: branch.mountpoint().to_path_buf(),
            runner: None,
        }
    }

    /// The view of a branch the branch server may have made (`shade lint`'s own branches:
    /// a served one's mount is the server's, seen in this mount namespace).
    pub fn of_run(branch: &shade_fusefs::served::RunBranch) -> BranchView {
        BranchView {
            project: branch.project().to_path_buf(),
            mount: branch.mountpoint().to_path_buf(),
            runner: None,
        }
    }

    /// The branch's files, reached only beneath a descriptor of its mount: a checker or
    /// language server ran in the branch and may have made any directory a link to the
    /// host, so shade never opens a path in it by name.
    pub fn files(&self) -> std::io::Result<RootDir> {
        RootDir::open(&self.mount)
    }

    /// The content of project-relative `rel` in the branch.
    pub fn read(&self, rel: &str) -> std::io::Result<Vec<u8>> {
        self.files()?.read(Path::new(rel))
    }

    /// Write project-relative `rel` in the branch (`None`: remove it), making its
    /// directories as needed.
    pub fn put(&self, rel: &str, content: Option<&[u8]>) -> std::io::Result<()> {
        let files = self.files()?;
        let rel = Path::new(rel);
        match content {
            Some(bytes) => {
                if let Some(dir) = rel.parent() {
                    files.create_dir_all(dir)?;
                }
                files.write(rel, bytes)
            }
            None => files.remove_file(rel),
        }
    }
}

/// What a finished checker process left.
#[derive(Debug, Clone)]
pub struct Output {
    /// Exit status (`None`: killed by a signal).
    pub status: Option<i32>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Killed because the deadline passed.
    pub timed_out: bool,
}

/// The sandbox a long-lived process (a language server) gets on top of the plain one:
/// the default is the plain sandbox; an agent session's linter asks for the speculation
/// sandbox ([`Confinement::speculative`]).
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    /// The extra isolation (its time limit is not used: the process lives on).
    pub isolation: shade_fusefs::sandbox::Isolation,
    /// Writable throw-away branches bound over build caches outside the project.
    pub binds: Vec<shade_fusefs::sandbox::Bind>,
}

impl Confinement {
    /// Network off, private /tmp, the rest of the file system read-only but for `binds`
    /// (throw-away branches of the build caches): what a speculated command gets.
    pub fn speculative(binds: Vec<shade_fusefs::sandbox::Bind>) -> Confinement {
        let mut isolation = shade_fusefs::sandbox::Isolation::speculative(Duration::ZERO);
        isolation.limits.time_limit = None;
        // A language server holds the whole project's index (rust-analyzer: GiBs, and more
        // address space than that): `shade run`'s memory, not a speculated command's.
        isolation.limits.memory = shade_fusefs::sandbox::Limits::run().memory;
        Confinement { isolation, binds }
    }
}

/// A command prepared to start inside `view` at `cwd` (an absolute path in the project),
/// confined by the same sandbox as every other command in a branch
/// ([`shade_fusefs::sandbox::command`]) and `confine`: it gets its own process group, and
/// killing it kills everything it started. Stdio is left to the caller. Refused where the
/// sandbox cannot be had.
pub fn command(
    view: &BranchView,
    argv: &[String],
    cwd: &Path,
    confine: &Confinement,
) -> std::io::Result<Command> {
    if argv.is_empty() {
        return Err(std::io::Error::other("empty command"));
    }
    let mut spec = shade_fusefs::sandbox::RunSpec::new(
        view.project.clone(),
        view.mount.clone(),
        cwd.to_path_buf(),
        argv.iter().map(Into::into).collect(),
    );
    spec.env = UNSET.iter().map(|k| (k.into(), None)).collect();
    spec.isolation = confine.isolation;
    // The rest of the file system read-only whoever runs it ([`READ_ONLY_REST`]).
    spec.isolation.read_only = READ_ONLY_REST;
    spec.binds = confine.binds.clone();
    shade_fusefs::sandbox::command(&spec).map_err(|e| std::io::Error::other(e.to_string()))
}

/// A checker runs the project's code (build scripts, proc macros, plugins) on an edit
/// nobody accepted: nothing outside the branch is its to write. Root's sandbox without an
/// outside layer was read-only already (root's view); a plain user's bound the host's `/`
/// read-write, so a `build.rs` in a patch given to `shade lint` could write the user's
/// `~/.bashrc`.
const READ_ONLY_REST: bool = true;

/// Variables never passed to a checker: `CARGO_TARGET_DIR` would send the branch's build
/// output out of the branch (into the user's own target directory).
const UNSET: &[&str] = &["CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR"];

/// Bytes of each output stream kept (cargo's JSON for a large workspace is many MiB; the
/// parsers need all of it).
const CAPTURE_CAP: usize = 512 << 20;

/// Run `argv` in `view` at `cwd` with `env` added, through the sandbox runner: captured
/// output, the whole process group (and anything left in the mount namespace) killed at
/// `deadline`.
pub fn run(
    view: &BranchView,
    argv: &[String],
    cwd: &Path,
    env: &[(String, String)],
    deadline: Option<Instant>,
) -> Result<Output, String> {
    use shade_fusefs::sandbox::{self, Output as Streams, RunSpec, Termination};
    let mut spec = RunSpec::new(
        view.project.clone(),
        view.mount.clone(),
        cwd.to_path_buf(),
        argv.iter().map(Into::into).collect(),
    );
    spec.output = Streams::Capture { cap: CAPTURE_CAP };
    // An agent session's runner sets its own sandbox over this; `shade lint`'s runs keep it.
    spec.isolation.read_only = READ_ONLY_REST;
    spec.timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    spec.env = UNSET
        .iter()
        .map(|k| (k.into(), None))
        .chain(env.iter().map(|(k, v)| (k.into(), Some(v.into()))))
        .collect();
    let o = match &view.runner {
        Some(r) => r.run(spec)?,
        None => sandbox::run(&spec).map_err(|e| e.to_string())?,
    };
    let text = |c: &Option<sandbox::Captured>| c.as_ref().map(|c| c.text()).unwrap_or_default();
    let (status, timed_out) = match &o.termination {
        Termination::Exited(c) => (Some(*c), false),
        Termination::TimedOut => (None, true),
        Termination::CannotExec(m) => return Err(m.clone()),
        _ => (None, false),
    };
    Ok(Output {
        status,
        stdout: text(&o.stdout),
        stderr: text(&o.stderr),
        timed_out,
    })
}

/// Whether `prog` can be found on `PATH` (or is a path to an executable).
pub fn on_path(prog: &str) -> bool {
    which(prog).is_some()
}

/// Where `prog` is on `PATH`.
pub fn which(prog: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if prog.contains('/') {
        return exec(Path::new(prog)).then(|| PathBuf::from(prog));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(prog))
        .find(|p| exec(p))
}

/// A deadline `secs` from now, if given.
pub fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now() + t)
}

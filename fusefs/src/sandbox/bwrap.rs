//! The confined runner: every command goes through bubblewrap (`bwrap`), the sandbox
//! Claude Code and Codex use, instead of namespace code of our own.
//!
//! What a command gets, whoever runs shade:
//! - a user namespace: as a plain user bwrap's own (`--unshare-user`, our uid mapped to
//!   itself, no capabilities); as root one made once per process with the identity map of
//!   every id we have (so files of other users in a root's project stay writable through
//!   the branch), entered before bwrap starts. Its root keeps capabilities inside that
//!   namespace only, minus CAP_SYS_ADMIN: nothing counts on the host's namespaces.
//! - a PID namespace with a fresh `/proc` (shade and every outside process invisible), torn
//!   down with everything in it when the command ends or shade dies (`--die-with-parent`);
//! - a minimal `/dev` (no disks), a private `/dev/shm`, a private IPC namespace with its
//!   SysV IPC and POSIX message queue limits set from the memory limit (see ipc.rs), `/sys`
//!   read-only, shade's state directories hidden under an empty tmpfs;
//! - a seccomp allowlist (unlisted calls ENOSYS; mount, namespaces, kernel keyrings, bpf,
//!   io_uring, module loading, terminal injection, file handles, … EPERM: see `seccomp`)
//!   and no_new_privs.
//!
//! Where any of that cannot be had, [`probe`] says why and confined runs are refused.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::outside::{self, Outside, RootStage, RootUnit, View};
use super::{child, Result, RunSpec, SandboxError};

/// What this machine gives a confined command (see [`probe`]).
#[derive(Debug)]
pub struct Confinement {
    /// The bubblewrap binary.
    pub bwrap: PathBuf,
    /// As root: the user namespace with our identity map that bwrap starts in.
    userns: Option<OwnedFd>,
    /// As root: the user namespace the host's files are idmapped through for the command's
    /// view of them (see [`view_userns`]): host root and the invoking user only.
    view_userns: Option<OwnedFd>,
    /// As root: the host id the command's root is (its namespace maps `0..65536` there).
    root_base: Option<u32>,
    /// The seccomp programs, compiled (classic BPF, native byte order).
    filters: Vec<Vec<u8>>,
    /// The read-only (speculative) sandbox's extra program: no unix sockets.
    read_only_filter: Vec<u8>,
    /// The Landlock ruleset every command enters (abstract unix sockets and signals scoped
    /// to the sandbox: see scope.rs); `None` where the kernel has no scopes.
    scope: Option<OwnedFd>,
}

impl Confinement {
    /// `bwrap --version` (asked on demand: it costs a process).
    pub fn version(&self) -> String {
        Command::new(&self.bwrap)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    /// Whether commands run as root inside their own user namespace (shade runs as root).
    pub fn root_userns(&self) -> bool {
        self.userns.is_some()
    }

    /// Whether commands are kept from host abstract unix sockets and from signalling
    /// outside their sandbox (Landlock scopes, Linux 6.12+).
    pub fn scoped(&self) -> bool {
        self.scope.is_some()
    }
}

static CONFINEMENT: OnceLock<std::result::Result<Confinement, String>> = OnceLock::new();
static STARTED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Whether commands can be confined here, found once per process by really starting one
/// (user namespaces can be refused by sysctls, AppArmor or a container's seccomp filter in
/// ways that only trying shows). `Err` is one line saying why and what to do.
pub fn probe() -> std::result::Result<&'static Confinement, &'static str> {
    let conf = confinement()?;
    STARTED
        .get_or_init(|| start_once(conf))
        .as_ref()
        .map(|()| conf)
        .map_err(String::as_str)
}

/// The parts of [`probe`] that start no sandbox (bwrap found, the user namespaces, seccomp
/// programs and Landlock ruleset made), for a caller about to start its command's sandbox
/// anyway: that start is the test, and a start that fails asks [`probe`] why (a sandbox
/// that cannot start never runs the command, so nothing is weaker for it; `shade run`
/// saves a whole sandbox start).
pub fn confinement() -> std::result::Result<&'static Confinement, &'static str> {
    CONFINEMENT
        .get_or_init(find_confinement)
        .as_ref()
        .map_err(String::as_str)
}

fn find_confinement() -> std::result::Result<Confinement, String> {
    // SHADE_BWRAP names another bubblewrap (or, in tests, a missing one).
    let bwrap = match std::env::var_os("SHADE_BWRAP").filter(|v| !v.is_empty()) {
        Some(path) => Some(PathBuf::from(path)).filter(|p| runnable(p)),
        None => which("bwrap"),
    };
    let bwrap = bwrap.ok_or_else(|| {
        "bubblewrap (`bwrap`) is not installed; install it (Debian/Ubuntu: apt install \
         bubblewrap), or run without a sandbox with `shade run --unconfined`"
            .to_string()
    })?;
    let root_base = nix::unistd::geteuid()
        .is_root()
        .then(super::ids::sandbox_base);
    let userns = if let Some(base) = root_base {
        Some(sandbox_userns(base).map_err(|e| {
            format!(
                "cannot create a user namespace ({e}): they are disabled here \
                 (user.max_user_namespaces, or a container's seccomp filter); allow them \
                 (see `shade doctor`) or use `shade run --unconfined` (no security boundary)"
            )
        })?)
    } else {
        None
    };
    let view_userns = match root_base {
        Some(base) => Some(view_userns(base).map_err(|e| {
            format!("cannot create the user namespace of root's view of the host ({e})")
        })?),
        None => None,
    };
    let filters = super::seccomp::programs()?;
    let read_only_filter = super::seccomp::read_only_program()?;
    let scope = super::scope::ruleset();
    Ok(Confinement {
        bwrap,
        userns,
        view_userns,
        root_base,
        filters,
        read_only_filter,
        scope,
    })
}

/// [`probe`]'s start of `true` in a sandbox.
fn start_once(conf: &Confinement) -> std::result::Result<(), String> {
    let true_bin = which("true").unwrap_or_else(|| PathBuf::from("/bin/true"));
    // Really start a sandbox once: AppArmor's restriction of unprivileged user namespaces
    // and friends only show there. bwrap remounts every mount it binds, and one that goes
    // away meanwhile (another branch closing) fails its set-up: that is tried again, as a
    // command's set-up is, rather than taken for "no sandbox here" for the whole process.
    let mut attempt = 0;
    loop {
        attempt += 1;
        match start_probe(conf, &true_bin) {
            Ok(()) => break,
            Err(msg) if attempt < super::SETUP_ATTEMPTS && mount_race(&msg) => {
                std::thread::sleep(std::time::Duration::from_millis((10 * attempt).min(50)));
            }
            Err(msg) => {
                return Err(format!(
                    "the sandbox cannot start here ({msg}); user namespaces are probably \
                     restricted (kernel.apparmor_restrict_unprivileged_userns=1, \
                     kernel.unprivileged_userns_clone=0, user.max_user_namespaces=0 or a \
                     container's seccomp filter); allow them (see `shade doctor`) or use \
                     `shade run --unconfined` (no security boundary)"
                ))
            }
        }
    }
    Ok(())
}

/// Start `true` in a sandbox once; bwrap's first line on stderr when it cannot.
fn start_probe(conf: &Confinement, true_bin: &Path) -> std::result::Result<(), String> {
    let (mut cmd, fds) = conf
        .base(&Layout::probe(), &[], &[true_bin.into()], Path::new("/"))
        .map_err(|e| e.to_string())?;
    let userns = conf.userns.as_ref().map(AsRawFd::as_raw_fd);
    let scope = conf.scope.as_ref().map(AsRawFd::as_raw_fd);
    let inherit: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: only async-signal-safe system calls on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let _fds = &fds;
            enter(userns, scope, &inherit, &[])
        });
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {}: {e}", conf.bwrap.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr);
    Err(msg
        .lines()
        .next()
        .unwrap_or("no message")
        .trim()
        .to_string())
}

/// Whether bwrap failed because a mount it was binding went away meanwhile.
fn mount_race(msg: &str) -> bool {
    msg.contains("Unable to apply mount flags") || msg.contains("Can't bind mount")
}

/// The argument that makes shade's binary the foreground helper ([`foreground_helper`]).
pub const FOREGROUND_HELPER_ARG: &str = "__shade-sandbox-foreground";

static HELPER: OnceLock<PathBuf> = OnceLock::new();

/// Names the binary that serves as [`foreground_helper`] (shade's own, whose `main` hands
/// [`FOREGROUND_HELPER_ARG`] to it). Without one, a foreground run on a terminal leaves the
/// terminal to bwrap's whole process group, so Ctrl-C kills the sandbox at once instead of
/// reaching the command.
pub fn set_foreground_helper(exe: PathBuf) {
    let _ = HELPER.set(exe);
}

/// Inside the sandbox, for a foreground run on a terminal: put the command in a process
/// group of its own and make it the terminal's foreground group, then exec it. Then Ctrl-C,
/// Ctrl-Z and Ctrl-\ reach the command alone, not bwrap's monitor (which any of them would
/// kill or stop, and the whole sandbox with it). Returns only on failure (exit status).
pub fn foreground_helper(argv: &[OsString]) -> i32 {
    let Some((prog, args)) = argv.split_first() else {
        eprintln!("shade: {FOREGROUND_HELPER_ARG}: no command");
        return super::EXIT_CANNOT_EXEC;
    };
    // SAFETY: setpgid(2) on ourselves.
    unsafe { libc::setpgid(0, 0) };
    child::take_tty();
    let err = Command::new(prog).args(args).exec();
    eprintln!("shade: {}: {err}", prog.to_string_lossy());
    super::EXIT_CANNOT_EXEC
}

/// Where things go in the command's file system.
struct Layout<'a> {
    read_only: bool,
    private_tmp: bool,
    network_off: bool,
    /// Directories hidden under an empty tmpfs (shade's state directories).
    hide: Vec<PathBuf>,
    /// (source, target) binds, writable, in order (the branch first).
    binds: Vec<(&'a Path, &'a Path)>,
    /// (source, target) of the directories shared for real (`SHADE_SHARE`), bound before
    /// the state directories are hidden.
    shared: Vec<(&'a Path, &'a Path)>,
    /// Files bound read-only last, (source, target) (the foreground helper).
    ro_files: Vec<(&'a Path, &'a Path)>,
    /// Sizes of the private /tmp and /dev/shm (`None`: the kernel's default).
    tmp_size: Option<u64>,
    shm_size: Option<u64>,
    /// As root: the sized tmpfs made in the stage for /tmp and /dev/shm, bound in place of
    /// bubblewrap's own (which cannot bound their inodes).
    tmp_source: Option<PathBuf>,
    shm_source: Option<PathBuf>,
    /// The command's devpts with its pty limit, made in the stage (root's or the plain
    /// user's: see outside::DevPts), bound over bubblewrap's own.
    pts_source: Option<PathBuf>,
    /// The branch's outside layer, in place of the host's `/`.
    outside: Option<&'a Outside>,
    /// bwrap starts in the command's IPC namespace already (made with its limits in the
    /// pre-exec hook, see ipc.rs): no `--unshare-ipc`.
    own_ipc: bool,
}

impl Layout<'_> {
    fn probe() -> Layout<'static> {
        Layout {
            read_only: true,
            private_tmp: true,
            network_off: true,
            hide: Vec::new(),
            binds: Vec::new(),
            shared: Vec::new(),
            ro_files: Vec::new(),
            tmp_size: None,
            shm_size: None,
            tmp_source: None,
            shm_source: None,
            pts_source: None,
            outside: None,
            own_ipc: false,
        }
    }
}

impl Confinement {
    /// The bwrap command for `argv` in `layout` at `cwd`, with `extra` options before the
    /// command, and the fds bwrap must inherit (the seccomp programs): the caller's
    /// pre-exec hook keeps them and calls [`enter`].
    fn base(
        &self,
        layout: &Layout,
        extra: &[OsString],
        argv: &[OsString],
        cwd: &Path,
    ) -> Result<(Command, Vec<OwnedFd>)> {
        let mut cmd = Command::new(&self.bwrap);
        cmd.args(["--die-with-parent", "--unshare-pid", "--unshare-cgroup-try"]);
        if !layout.own_ipc {
            cmd.arg("--unshare-ipc");
        }
        if self.userns.is_none() {
            cmd.arg("--unshare-user");
        } else {
            // Root inside its namespace keeps only what installing and building as root
            // needs ([`ROOT_CAPS`]: chown, override permissions, change ids, …) in its
            // bounding, permitted, effective and ambient sets. Never CAP_SYS_ADMIN (mount,
            // namespaces: the seccomp filter says the same), nor CAP_NET_ADMIN/NET_RAW
            // (links, traffic control, packet sockets in its own network namespace: the
            // kernel code most user-namespace escalations went through), nor
            // CAP_SYS_RESOURCE (the namespace's own limits, see `ids::limit_userns`).
            cmd.args(["--cap-drop", "ALL"]);
            for cap in ROOT_CAPS {
                cmd.args(["--cap-add", cap]);
            }
        }
        if layout.network_off {
            cmd.arg("--unshare-net");
        }
        // bwrap runs the mounts in argument order and takes every source from the old
        // root, so the branch can be bound after its state directory is hidden.
        match layout.outside {
            Some(outside) => outside_binds(&mut cmd, outside),
            None => {
                let root = if layout.read_only {
                    "--ro-bind"
                } else {
                    "--bind"
                };
                cmd.args([root, "/", "/"]);
            }
        }
        cmd.args([
            "--ro-bind",
            "/sys",
            "/sys",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ]);
        if let Some(source) = &layout.pts_source {
            // Over `--dev`'s devpts, which has no pty limit (its `/dev/ptmx` is a link to
            // `pts/ptmx`: this one). `--dev-bind`: device nodes work there.
            cmd.arg("--dev-bind").arg(source).arg("/dev/pts");
        }
        proc_knobs(&mut cmd);
        match &layout.shm_source {
            Some(source) => {
                cmd.arg("--bind").arg(source).arg("/dev/shm");
            }
            None => {
                cmd.args(["--perms", "1777"])
                    .args(super::limits::tmpfs_size(layout.shm_size))
                    .args(["--tmpfs", "/dev/shm"]);
            }
        }
        if layout.private_tmp || layout.read_only {
            match &layout.tmp_source {
                Some(source) => {
                    cmd.arg("--bind").arg(source).arg("/tmp");
                }
                None => {
                    cmd.args(["--perms", "1777"])
                        .args(super::limits::tmpfs_size(layout.tmp_size))
                        .args(["--tmpfs", "/tmp"]);
                }
            }
        }
        if layout.read_only {
            // The services' sockets (systemd, the session bus, docker, …) live under /run;
            // the read-only sandbox gets an empty one (see seccomp::read_only_program).
            cmd.args(["--perms", "0755", "--size", "4096", "--tmpfs", "/run"]);
        }
        for (source, target) in &layout.shared {
            cmd.arg("--bind").arg(source).arg(target);
        }
        // A hidden directory is an empty one, made read-only once everything is mounted
        // (below): a writable tmpfs there would hold whatever a command wrote, up to half
        // the machine's memory, past every limit.
        for dir in &layout.hide {
            cmd.args(["--perms", "0555", "--size", "4096", "--tmpfs"])
                .arg(dir);
        }
        for (source, target) in &layout.binds {
            cmd.arg("--bind").arg(source).arg(target);
        }
        for (source, target) in &layout.ro_files {
            cmd.arg("--ro-bind").arg(source).arg(target);
        }
        cmd.arg("--chdir").arg(cwd);
        let mut fds: Vec<OwnedFd> = Vec::new();
        let read_only = layout.read_only.then_some(&self.read_only_filter);
        for program in self.filters.iter().chain(read_only) {
            let fd =
                memfd_with(program).map_err(SandboxError::io("preparing the seccomp filter"))?;
            cmd.arg("--add-seccomp-fd").arg(fd.as_raw_fd().to_string());
            fds.push(fd);
        }
        cmd.args(extra);
        for dir in &layout.hide {
            cmd.arg("--remount-ro").arg(dir);
        }
        if layout.read_only {
            cmd.args(["--remount-ro", "/run"]);
        }
        if layout.outside.is_some_and(|o| o.rebuilt) {
            // The rebuilt `/` is the sandbox's own tmpfs: read-only once everything is
            // mounted on it, as the host's `/` would be.
            cmd.args(["--remount-ro", "/"]);
        }
        cmd.arg("--").args(argv);
        Ok((cmd, fds))
    }
}

/// The capabilities a root command keeps inside its user namespace (Docker's default set
/// minus CAP_NET_RAW and CAP_MKNOD): what `apt-get install`, `pip install` as root, dpkg's
/// maintainer scripts and builds in the branch use — chown and permission overrides on
/// their files, setuid/setgid to drop to a service user (apt's `_apt`), setting file
/// capabilities (stripped again by accept), signals to their own processes, chroot,
/// binding low ports in their own network namespace. Everything else is dropped from
/// every set, so a command can never get it back.
pub(crate) const ROOT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_SETFCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
];

/// The command's `/` from the outside layer: each unit's overlay over its path, in path
/// order, on top of a read-only `/` wherever no unit covers it.
fn outside_binds(cmd: &mut Command, outside: &Outside) {
    let root_unit = matches!(outside.views.first(),
        Some(View::Layer { path, .. } | View::ReadOnly(path) | View::Staged { path, .. })
            if path == Path::new("/"));
    if outside.ro_root || (!root_unit && !outside.rebuilt) {
        cmd.args(["--ro-bind", "/", "/"]);
    }
    if outside.rebuilt {
        // The plain user's rebuilt `/`, assembled whole in the stage (see
        // outside::RebuiltRoot): one recursive bind, never skipped (without it the
        // command's `/` would be bwrap's empty one).
        for view in &outside.views {
            if let View::Layer { path, merged } = view {
                cmd.arg("--bind").arg(merged).arg(path);
            }
        }
        return;
    }
    for view in &outside.views {
        match view {
            // -try: a mount or directory that went away since the layer was planned (another
            // program's temporary directory) is skipped rather than failing the sandbox.
            View::Layer { path, merged } => {
                cmd.arg("--bind-try").arg(merged).arg(path);
            }
            View::ReadOnly(path) => {
                cmd.arg("--ro-bind-try").arg(path).arg(path);
            }
            View::Staged { path, source } => {
                cmd.arg("--ro-bind-try").arg(source).arg(path);
            }
        }
    }
}

/// Whether `path` lies under one of `binds` (a cache branch) whose source shows it as
/// `how` says already: absent, or the sanitized copy (see `CacheBranches::create`).
fn masked_in_bind(binds: &[super::Bind], path: &Path, how: &super::masks::Masked) -> bool {
    let Some(source) = binds.iter().find_map(|b| {
        path.strip_prefix(&b.target)
            .ok()
            .filter(|rel| !rel.as_os_str().is_empty())
            .map(|rel| b.source.join(rel))
    }) else {
        return false;
    };
    match how {
        super::masks::Masked::Hidden => std::fs::symlink_metadata(&source).is_err(),
        super::masks::Masked::Copy(copy) => {
            // The branch is the commands' to change: no link followed, no FIFO waited on,
            // no more read than the copy.
            use std::io::Read;
            use std::os::unix::fs::OpenOptionsExt;
            let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&source)
            else {
                return false;
            };
            let mut now = Vec::new();
            f.metadata().is_ok_and(|m| m.is_file())
                && f.take(copy.len() as u64 + 1).read_to_end(&mut now).is_ok()
                && now == *copy
        }
    }
}

/// Host-wide knobs under /proc that must never be writable from a sandbox: a root inside
/// that a sysctl takes for the host's (identity-mapped ids) could set `kernel.core_pattern`
/// and have the kernel run a program as full root. bwrap covers /proc/irq and /proc/bus
/// itself but skips /proc/sys and /proc/sysrq-trigger when `access(W_OK)` says no, which
/// it does for a root without host capabilities even though the sysctl files accept it.
const PROC_READ_ONLY: [&str; 5] = [
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

/// What Docker masks: kernel memory, keys, timers and hardware details no build needs.
const MASKED_FILES: [&str; 5] = [
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/latency_stats",
];

/// Directories masked with an empty read-only tmpfs.
const MASKED_DIRS: [&str; 3] = ["/proc/acpi", "/proc/scsi", "/sys/firmware"];

/// After `--proc /proc` and `--ro-bind /sys /sys`: the knobs read-only (bound from the host's
/// proc, which shows the same sysctl tables), the masked paths hidden, where they exist.
fn proc_knobs(cmd: &mut Command) {
    for p in PROC_READ_ONLY {
        if Path::new(p).exists() {
            cmd.args(["--ro-bind", p, p]);
        }
    }
    for f in MASKED_FILES {
        if Path::new(f).exists() {
            cmd.args(["--ro-bind", "/dev/null", f]);
        }
    }
    for d in MASKED_DIRS {
        if Path::new(d).is_dir() {
            cmd.args(["--perms", "0555", "--tmpfs", d, "--remount-ro", d]);
        }
    }
}

/// In the child before exec: enter our user namespace (root) and the Landlock scopes
/// (`scope`), and let bwrap inherit the fds it is told about, rewound (they are read from
/// the start), and no other fd above stdio. Async-signal-safe.
fn enter(
    userns: Option<RawFd>,
    scope: Option<RawFd>,
    inherit: &[RawFd],
    keep_open: &[RawFd],
) -> io::Result<()> {
    // SAFETY: plain system calls on fds owned by the command.
    unsafe {
        if let Some(fd) = userns {
            if libc::setns(fd, libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Become the namespace's root: host uid 0 is not mapped there, so until now we
            // were nobody in it. No supplementary groups (root's would be host groups).
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(0, 0, 0) != 0
                || libc::setresuid(0, 0, 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        // Only the fds named here reach bwrap (and none reaches the command: bwrap closes
        // them before it execs the command).
        child::cloexec_inherited_fds();
        for &fd in inherit.iter().chain(keep_open) {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
        }
        for &fd in inherit {
            libc::lseek(fd, 0, libc::SEEK_SET);
        }
    }
    // Last, once every mount of the stage is made: the domain holds for bwrap and all
    // it starts.
    if let Some(fd) = scope {
        super::scope::restrict(fd)?;
    }
    Ok(())
}

/// A sealed-off in-memory file holding `data`, close-on-exec (the pre-exec hook lets bwrap
/// inherit it), positioned at its start.
fn memfd_with(data: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create(2) returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"shade-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd was just created and is ours.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(data)?;
    Ok(OwnedFd::from(file))
}

/// Every shade state dir on this machine the command could otherwise reach, not only its
/// run's: those the environment, the password database and the user's registry name
/// ([`crate::state::known_state_dirs`]), those of the branch mount and of each bind source
/// (`ROOT/branches/ID/mnt`), and those of every shade branch mounted in this namespace
/// (another shade's, with another state dir): its ROOT when marked ([`crate::state::MARKER`]),
/// else the branch's own directory (its `mnt`, `outside/`, `store/`), else the mount point.
/// Resolved, deduplicated, outermost only, none holding or inside the project.
fn state_dirs(spec: &RunSpec) -> Vec<PathBuf> {
    // Per place, what to hide in order of preference: the first that exists and neither
    // holds nor lies in the project (a branch of a branch: the project is a mount point
    // there, and that branch's siblings are still hidden).
    let mut options: Vec<Vec<PathBuf>> = crate::state::known_state_dirs()
        .into_iter()
        .map(|d| vec![d])
        .collect();
    let mounts = outside::branch_mounts()
        .into_iter()
        .map(|c| PathBuf::from(OsStr::from_bytes(c.as_bytes())));
    // The run's own branch and bind sources: their state dir, by its layout.
    for source in std::iter::once(&spec.mount).chain(spec.binds.iter().map(|b| &b.source)) {
        let root = source
            .parent()
            .filter(|_| source.file_name() == Some(OsStr::new("mnt")))
            .and_then(Path::parent)
            .filter(|b| b.file_name() == Some(OsStr::new("branches")))
            .and_then(Path::parent);
        options.extend(root.map(|r| vec![r.to_path_buf()]));
    }
    // Every shade branch mounted here, whoever's.
    for point in mounts {
        let branch = point
            .parent()
            .filter(|_| point.file_name() == Some(OsStr::new("mnt")))
            .map(Path::to_path_buf);
        let root = branch
            .as_deref()
            .and_then(Path::parent)
            .filter(|b| b.file_name() == Some(OsStr::new("branches")))
            .and_then(Path::parent)
            // Before the marker existed, a state dir was known by its layout alone.
            .filter(|r| {
                r.join(crate::state::MARKER).exists()
                    || branch.as_ref().is_some_and(|b| b.join("owner").exists())
            })
            .map(Path::to_path_buf);
        options.push(root.into_iter().chain(branch).chain([point]).collect());
    }
    let usable = |d: PathBuf| -> Option<PathBuf> {
        let d = std::fs::canonicalize(d).ok()?;
        let keep = d.is_dir()
            && d != Path::new("/")
            // Never hide what the command must see.
            && !spec.project.starts_with(&d)
            && !d.starts_with(&spec.project);
        keep.then_some(d)
    };
    let mut real: Vec<PathBuf> = options
        .into_iter()
        .filter_map(|alts| alts.into_iter().find_map(usable))
        .collect();
    real.sort();
    real.dedup();
    // Outermost only: a hidden directory's inside needs no mount of its own.
    let mut outer: Vec<PathBuf> = Vec::new();
    for d in real {
        if !outer.iter().any(|o| d.starts_with(o)) {
            outer.push(d);
        }
    }
    outer
}

/// The bwrap command that runs `spec` confined: its file system per
/// [`super::Isolation`], the branch bound over the project, state directories hidden. Its
/// stdio is left to the caller; it gets a process group of its own and the terminal when
/// `hand_tty`, else a session of its own without a controlling terminal (unless
/// [`RunSpec::user_session`]). With `status`, bwrap reports the sandbox's pid and the command's exit status
/// on that fd (`--json-status-fd`).
pub(crate) fn build(
    conf: &Confinement,
    spec: &RunSpec,
    hand_tty: bool,
    status: Option<OwnedFd>,
    cgroup: Option<&super::limits::Cgroup>,
) -> Result<Command> {
    let iso = &spec.isolation;
    // As root, bwrap is already the sandbox's root (an unprivileged host id): what it binds
    // is first bound into a stage made in the pre-exec hook (outside::RootStage), since the
    // branch mount and shade's binary may lie where only host root may pass.
    let mut stage = match conf.root_base {
        Some(_) => Some(RootStage {
            at: super::cstring(&stage_place())?,
            foreign: super::outside::branch_mounts(),
            ..RootStage::default()
        }),
        None => None,
    };
    let stage_at = stage_place();
    let mut staged = |source: &Path, name: String, file: bool| -> Result<PathBuf> {
        let Some(st) = stage.as_mut() else {
            return Ok(source.to_path_buf());
        };
        let to = stage_at.join(name);
        let c = super::cstring(&to)?;
        if file {
            st.files.push(c.clone());
        } else {
            st.dirs.push(c.clone());
        }
        st.binds.push((super::cstring(source)?, c, false, false));
        Ok(to)
    };
    let mut sources: Vec<PathBuf> = Vec::new();
    for (j, source) in std::iter::once(&spec.mount)
        .chain(spec.binds.iter().map(|b| &b.source))
        .enumerate()
    {
        sources.push(staged(source, format!("b{j}"), false)?);
    }
    // Directories the user shares with every command for real (SHADE_SHARE): not layered.
    let shared = shared_dirs(&spec.project);
    for (k, dir) in shared.iter().enumerate() {
        sources.push(staged(dir, format!("s{k}"), false)?);
    }
    let targets = std::iter::once(&spec.project)
        .chain(spec.binds.iter().map(|b| &b.target))
        .chain(shared.iter());
    let mut binds: Vec<(&Path, &Path)> = sources
        .iter()
        .map(PathBuf::as_path)
        .zip(targets.map(PathBuf::as_path))
        .collect();
    // Shared directories go under the hidden state directories (which may lie inside one).
    let shared_binds = binds.split_off(binds.len() - shared.len());
    // The helper is bound at its own path (a private /tmp or a hidden directory may hide
    // it otherwise), unless it lies in the project, where the branch already shows it.
    let mut rlimits = super::limits::rlimits(&iso.limits, conf.root_userns());
    // The memory limit is set on bwrap in the pre-exec hook (inherited by the command; no
    // namespace makes a difference to it): no helper to exec for it.
    let address_space = rlimits.address_space.take();
    let helper = HELPER
        .get()
        .filter(|_| hand_tty || !rlimits.is_empty())
        .filter(|h| !h.starts_with(&spec.project));
    let helper_source = match helper {
        Some(h) => Some(staged(h, "helper".into(), true)?),
        None => None,
    };
    let mut hide = state_dirs(spec);
    if let Some(dir) = &spec.outside {
        // The layer itself is never the command's to see (its uppers hold what other
        // commands wrote, and a lower's walk into them only meets overlayfs's traps).
        std::fs::create_dir_all(dir).map_err(SandboxError::io(format!(
            "creating the outside layer {}",
            dir.display()
        )))?;
        if let Ok(dir) = std::fs::canonicalize(dir) {
            // In a state directory inside the project, the branch hides it already.
            if !hide.iter().any(|h| dir.starts_with(h)) && !dir.starts_with(&spec.project) {
                hide.push(dir);
            }
        }
    }
    if let Some(dir) = &spec.outside {
        // bwrap makes a hidden directory's mount point where it is missing (deleted on the
        // host since it was found), in the layer's upper: not the command's doing.
        if let Err(e) = crate::outside::record_hidden(dir, &hide) {
            tracing::debug!("recording the hidden directories in {}: {e}", dir.display());
        }
    }
    // The home's credentials absent and its secret-bearing configuration sanitized, in a
    // mask layer of the outside layer's units (see masks.rs).
    let homes = super::env::homes();
    let hides =
        spec.env_policy == super::env::EnvPolicy::Agent || super::env::config().hide_credentials;
    let credentials = if hides {
        super::env::credential_paths(&homes, Some(&spec.project))
    } else {
        Vec::new()
    };
    let masks = match hides {
        true => super::masks::masks_of(&credentials, &homes, &spec.project),
        false => Vec::new(),
    };
    // Not where a bind (a cache branch, a shared directory) stands over the unit: those
    // are hidden by the last mounts below.
    let bound: Vec<&Path> = spec
        .binds
        .iter()
        .map(|b| b.target.as_path())
        .chain(shared.iter().map(PathBuf::as_path))
        .collect();
    let layer_masks: Vec<(PathBuf, super::masks::Masked)> = masks
        .iter()
        .filter(|(p, _)| !bound.iter().any(|b| p.starts_with(b)))
        .cloned()
        .collect();
    let mut outside = match &spec.outside {
        Some(dir) => Some(outside::prepare(
            dir,
            &hide,
            &spec.project,
            iso.private_tmp || iso.read_only,
            conf.root_base.map(|b| (b, stage_at.as_path())),
            iso.limits.outside_size,
            &layer_masks,
        )?),
        None => None,
    };
    if let (Some(st), Some(o)) = (stage.as_mut(), outside.as_mut()) {
        // The units' mount points in the stage, and read-only views staged like binds.
        for (k, view) in o.views.iter_mut().enumerate() {
            if let View::ReadOnly(path) = view {
                let to = stage_at.join(format!("r{k}"));
                let c = super::cstring(&to)?;
                if path.is_dir() {
                    st.dirs.push(c.clone());
                } else {
                    st.files.push(c.clone());
                }
                st.binds.push((super::cstring(path)?, c, true, true));
                *view = View::Staged {
                    path: path.clone(),
                    source: to,
                };
            }
        }
        if !o.root_units.is_empty() {
            // The empty lower of read-only units.
            st.dirs.push(RootUnit::empty_dir(&stage_at)?);
        }
        for u in o.root_units.drain(..) {
            st.dirs.push(u.idmapped_dir());
            st.dirs.push(u.merged_dir());
            st.units.push(u);
        }
    }
    if let (Some(st), None) = (stage.as_mut(), outside.as_ref()) {
        // No layer to write to: root's view of the host, read-only.
        let (unit, at) = RootUnit::read_only_root(&stage_at)?;
        st.dirs.push(unit.idmapped_dir());
        st.dirs.push(unit.merged_dir());
        st.dirs.push(RootUnit::empty_dir(&stage_at)?);
        st.units.push(unit);
        outside = Some(Outside {
            views: vec![View::Staged {
                path: PathBuf::from("/"),
                source: at,
            }],
            ro_root: false,
            rebuilt: false,
            stage: None,
            root_units: Vec::new(),
            masked: Vec::new(),
        });
    }
    crate::timing::mark("outside-planned");
    let mut user_stage = outside.as_mut().and_then(|o| o.stage.take());
    // The private /tmp and /dev/shm with a size are made in the stage (root's, or a plain
    // user's), their inodes bounded with it (one per 4 KiB, as the outside layer's):
    // bubblewrap's `--size` leaves tmpfs's default, about a million inodes per GiB of RAM,
    // in which a command keeps gigabytes of user extended attributes past the size.
    let plain = !nix::unistd::geteuid().is_root();
    let mut sized_tmpfs = |name: &str, size: Option<u64>| -> Result<Option<PathBuf>> {
        let Some(size) = size else {
            return Ok(None);
        };
        if plain {
            let st = match user_stage.as_mut() {
                Some(st) => st,
                None => user_stage.insert(outside::UserStage::bare(&stage_at)?),
            };
            let options = format!(
                "mode=1777,size={},nr_inodes={}",
                size.max(4096),
                (size / 4096).max(1024)
            );
            return st.add_tmpfs(name, &options).map(Some);
        }
        let (Some(st), Some(base)) = (stage.as_mut(), conf.root_base) else {
            return Ok(None);
        };
        let to = stage_at.join(name);
        let c = super::cstring(&to)?;
        st.dirs.push(c.clone());
        let options = format!(
            "mode=1777,size={},nr_inodes={},uid={base},gid={base}",
            size.max(4096),
            (size / 4096).max(1024)
        );
        st.tmpfs.push((
            c,
            std::ffi::CString::new(options)
                .map_err(|_| SandboxError::Invalid("tmpfs options".into()))?,
        ));
        Ok(Some(to))
    };
    let shm_source = sized_tmpfs("shm", iso.limits.shm_size)?;
    let tmp_source = if iso.private_tmp || iso.read_only {
        sized_tmpfs("tmp", iso.limits.tmp_size)?
    } else {
        None
    };
    // The command's own devpts, of at most its share of the host's ptys (see limits.rs),
    // made in the stage: host root's, or the plain user's user namespace.
    let ptys = iso.limits.ptys.unwrap_or_else(|| {
        let (l, _) = super::limits::bounded(&iso.limits, &super::limits::HostTables::read());
        l.ptys.unwrap_or(1)
    });
    let pts_source = if plain {
        let st = match user_stage.as_mut() {
            Some(st) => st,
            None => user_stage.insert(outside::UserStage::bare(&stage_at)?),
        };
        Some(st.add_devpts("pts", ptys)?)
    } else if let Some(st) = stage.as_mut() {
        let to = stage_at.join("pts");
        let c = super::cstring(&to)?;
        st.dirs.push(c.clone());
        st.devpts = Some(outside::DevPts::new(c, ptys)?);
        Some(to)
    } else {
        None
    };
    let layout = Layout {
        read_only: iso.read_only,
        private_tmp: iso.private_tmp,
        network_off: iso.network,
        hide,
        binds,
        shared: shared_binds,
        ro_files: helper_source
            .as_deref()
            .zip(helper.map(PathBuf::as_path))
            .into_iter()
            .collect(),
        tmp_size: iso.limits.tmp_size,
        shm_size: iso.limits.shm_size,
        tmp_source,
        shm_source,
        pts_source,
        outside: outside.as_ref(),
        own_ipc: true,
    };
    let argv: Vec<OsString> = match helper.filter(|_| hand_tty) {
        Some(h) => [h.as_os_str().to_os_string(), FOREGROUND_HELPER_ARG.into()]
            .into_iter()
            .chain(spec.argv.iter().cloned())
            .collect(),
        None => spec.argv.clone(),
    };
    let argv = limited_argv(rlimits, helper.map(PathBuf::as_path), argv);
    let status_raw = status.as_ref().map(AsRawFd::as_raw_fd);
    let mut extra: Vec<OsString> = match status_raw {
        Some(fd) => vec!["--json-status-fd".into(), fd.to_string().into()],
        None => Vec::new(),
    };
    let own_session = !hand_tty && !spec.user_session;
    if own_session {
        // bwrap starts the command in a session of its own too (we already made bwrap one
        // without a terminal: see the hook below).
        extra.push("--new-session".into());
    }
    // The last mounts, after every bind: the home's credentials hidden (see env.rs), then
    // the unix sockets the user allows (see sockets.rs), the real ones at their paths.
    let masked: Vec<PathBuf> = outside
        .as_ref()
        .map(|o| o.masked.clone())
        .unwrap_or_default();
    // The credentials no mask stands for (the system's, agents' sockets): see env.rs.
    for path in credentials
        .iter()
        .filter(|p| !masks.iter().any(|(m, _)| m == *p))
    {
        extra.extend(super::env::hide_one(path));
    }
    // What no mask layer covers (no unit, or a bind over it): hidden the old way, a
    // configuration file too rather than shown unsanitized.
    for (path, how) in masks.iter().filter(|(p, _)| !masked.contains(p)) {
        if masked_in_bind(&spec.binds, path, how) {
            continue;
        }
        extra.extend(super::env::hide_one(path));
    }
    let project_real =
        std::fs::canonicalize(&spec.project).unwrap_or_else(|_| spec.project.clone());
    let real_writes: Vec<&Path> = std::iter::once(project_real.as_path())
        .chain(shared.iter().map(PathBuf::as_path))
        .collect();
    for (k, sock) in super::sockets::present(&real_writes)
        .into_iter()
        .enumerate()
    {
        // Bound in the stage from the socket checked (see sockets::StagedSocket), then
        // bwrap binds that file at the socket's path.
        let real = sock.real.clone();
        let source = match stage.as_mut() {
            Some(st) => {
                let to = stage_at.join(format!("k{k}"));
                let c = super::cstring(&to)?;
                st.files.push(c.clone());
                st.sockets
                    .push(sock.staged(c).map_err(SandboxError::Invalid)?);
                to
            }
            None => {
                let st = match user_stage.as_mut() {
                    Some(st) => st,
                    None => user_stage.insert(outside::UserStage::bare(&stage_at)?),
                };
                st.add_socket(&format!("k{k}"), sock)?
            }
        };
        // Read-only (connect needs no write access to the mount): a writable one would let
        // the command chmod, chown or touch the host's socket for real.
        extra.extend(["--ro-bind".into(), source.into(), real.into()]);
    }
    let (mut cmd, filters) = conf.base(&layout, &extra, &argv, &spec.cwd)?;
    // The process limit's cgroup is entered first, while still host root.
    if let Some(cg) = cgroup {
        cg.enter_on_exec(&mut cmd);
    }
    // bwrap and the command get the filtered environment, nothing else of ours.
    cmd.env_clear()
        .envs(super::env::command_env(spec.env_policy))
        .env("PWD", &spec.cwd);
    for (key, value) in &spec.env {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    let userns = conf.userns.as_ref().map(AsRawFd::as_raw_fd);
    let view = conf.view_userns.as_ref().map(AsRawFd::as_raw_fd);
    let scope = conf.scope.as_ref().map(AsRawFd::as_raw_fd);
    let inherit: Vec<RawFd> = filters.iter().map(AsRawFd::as_raw_fd).collect();
    let keep_open: Vec<RawFd> = status_raw.into_iter().collect();
    // A plain user's command: a user namespace of its own whose limits bound what it takes
    // of the user's inotify instances, namespaces, … (root's has them: `sandbox_userns`).
    let own_ns = userns.is_none().then(|| {
        let uid = nix::unistd::geteuid();
        let gid = nix::unistd::getegid();
        (
            format!("{uid} {uid} 1\n").into_bytes(),
            format!("{gid} {gid} 1\n").into_bytes(),
            super::ids::userns_limits(false),
        )
    });
    let cpu = super::limits::CpuPriority::of(&iso.limits);
    let open_files = iso.limits.open_files;
    let queues = super::limits::QueueLimits::share();
    let ipc = super::ipc::IpcPlan::new(&iso.limits, conf.root_userns());
    // SAFETY: only async-signal-safe system calls on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let _fds = (&filters, &status);
            // First, while nothing has been unshared: inherited by bwrap and the command.
            cpu.apply()?;
            if let Some(n) = open_files {
                super::limits::set_open_files(n)?;
            }
            queues.apply()?;
            if own_session {
                child::detach_from_terminal()?;
            } else {
                if libc::setpgid(0, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if hand_tty {
                    child::take_tty();
                }
            }
            if let Some(stage) = &user_stage {
                stage.enter()?;
            }
            if let Some((uid_map, gid_map, limits)) = &own_ns {
                super::ids::own_userns(uid_map, gid_map, limits)?;
            }
            if let (Some(stage), Some(ns)) = (&stage, view) {
                stage.enter(ns)?;
            }
            enter(userns, scope, &inherit, &keep_open)?;
            // In the namespace bwrap starts in, with its capabilities there.
            ipc.enter()?;
            match address_space {
                Some(bytes) => super::limits::set_address_space(bytes),
                None => Ok(()),
            }
        });
    }
    child::die_with_parent(&mut cmd);
    Ok(cmd)
}

/// `SHADE_SHARE`: directories (`:`-separated, absolute) that every command of this shade
/// writes for real, past the outside layer — a test harness's meeting place with the
/// commands it starts, a build's output directory the user wants as it is written. Set by
/// whoever starts shade (commands cannot change shade's environment); one that is missing,
/// relative, `/`, or inside the project is ignored. One that holds the project is bound
/// before the branch, which covers the project in it.
fn shared_dirs(project: &Path) -> Vec<PathBuf> {
    let Some(v) = std::env::var_os("SHADE_SHARE") else {
        return Vec::new();
    };
    std::env::split_paths(&v)
        .filter(|p| p.is_absolute())
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.is_dir() && p != Path::new("/"))
        .filter(|p| !p.starts_with(project))
        .collect()
}

/// Where a root command's stage is built (a tmpfs mounted over it in the command's own mount
/// namespace): a directory every id may pass, which the sandbox's own `/dev` then hides.
fn stage_place() -> PathBuf {
    ["/dev/shm", "/run", "/tmp"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// `argv` behind the setting of `limits` (a plain user's process and memory limits), or
/// as it is when there are none or nothing at hand sets them (said once, in the log).
fn limited_argv(
    limits: super::limits::Rlimits,
    helper: Option<&Path>,
    argv: Vec<OsString>,
) -> Vec<OsString> {
    if limits.is_empty() {
        return argv;
    }
    match super::limits::rlimit_argv(limits, helper, argv.clone()) {
        Some(limited) => limited,
        None => {
            super::limits::warn_unenforced(
                "the process and memory limits",
                "neither shade's binary nor prlimit(1) can set them in the sandbox",
            );
            argv
        }
    }
}

/// What bwrap reports on its `--json-status-fd`.
pub(crate) struct Status {
    reader: BufReader<File>,
    /// The sandbox's PID namespace, held open so its inode number stays unique while we use it.
    pub pid_ns: Option<File>,
    /// The sandbox's user and mount namespaces, held open so that its private /tmp and
    /// /dev/shm can be looked at after the command ended (see limits::TmpfsProbe).
    pub user_mnt_ns: Option<(File, File)>,
}

impl Status {
    /// Reads the first report (sent once the namespaces exist); EOF if bwrap failed first.
    pub(crate) fn start(fd: OwnedFd) -> Status {
        let mut reader = BufReader::new(File::from(fd));
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let init_pid = json_field(&line, "child-pid").and_then(|p| i32::try_from(p).ok());
        let pid_ns_ino = json_field(&line, "pid-namespace");
        let pid_ns = init_pid
            .and_then(|pid| File::open(format!("/proc/{pid}/ns/pid")).ok())
            .filter(|f| {
                use std::os::unix::fs::MetadataExt;
                f.metadata().ok().map(|m| m.ino()) == pid_ns_ino
            });
        let user_mnt_ns = init_pid
            .zip(pid_ns_ino)
            .filter(|_| pid_ns.is_some())
            .and_then(|(pid, ino)| super::limits::namespaces_of(pid, ino));
        Status {
            reader,
            pid_ns,
            user_mnt_ns,
        }
    }

    /// The command's exit status once bwrap has ended; `None` when the command never ran
    /// (bwrap failed to set up or to exec it) or bwrap was killed.
    pub(crate) fn exit_code(&mut self) -> Option<i32> {
        let mut rest = String::new();
        let _ = self.reader.read_to_string(&mut rest);
        rest.lines()
            .find_map(|l| json_field(l, "exit-code"))
            .and_then(|c| i32::try_from(c).ok())
    }
}

/// The integer value of `"key": N` in one line of bwrap's JSON.
fn json_field(line: &str, key: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    v.get(key)?.as_u64()
}

/// A pipe for bwrap's status: (read end, write end), both close-on-exec.
pub(crate) fn status_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((r, w))
}

/// Why the command cannot be started, found before starting the sandbox (bwrap's own exec
/// failure looks like the command exiting 1): `argv[0]` as the command would look it up.
pub(crate) fn cannot_exec(spec: &RunSpec) -> Option<String> {
    let prog = spec.argv.first()?;
    let in_branch = |p: &Path| match p.strip_prefix(&spec.project) {
        Ok(rel) => spec.mount.join(rel),
        Err(_) => p.to_path_buf(),
    };
    let runnable = |p: &Path| {
        std::fs::metadata(in_branch(p))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let name = Path::new(prog);
    let found = if prog.as_bytes().contains(&b'/') {
        runnable(&spec.cwd.join(name))
    } else {
        let path = spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone().unwrap_or_default())
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        std::env::split_paths(&path).any(|d| runnable(&spec.cwd.join(d).join(name)))
    };
    (!found).then(|| {
        format!(
            "{}: {}",
            prog.to_string_lossy(),
            io::Error::from_raw_os_error(libc::ENOENT)
        )
    })
}

/// `prog` on `PATH`, else in /usr/bin or /bin.
fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(prog))
        .find(|p| runnable(p))
}

/// An executable file.
fn runnable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// As root: the sandbox's user namespace, mapping `0..65536` to the unprivileged host range
/// `base..base+65536` (see ids.rs), so that the command's root is nobody on the host: no
/// sysctl, no host file of root's, no capability that counts outside. Made by a child that
/// unshares and waits while we write its maps (a process may not write a map for itself
/// that names ids other than its own), then exits; we keep the namespace through an fd.
fn sandbox_userns(base: u32) -> io::Result<OwnedFd> {
    let map = format!("0 {base} {}\n", crate::idmap::RANGE).into_bytes();
    make_userns(map.clone(), map, super::ids::userns_limits(true))
}

/// As root: the user namespace through which the command's view of the host (the outside
/// layer's lowers, the read-only `/`, allowed sockets) is idmapped. It maps host root to
/// the command's root and the user who ran shade through sudo (`SUDO_UID`/`SUDO_GID`) to
/// themselves, and no other id: every other user's file shows as nobody's, and the kernel
/// grants no capability on an inode whose owner or group is unmapped, so the command's
/// root (CAP_DAC_OVERRIDE in its namespace) cannot read other users' homes, keys and
/// mail. Root's own secrets that remain (shadow, host keys) are hidden (env.rs).
fn view_userns(base: u32) -> io::Result<OwnedFd> {
    let map = |var: &str| -> Vec<u8> {
        let mut m = format!("0 {base} 1\n");
        let id = std::env::var(var)
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok());
        if let Some(id) = id.filter(|i| *i != 0 && *i < crate::idmap::RANGE) {
            m.push_str(&format!("{id} {} 1\n", base + id));
        }
        m.into_bytes()
    };
    make_userns(map("SUDO_UID"), map("SUDO_GID"), Vec::new())
}

/// A user namespace with `uid_map` and `gid_map` (host root writes them) and `limits`
/// set by its creator (see [`sandbox_userns`]).
fn make_userns(
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    limits: Vec<super::ids::NsLimit>,
) -> io::Result<OwnedFd> {
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (go_r, go_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: the child only makes async-signal-safe system calls (unshare, write, read,
    // _exit) on fds prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            // Our copy of the write end would keep the read below from ever seeing EOF.
            libc::close(go_w.as_raw_fd());
            let ok = [u8::from(libc::unshare(libc::CLONE_NEWUSER) == 0)];
            libc::write(ready_w.as_raw_fd(), ok.as_ptr().cast(), 1);
            let mut b = [0u8; 1];
            libc::read(go_r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
            // Mapped now: as the namespace's creator, set its limits (see
            // ids::userns_limits); exit 1 if they could not be.
            let code = i32::from(super::ids::write_limits(&limits).is_err());
            libc::_exit(code);
        }
    }
    drop(ready_w);
    drop(go_r);
    let result = (|| {
        let mut ok = [0u8; 1];
        File::from(ready_r).read_exact(&mut ok)?;
        if ok[0] != 1 {
            return Err(io::Error::other("unshare(CLONE_NEWUSER) was refused"));
        }
        std::fs::write(format!("/proc/{pid}/uid_map"), &uid_map)?;
        std::fs::write(format!("/proc/{pid}/gid_map"), &gid_map)?;
        Ok(OwnedFd::from(File::open(format!("/proc/{pid}/ns/user"))?))
    })();
    // The maps are written (or failed): let the child set the limits and go.
    if result.is_ok() {
        let _ = nix::unistd::write(&go_w, &[1]);
    }
    drop(go_w);
    let mut status: libc::c_int = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if result.is_ok() && !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(io::Error::other(
            "setting the sandbox namespace's limits (/proc/sys/user/max_*) failed",
        ));
    }
    result
}

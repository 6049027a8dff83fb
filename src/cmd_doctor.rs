//! `shade doctor`: what isolation this machine gives a command in a branch, and why — so a
//! user whose runs are refused learns the one setting to change.

use clap::Args;
use shade_fusefs::StateDir;
use std::path::Path;

#[derive(Args)]
pub struct DoctorArgs {}

/// One sysctl's value, or why there is none.
fn sysctl(path: &str) -> String {
    match std::fs::read_to_string(path) {
        Ok(v) => v.trim().to_string(),
        Err(_) => "absent".into(),
    }
}

/// A file's permission bits and whether we can open it read-write.
fn device(path: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(e) => format!("missing ({e})"),
        Ok(m) => {
            let usable = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .is_ok();
            format!(
                "mode {:o}, {}",
                m.permissions().mode() & 0o7777,
                if usable { "usable" } else { "not usable by us" }
            )
        }
    }
}

fn which(prog: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// This process's own seccomp mode (2: a container already filters our system calls).
fn own_seccomp() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mode = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(str::trim)
        .unwrap_or("?");
    match mode {
        "0" => "none on shade itself".into(),
        "2" => "shade itself runs under a filter (a container's)".into(),
        m => format!("mode {m}"),
    }
}

/// The limits in force per mode (built-in, or the config's `[sandbox.*]` tables), and how
/// the process and memory limits are enforced here.
fn print_limits(root: bool) {
    use shade_fusefs::sandbox::{bounded_limits, HostTables, Limits};
    // As the sandbox will enforce them: processes, open files and ptys bounded by this
    // host's tables (fs.file-max, kernel.pid_max, kernel.pty.*).
    let host = HostTables::read();
    let here = |l: Limits| bounded_limits(&l, &host).0.describe();
    println!("limits (shade run):   {}", here(Limits::run()));
    println!(
        "limits (speculation, shade mcp): {}",
        here(Limits::speculation())
    );
    println!(
        "host tables:          fs.file-max {}, fs.nr_open {}, tasks the host may still start {}, \
         ptys sandboxes may still open {} (kernel.pty.max less the reserve and those open)",
        host.file_max, host.nr_open, host.task_room, host.pty_room
    );
    println!(
        "process limit:        {}",
        if root {
            "a pids cgroup per command (cgroup v2 or the v1 pids hierarchy)"
        } else {
            "RLIMIT_NPROC inside the command's user namespace"
        }
    );
    println!(
        "memory limit:         {}",
        if root {
            shade_fusefs::sandbox::memory_enforcement()
        } else {
            "RLIMIT_AS of each of the command's processes (no cgroup of \
             this user's: the command's processes together may use up to the limit times \
             the process limit)"
                .to_string()
        }
    );
}

/// What the agent's commands do not get: the variables of this environment filtered out
/// (names only, never values) and the credential paths hidden from them.
fn secrets() {
    use shade_fusefs::sandbox::env;
    let removed = env::removed_names();
    let config = env::config();
    println!(
        "agent's environment:  {}",
        if removed.is_empty() {
            "nothing of this environment is withheld".to_string()
        } else {
            format!(
                "withheld from the agent's commands ({}): {}",
                removed.len(),
                removed.join(", ")
            )
        }
    );
    if !config.pass_env.is_empty() {
        println!(
            "                      passed by [sandbox] pass_env: {}",
            config.pass_env.join(", ")
        );
    }
    let hidden = env::credential_paths(&env::homes(), None);
    let whom = if config.hide_credentials {
        "from every command"
    } else {
        "from the agent's commands (`shade run` sees them; [sandbox] hide_credentials = true)"
    };
    if hidden.is_empty() {
        println!("credential files:     none found to hide");
    } else {
        println!("credential files:     hidden {whom}:");
        for p in hidden {
            println!("                        {}", p.display());
        }
    }
}

pub fn main(_args: DoctorArgs) -> i32 {
    let root = nix::unistd::geteuid().is_root();
    let state = StateDir::from_env();
    println!(
        "user:                 {}",
        if root {
            format!(
                "root (commands run as root of their own user namespace, which maps 0..65536 \
                 to host ids {b}..{e}: host uid {b}, no host capability, without \
                 CAP_SYS_ADMIN; SHADE_SANDBOX_IDS or a `shade` entry in /etc/subuid sets it)",
                b = shade_fusefs::sandbox::sandbox_base(),
                e = u64::from(shade_fusefs::sandbox::sandbox_base()) + 65535
            )
        } else {
            "plain user (commands run as you in their own user namespace, no capabilities)"
                .to_string()
        }
    );
    println!(
        "outside the project: {}",
        if root {
            "writes land in the branch's outside layer (overlays of every disk and memory \
             file system, idmapped to the command's ids), listed, kept only with --keep-outside"
        } else {
            "writes to $HOME, /tmp, /var/tmp, /run/user/UID and writable top-level \
             directories land in the branch's outside layer; the rest is read-only"
        }
    );
    println!(
        "user namespaces:      user.max_user_namespaces={}, kernel.unprivileged_userns_clone={}, \
         kernel.apparmor_restrict_unprivileged_userns={}",
        sysctl("/proc/sys/user/max_user_namespaces"),
        sysctl("/proc/sys/kernel/unprivileged_userns_clone"),
        sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
    );
    println!("seccomp:              {}", own_seccomp());
    println!(
        "fuse:                 /dev/fuse {}; fusermount3 {}",
        device("/dev/fuse"),
        which("fusermount3")
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "missing".into())
    );
    println!(
        "state dir:            {} ({}; hidden from every command)",
        state.root().display(),
        if Path::new(state.root()).is_dir() {
            "exists"
        } else {
            "not created yet"
        }
    );
    print_limits(root);
    secrets();
    match shade_fusefs::sandbox::probe() {
        Ok(conf) => {
            let version = conf.version();
            println!(
                "bubblewrap:           {} ({})",
                conf.bwrap.display(),
                if version.is_empty() {
                    "version unknown"
                } else {
                    &version
                }
            );
            println!(
                "sandbox:              works: user + PID + IPC namespaces, fresh /proc, minimal \
                 /dev, /sys read-only, seccomp allowlist (no io_uring), no_new_privs, killed with shade"
            );
            println!("commands:             confined (run, --shadow, speculation, lint)");
            unix_sockets(conf.scoped());
            0
        }
        Err(why) => {
            println!("sandbox:              unavailable: {why}");
            println!(
                "commands:             REFUSED: `shade run` needs --unconfined (no security \
                 boundary), chat does not speculate, --shadow sessions run no commands"
            );
            1
        }
    }
}

/// The unix sockets a command may reach: host ones closed, the allowed ones listed (and
/// whether each is there), and whether host abstract sockets are closed (Landlock scopes).
fn unix_sockets(scoped: bool) {
    let abi = shade_fusefs::sandbox::landlock_abi();
    if scoped {
        println!(
            "abstract sockets:     closed to commands (Landlock scopes, ABI {abi}); signals \
             stay inside the sandbox"
        );
    } else {
        println!(
            "abstract sockets:     OPEN to commands that share the host network (Landlock \
             ABI {abi}, scopes need 6: Linux 6.12+); use `shade run --no-network` where it \
             matters"
        );
    }
    let allowed = shade_fusefs::sandbox::allowed_sockets();
    let unresolved = shade_fusefs::sandbox::unresolved_sockets();
    if allowed.is_empty() && unresolved.is_empty() {
        println!(
            "unix sockets:         host sockets closed to commands; none allowed \
             (--allow-socket, [sandbox] allow_sockets)"
        );
        return;
    }
    println!("unix sockets:         host sockets closed to commands except:");
    for p in allowed {
        let state = match shade_fusefs::sandbox::check_socket(&p) {
            Ok(_) => "allowed, present".to_string(),
            Err(why) => format!("allowed, not bound: {why}"),
        };
        println!("  {}  ({state})", p.display());
    }
    for why in unresolved {
        println!("  {why} (allows nothing)");
    }
}

//! The seccomp filter of every confined command, compiled with `seccompiler` and handed to
//! bwrap (which applies it last, after no_new_privs, right before exec).
//!
//! Denied with EPERM: mounting and namespaces (mount, umount2, pivot_root, move_mount,
//! open_tree, fsopen/fsconfig/fsmount/fspick, mount_setattr, setns, unshare, clone with any
//! CLONE_NEW* flag), kernel keyrings (keyctl, add_key, request_key), bpf, perf_event_open,
//! userfaultfd (a tool of kernel exploits, used by no build), open_by_handle_at (opens any
//! inode of a file system by number, past every mount), kernel modules and kexec, and the
//! terminal injection ioctls TIOCSTI and TIOCLINUX (bwrap's `--new-session` would also stop
//! them, but takes job control from interactive commands). clone3 gets ENOSYS, so libc falls
//! back to clone, whose flags a filter can see. A system call of another architecture (the
//! 32-bit ABI on x86_64) kills the process; x32 numbers of the denied calls are denied too.
//!
//! Allowed on purpose: ptrace and process_vm_* (the PID namespace leaves only the sandbox's
//! own processes to trace: strace and gdb in `shade run` are legitimate), chroot (with a PID
//! namespace and the state directories hidden there is nothing to reach through it),
//! name_to_handle_at (only names a file the caller can already see), and sockets of every
//! family: without network the command has its own network namespace with loopback only,
//! and tests that listen on 127.0.0.1 must keep working in speculation.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The x32 ABI's flag on system call numbers (x86_64 only).
#[cfg(target_arch = "x86_64")]
const X32: i64 = 0x4000_0000;

const CLONE_NEW: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// Denied outright.
fn denied() -> Vec<i64> {
    vec![
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_setns,
        libc::SYS_unshare,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_open_by_handle_at,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
    ]
}

fn target() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no seccomp filter for this architecture: {e}"))
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, String> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, String> {
    SeccompRule::new(conds).map_err(|e| e.to_string())
}

/// The main filter: EPERM for what the module doc lists.
fn eperm() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied() {
        rules.insert(nr, Vec::new());
        #[cfg(target_arch = "x86_64")]
        rules.insert(nr | X32, Vec::new());
    }
    let clone: Vec<SeccompRule> = CLONE_NEW
        .iter()
        .map(|&f| rule(vec![cond(0, SeccompCmpOp::MaskedEq(f), f)?]))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_clone, clone);
    let tty = [libc::TIOCSTI, libc::TIOCLINUX]
        .iter()
        .map(|&req| rule(vec![cond(1, SeccompCmpOp::Eq, req)?]))
        .collect::<Result<Vec<_>, _>>()?;
    #[cfg(target_arch = "x86_64")]
    {
        // x32's ioctl is its own number (514), as is clone's (56 is shared).
        rules.insert(514 | X32, tty.clone());
        rules.insert(libc::SYS_clone | X32, rules[&libc::SYS_clone].clone());
    }
    rules.insert(libc::SYS_ioctl, tty);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target()?,
    )
    .map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// clone3 hides its flags in memory a filter cannot read: ENOSYS, and libc uses clone.
fn enosys() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_clone3, Vec::new());
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_clone3 | X32, Vec::new());
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target()?,
    )
    .map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// A program as bwrap reads it (`struct sock_filter` array, native byte order).
fn bytes(p: &BpfProgram) -> Vec<u8> {
    p.iter()
        .flat_map(|i| {
            let mut b = Vec::with_capacity(8);
            b.extend_from_slice(&i.code.to_ne_bytes());
            b.push(i.jt);
            b.push(i.jf);
            b.extend_from_slice(&i.k.to_ne_bytes());
            b
        })
        .collect()
}

/// Both programs every confined command gets.
pub(crate) fn programs() -> Result<Vec<Vec<u8>>, String> {
    Ok([eperm(), enosys()]
        .into_iter()
        .collect::<Result<Vec<_>, String>>()
        .map_err(|e| format!("cannot build the seccomp filter: {e}"))?
        .iter()
        .map(bytes)
        .collect())
}

/// The extra program of the read-only (speculative) sandbox: no new unix socket
/// (`socket(AF_UNIX, …)` gets EPERM; `socketpair` stays, it reaches no one). A unix socket
/// on the file system is a door to whoever listens there — systemd (`systemd-run`), the
/// user's session bus, docker, a tmux server — which would run anything outside the branch
/// for the command; connecting needs no write access, so a read-only mount does not close
/// it. Abstract sockets are per network namespace, which speculation has its own of.
pub(crate) fn read_only_program() -> Result<Vec<u8>, String> {
    let no_unix = || -> Result<Vec<SeccompRule>, String> {
        Ok(vec![rule(vec![cond(
            0,
            SeccompCmpOp::Eq,
            libc::AF_UNIX as u64,
        )?])?])
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_socket, no_unix()?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_socket | X32, no_unix()?);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target()?,
    )
    .and_then(BpfProgram::try_from)
    .map_err(|e| format!("cannot build the seccomp filter: {e}"))?;
    Ok(bytes(&filter))
}

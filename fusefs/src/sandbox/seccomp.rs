//! The seccomp filter of every confined command, compiled with `seccompiler` and handed to
//! bwrap (which applies it last, after no_new_privs, right before exec).
//!
//! It is an allowlist, modelled on Docker's default profile (moby/profiles
//! `seccomp/default.json`) and codex-rs's linux-sandbox: a system call that is not listed
//! gets ENOSYS (which programs take for "this kernel is too old" and work around), so a
//! system call added to the kernel later reaches the command only once it is reviewed here.
//! Three programs, stacked (the kernel takes the strictest answer; between two errnos the
//! later program's):
//!
//! 1. [`arch_check`]: a system call of another architecture (the 32-bit ABI on x86_64) or
//!    of the x32 ABI kills the process; the other programs then only see native numbers.
//! 2. [`allowlist`]: what builds, tests, shells, interpreters, debuggers and language
//!    servers use; everything else ENOSYS. Linux AIO (io_setup and the rest) is not listed:
//!    its contexts come from one host-wide table (`fs.aio-max-nr`, 65536 events) that a
//!    command could take whole, failing every other program's io_setup; its users (libaio:
//!    databases, fio, qemu) fall back to threads on ENOSYS, as glibc's POSIX AIO always does. `clone3` is not listed, so libc falls back to
//!    `clone`, whose flags a filter can see (clone3 hides them in memory).
//! 3. [`refused`]: EPERM, whatever the allowlist says, for what a command must never do:
//!    mounting and namespaces (mount, umount2, pivot_root, move_mount, open_tree,
//!    fsopen/fsconfig/fsmount/fspick, mount_setattr, setns, unshare, clone with any
//!    CLONE_NEW* flag), kernel keyrings (keyctl, add_key, request_key), bpf,
//!    perf_event_open, userfaultfd (a tool of kernel exploits, used by no build),
//!    open_by_handle_at (opens any inode of a file system by number, past every mount),
//!    kernel modules and kexec, io_uring (its operations — socket, connect, open — run
//!    past every rule below, which only sees system calls), the host's clock, swap,
//!    accounting, quotas, kernel log, reboot, host and domain names, vhangup, x86 port I/O,
//!    fanotify_init, the terminal injection ioctls TIOCSTI and TIOCLINUX (bwrap's
//!    `--new-session` would also stop them, but takes job control from interactive
//!    commands) and TIOCSETD (a line discipline set on the user's terminal outlives the
//!    command — N_NULL left the user's shell deaf — and setting one on any tty may load
//!    its kernel module, n_gsm's among them, with `dev.tty.ldisc_autoload`), personalities other than the harmless ones (`setarch -R`, `linux32`,
//!    `uname26`; READ_IMPLIES_EXEC and friends weaken the command's own memory
//!    protections), and sockets of the families AF_ALG (the kernel's crypto, a long line of
//!    exploits), AF_VSOCK (the hypervisor) and AF_NETLINK other than NETLINK_ROUTE (which
//!    glibc's getaddrinfo and `ip` use; audit, uevents, sock_diag and the rest are the
//!    host's business).
//!
//! Allowed on purpose: ptrace, process_vm_*, kcmp, pidfd_getfd and process_madvise (the
//! PID namespace leaves only the sandbox's own processes to reach: strace and gdb in
//! `shade run` are legitimate), chroot (with a PID namespace and the state directories
//! hidden there is nothing to reach through it), name_to_handle_at (only names a file the
//! caller can already see; without open_by_handle_at the handle opens nothing), mknod (a
//! user namespace cannot make device nodes; fifos and sockets are fine), the NUMA memory
//! policy calls (the command's own memory), and sockets of the other families: without
//! network the command has its own network namespace with loopback only, and tests that
//! listen on 127.0.0.1 must keep working in speculation.

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the sandbox's seccomp allowlist has tables for x86_64 and aarch64 only");

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

const CLONE_NEW: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// Numbers libc does not name yet (the same on x86_64 and aarch64 from 424 on).
mod nr {
    pub const CACHESTAT: i64 = 451;
    pub const FCHMODAT2: i64 = 452;
    pub const MAP_SHADOW_STACK: i64 = 453;
    pub const FUTEX_WAKE: i64 = 454;
    pub const FUTEX_WAIT: i64 = 455;
    pub const FUTEX_REQUEUE: i64 = 456;
    pub const STATMOUNT: i64 = 457;
    pub const LISTMOUNT: i64 = 458;
    pub const SETXATTRAT: i64 = 463;
    pub const GETXATTRAT: i64 = 464;
    pub const LISTXATTRAT: i64 = 465;
    pub const REMOVEXATTRAT: i64 = 466;
    /// open_tree with mount attributes: mounting, refused.
    pub const OPEN_TREE_ATTR: i64 = 467;
    /// Calls of the generic table that aarch64 has and libc does not name.
    #[cfg(target_arch = "aarch64")]
    pub const AARCH64: [i64; 4] = [
        38,  // renameat
        84,  // sync_file_range
        163, // getrlimit
        164, // setrlimit
    ];
}

/// The system calls a confined command may make (some further narrowed by [`refused`]).
fn allowed() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_accept,
        libc::SYS_accept4,
        libc::SYS_bind,
        libc::SYS_brk,
        libc::SYS_capget,
        libc::SYS_capset,
        libc::SYS_chdir,
        libc::SYS_clock_getres,
        libc::SYS_clock_gettime,
        libc::SYS_clock_nanosleep,
        libc::SYS_close,
        libc::SYS_close_range,
        libc::SYS_connect,
        libc::SYS_copy_file_range,
        libc::SYS_dup,
        libc::SYS_dup3,
        libc::SYS_epoll_create1,
        libc::SYS_epoll_ctl,
        libc::SYS_epoll_pwait,
        libc::SYS_epoll_pwait2,
        libc::SYS_eventfd2,
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        libc::SYS_fadvise64,
        libc::SYS_fallocate,
        libc::SYS_fanotify_mark,
        libc::SYS_fchdir,
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_fcntl,
        libc::SYS_fdatasync,
        libc::SYS_fgetxattr,
        libc::SYS_flistxattr,
        libc::SYS_flock,
        libc::SYS_fremovexattr,
        libc::SYS_fsetxattr,
        libc::SYS_fstat,
        libc::SYS_fstatfs,
        libc::SYS_fsync,
        libc::SYS_ftruncate,
        libc::SYS_futex,
        libc::SYS_futex_waitv,
        libc::SYS_getcpu,
        libc::SYS_getcwd,
        libc::SYS_getdents64,
        libc::SYS_getegid,
        libc::SYS_geteuid,
        libc::SYS_getgid,
        libc::SYS_getgroups,
        libc::SYS_getitimer,
        libc::SYS_getpeername,
        libc::SYS_getpgid,
        libc::SYS_getpid,
        libc::SYS_getppid,
        libc::SYS_getpriority,
        libc::SYS_getrandom,
        libc::SYS_getresgid,
        libc::SYS_getresuid,
        libc::SYS_get_robust_list,
        libc::SYS_getrusage,
        libc::SYS_getsid,
        libc::SYS_getsockname,
        libc::SYS_getsockopt,
        libc::SYS_gettid,
        libc::SYS_gettimeofday,
        libc::SYS_getuid,
        libc::SYS_getxattr,
        libc::SYS_inotify_add_watch,
        libc::SYS_inotify_init1,
        libc::SYS_inotify_rm_watch,
        libc::SYS_ioctl,
        libc::SYS_ioprio_get,
        libc::SYS_ioprio_set,
        libc::SYS_kill,
        libc::SYS_landlock_add_rule,
        libc::SYS_landlock_create_ruleset,
        libc::SYS_landlock_restrict_self,
        libc::SYS_lgetxattr,
        libc::SYS_linkat,
        libc::SYS_listen,
        libc::SYS_listxattr,
        libc::SYS_llistxattr,
        libc::SYS_lremovexattr,
        libc::SYS_lseek,
        libc::SYS_lsetxattr,
        libc::SYS_madvise,
        libc::SYS_membarrier,
        libc::SYS_memfd_create,
        libc::SYS_memfd_secret,
        libc::SYS_mincore,
        libc::SYS_mkdirat,
        libc::SYS_mknodat,
        libc::SYS_mlock,
        libc::SYS_mlock2,
        libc::SYS_mlockall,
        libc::SYS_mmap,
        libc::SYS_mprotect,
        libc::SYS_mq_getsetattr,
        libc::SYS_mq_notify,
        libc::SYS_mq_open,
        libc::SYS_mq_timedreceive,
        libc::SYS_mq_timedsend,
        libc::SYS_mq_unlink,
        libc::SYS_mremap,
        libc::SYS_mseal,
        libc::SYS_msgctl,
        libc::SYS_msgget,
        libc::SYS_msgrcv,
        libc::SYS_msgsnd,
        libc::SYS_msync,
        libc::SYS_munlock,
        libc::SYS_munlockall,
        libc::SYS_munmap,
        libc::SYS_name_to_handle_at,
        libc::SYS_nanosleep,
        libc::SYS_newfstatat,
        libc::SYS_openat,
        libc::SYS_openat2,
        libc::SYS_pidfd_open,
        libc::SYS_pidfd_send_signal,
        libc::SYS_pipe2,
        libc::SYS_pkey_alloc,
        libc::SYS_pkey_free,
        libc::SYS_pkey_mprotect,
        libc::SYS_ppoll,
        libc::SYS_prctl,
        libc::SYS_pread64,
        libc::SYS_preadv,
        libc::SYS_preadv2,
        libc::SYS_prlimit64,
        libc::SYS_process_mrelease,
        libc::SYS_pselect6,
        libc::SYS_pwrite64,
        libc::SYS_pwritev,
        libc::SYS_pwritev2,
        libc::SYS_read,
        libc::SYS_readahead,
        libc::SYS_readlinkat,
        libc::SYS_readv,
        libc::SYS_recvfrom,
        libc::SYS_recvmmsg,
        libc::SYS_recvmsg,
        libc::SYS_remap_file_pages,
        libc::SYS_removexattr,
        libc::SYS_renameat2,
        libc::SYS_restart_syscall,
        libc::SYS_rseq,
        libc::SYS_rt_sigaction,
        libc::SYS_rt_sigpending,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigqueueinfo,
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigsuspend,
        libc::SYS_rt_sigtimedwait,
        libc::SYS_rt_tgsigqueueinfo,
        libc::SYS_sched_getaffinity,
        libc::SYS_sched_getattr,
        libc::SYS_sched_getparam,
        libc::SYS_sched_get_priority_max,
        libc::SYS_sched_get_priority_min,
        libc::SYS_sched_getscheduler,
        libc::SYS_sched_rr_get_interval,
        libc::SYS_sched_setaffinity,
        libc::SYS_sched_setattr,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_yield,
        libc::SYS_seccomp,
        libc::SYS_semctl,
        libc::SYS_semget,
        libc::SYS_semop,
        libc::SYS_semtimedop,
        libc::SYS_sendfile,
        libc::SYS_sendmmsg,
        libc::SYS_sendmsg,
        libc::SYS_sendto,
        libc::SYS_setfsgid,
        libc::SYS_setfsuid,
        libc::SYS_setgid,
        libc::SYS_setgroups,
        libc::SYS_setitimer,
        libc::SYS_setpgid,
        libc::SYS_setpriority,
        libc::SYS_setregid,
        libc::SYS_setresgid,
        libc::SYS_setresuid,
        libc::SYS_setreuid,
        libc::SYS_set_robust_list,
        libc::SYS_setsid,
        libc::SYS_setsockopt,
        libc::SYS_set_tid_address,
        libc::SYS_setuid,
        libc::SYS_setxattr,
        libc::SYS_shmat,
        libc::SYS_shmctl,
        libc::SYS_shmdt,
        libc::SYS_shmget,
        libc::SYS_shutdown,
        libc::SYS_sigaltstack,
        libc::SYS_signalfd4,
        libc::SYS_socketpair,
        libc::SYS_splice,
        libc::SYS_statfs,
        libc::SYS_statx,
        libc::SYS_symlinkat,
        libc::SYS_sync,
        libc::SYS_syncfs,
        libc::SYS_sysinfo,
        libc::SYS_tee,
        libc::SYS_tgkill,
        libc::SYS_timer_create,
        libc::SYS_timer_delete,
        libc::SYS_timer_getoverrun,
        libc::SYS_timer_gettime,
        libc::SYS_timer_settime,
        libc::SYS_timerfd_create,
        libc::SYS_timerfd_gettime,
        libc::SYS_timerfd_settime,
        libc::SYS_times,
        libc::SYS_tkill,
        libc::SYS_truncate,
        libc::SYS_umask,
        libc::SYS_uname,
        libc::SYS_unlinkat,
        libc::SYS_utimensat,
        libc::SYS_vmsplice,
        libc::SYS_wait4,
        libc::SYS_waitid,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_clone,
        libc::SYS_socket,
        libc::SYS_personality,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_kcmp,
        libc::SYS_pidfd_getfd,
        libc::SYS_process_madvise,
        libc::SYS_chroot,
        libc::SYS_get_mempolicy,
        libc::SYS_set_mempolicy,
        libc::SYS_mbind,
        libc::SYS_set_mempolicy_home_node,
        nr::CACHESTAT,
        nr::FCHMODAT2,
        nr::MAP_SHADOW_STACK,
        nr::FUTEX_WAKE,
        nr::FUTEX_WAIT,
        nr::FUTEX_REQUEUE,
        nr::STATMOUNT,
        nr::LISTMOUNT,
        nr::SETXATTRAT,
        nr::GETXATTRAT,
        nr::LISTXATTRAT,
        nr::REMOVEXATTRAT,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_access,
        libc::SYS_alarm,
        libc::SYS_chmod,
        libc::SYS_chown,
        libc::SYS_creat,
        libc::SYS_dup2,
        libc::SYS_epoll_create,
        libc::SYS_epoll_wait,
        libc::SYS_eventfd,
        libc::SYS_fork,
        libc::SYS_futimesat,
        libc::SYS_getdents,
        libc::SYS_getpgrp,
        libc::SYS_getrlimit,
        libc::SYS_inotify_init,
        libc::SYS_lchown,
        libc::SYS_link,
        libc::SYS_lstat,
        libc::SYS_mkdir,
        libc::SYS_mknod,
        libc::SYS_open,
        libc::SYS_pause,
        libc::SYS_pipe,
        libc::SYS_poll,
        libc::SYS_readlink,
        libc::SYS_rename,
        libc::SYS_renameat,
        libc::SYS_rmdir,
        libc::SYS_select,
        libc::SYS_setrlimit,
        libc::SYS_signalfd,
        libc::SYS_stat,
        libc::SYS_symlink,
        libc::SYS_sync_file_range,
        libc::SYS_time,
        libc::SYS_unlink,
        libc::SYS_utime,
        libc::SYS_utimes,
        libc::SYS_vfork,
        libc::SYS_arch_prctl,
        // uretprobe: the kernel's return trampoline of user probes (x86_64 only).
        335,
    ]);
    #[cfg(target_arch = "aarch64")]
    v.extend(nr::AARCH64);
    v
}

/// Refused with EPERM whatever their arguments (see the module doc).
fn denied() -> Vec<i64> {
    let v = vec![
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        nr::OPEN_TREE_ATTR,
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
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_acct,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_adjtimex,
        libc::SYS_clock_adjtime,
        libc::SYS_syslog,
        libc::SYS_quotactl,
        libc::SYS_quotactl_fd,
        libc::SYS_lookup_dcookie,
        libc::SYS_vhangup,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_fanotify_init,
        libc::SYS_migrate_pages,
        libc::SYS_move_pages,
        libc::SYS_nfsservctl,
    ];
    #[cfg(target_arch = "x86_64")]
    let v = [
        v,
        vec![libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_modify_ldt],
    ]
    .concat();
    v
}

/// Personalities a command may ask for: Linux, `linux32`, `uname26`, `setarch -R` (no
/// address randomisation, which gdb asks for), their combinations, and the query.
const PERSONALITIES: [u64; 9] = [
    0,
    0x8,
    0x2_0000,
    0x2_0008,
    0x4_0000,
    0x4_0008,
    0x6_0000,
    0x6_0008,
    0xffff_ffff,
];

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

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    otherwise: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, String> {
    let filter =
        SeccompFilter::new(rules, otherwise, matched, target()?).map_err(|e| e.to_string())?;
    BpfProgram::try_from(filter).map_err(|e| e.to_string())
}

/// The first program: kill on a foreign architecture, and on x86_64 on any x32 number
/// (the x32 ABI shares x86_64's audit architecture; its numbers carry bit 30).
fn arch_check() -> BpfProgram {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
    let op = |code, k, jt, jf| sock_filter { code, jt, jf, k };
    let mut p = vec![
        op(LD_W_ABS, 4, 0, 0), // seccomp_data.arch
        op(JEQ, ARCH, 1, 0),
        op(RET, libc::SECCOMP_RET_KILL_PROCESS, 0, 0),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
        p.extend([
            op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
            op(JSET, 0x4000_0000, 0, 1),
            op(RET, libc::SECCOMP_RET_KILL_PROCESS, 0, 0),
        ]);
    }
    p.push(op(RET, libc::SECCOMP_RET_ALLOW, 0, 0));
    p
}

/// The second program: what [`allowed`] lists passes, anything else gets ENOSYS.
fn allowlist() -> Result<BpfProgram, String> {
    let rules = allowed().into_iter().map(|nr| (nr, Vec::new())).collect();
    compile(
        rules,
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
    )
}

/// The third program: EPERM for what the module doc lists, whatever the allowlist says.
fn refused() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        denied().into_iter().map(|nr| (nr, Vec::new())).collect();
    let clone = CLONE_NEW
        .iter()
        .map(|&f| rule(vec![cond(0, SeccompCmpOp::MaskedEq(f), f)?]))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_clone, clone);
    let tty = [libc::TIOCSTI, libc::TIOCLINUX, libc::TIOCSETD]
        .iter()
        .map(|&req| rule(vec![cond(1, SeccompCmpOp::Eq, req)?]))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_ioctl, tty);
    // One rule: refused when it is none of the harmless ones.
    let persona = PERSONALITIES
        .iter()
        .map(|&p| cond(0, SeccompCmpOp::Ne, p))
        .collect::<Result<_, _>>()?;
    rules.insert(libc::SYS_personality, vec![rule(persona)?]);
    let family = |f: i32| cond(0, SeccompCmpOp::Eq, f as u64);
    rules.insert(
        libc::SYS_socket,
        vec![
            rule(vec![family(libc::AF_ALG)?])?,
            rule(vec![family(libc::AF_VSOCK)?])?,
            rule(vec![
                family(libc::AF_NETLINK)?,
                cond(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE as u64)?,
            ])?,
        ],
    );
    compile(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
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

/// The programs every confined command gets, in the order bwrap must install them (a later
/// program's errno wins over an earlier one's: EPERM for a refused call, not ENOSYS).
pub(crate) fn programs() -> Result<Vec<Vec<u8>>, String> {
    Ok([Ok(arch_check()), allowlist(), refused()]
        .into_iter()
        .collect::<Result<Vec<_>, String>>()
        .map_err(|e| format!("cannot build the seccomp filter: {e}"))?
        .iter()
        .map(bytes)
        .collect())
}

/// The extra program of the read-only (speculative) sandbox, installed after
/// [`programs`]: no new unix socket (`socket(AF_UNIX, …)` gets EPERM). A unix socket on
/// the file system is a door to whoever listens there — systemd (`systemd-run`), the
/// user's session bus, docker, a tmux server — which would run anything outside the branch
/// for the command; connecting needs no write access, so a read-only mount does not close
/// it. `socketpair` stays for the stream kinds only (SOCK_STREAM, SOCK_SEQPACKET: a pair
/// connected to itself, reaching no one); a datagram or raw pair is refused, since its
/// sockets can `sendto` any datagram socket by path (journald, the notify socket).
/// io_uring, which would open and connect sockets past this program, is refused for every
/// command. Abstract sockets are per network namespace, which speculation has its own of.
pub(crate) fn read_only_program() -> Result<Vec<u8>, String> {
    let build = || -> Result<BpfProgram, String> {
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        rules.insert(
            libc::SYS_socket,
            vec![rule(vec![cond(
                0,
                SeccompCmpOp::Eq,
                libc::AF_UNIX as u64,
            )?])?],
        );
        // The type's low 4 bits (SOCK_TYPE_MASK) are the kind; the rest are flags.
        let kinds = (0..16u64)
            .filter(|&t| t != libc::SOCK_STREAM as u64 && t != libc::SOCK_SEQPACKET as u64)
            .map(|t| rule(vec![cond(1, SeccompCmpOp::MaskedEq(0xf), t)?]))
            .collect::<Result<_, _>>()?;
        rules.insert(libc::SYS_socketpair, kinds);
        compile(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
        )
    };
    build()
        .map(|p| bytes(&p))
        .map_err(|e| format!("cannot build the seccomp filter: {e}"))
}

#[cfg(test)]
mod tests {
    //! The filter's decisions pinned to a table (so a rework of the programs changes no
    //! decision), and the kernel's seccomp action cache (Linux 5.11+) checked to cover every
    //! system call allowed by number alone: a cached call costs the command no filter run at
    //! all (measured: +40 ns a call for the stack, the same as one one-instruction
    //! program), an uncached one runs every program (ENOSYS through the whole allowlist:
    //! +400–700 ns). An argument check added to a hot call (openat, newfstatat, read)
    //! would make every such call run the programs.
    use super::*;

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 0xC000_00B7;

    /// `struct seccomp_data` as the programs load it.
    fn data(nr: u32, arch: u32, args: [u64; 6]) -> Vec<u8> {
        let mut d = Vec::with_capacity(64);
        d.extend_from_slice(&nr.to_ne_bytes());
        d.extend_from_slice(&arch.to_ne_bytes());
        d.extend_from_slice(&0u64.to_ne_bytes());
        for a in args {
            d.extend_from_slice(&a.to_ne_bytes());
        }
        d
    }

    /// Classic BPF as the kernel runs a seccomp program (the instructions seccompiler and
    /// `arch_check` emit).
    fn run(p: &BpfProgram, d: &[u8]) -> u32 {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        loop {
            let i = &p[pc];
            let jump = |c: bool| 1 + usize::from(if c { i.jt } else { i.jf });
            let code = u32::from(i.code);
            pc += match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let k = i.k as usize;
                    a = u32::from_ne_bytes(d[k..k + 4].try_into().expect("4 bytes"));
                    1
                }
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => jump(a == i.k),
                c if c == libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K => jump(a > i.k),
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => jump(a >= i.k),
                c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => jump(a & i.k != 0),
                c if c == libc::BPF_JMP | libc::BPF_JA => 1 + i.k as usize,
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => {
                    a &= i.k;
                    1
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                c => panic!("instruction {c:#x} not emulated"),
            };
        }
    }

    /// The stack's answer as the kernel picks it: newest program first, the action of
    /// highest precedence (lowest signed action value), the first seen among equals.
    fn decide(programs: &[BpfProgram], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let d = data(nr, arch, args);
        let action = |r: u32| (r & libc::SECCOMP_RET_ACTION_FULL) as i32;
        let mut ret = ALLOW;
        for p in programs.iter().rev() {
            let r = run(p, &d);
            if action(r) < action(ret) {
                ret = r;
            }
        }
        ret
    }

    /// The kernel's `seccomp_is_const_allow`: does `p` allow `nr` whatever the arguments
    /// (then the call is cached and no program runs for it)?
    fn const_allow(p: &BpfProgram, nr: u32) -> bool {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        while pc < p.len() {
            let i = &p[pc];
            let jump = |c: bool| 1 + usize::from(if c { i.jt } else { i.jf });
            let code = u32::from(i.code);
            pc += match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    a = match i.k {
                        0 => nr,
                        4 => ARCH,
                        _ => return false,
                    };
                    1
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k == ALLOW,
                c if c == libc::BPF_JMP | libc::BPF_JA => 1 + i.k as usize,
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => jump(a == i.k),
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => jump(a >= i.k),
                c if c == libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K => jump(a > i.k),
                c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => jump(a & i.k != 0),
                c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => {
                    a &= i.k;
                    1
                }
                _ => return false,
            };
        }
        false
    }

    fn stack() -> Vec<BpfProgram> {
        vec![
            arch_check(),
            allowlist().expect("allowlist"),
            refused().expect("refused"),
        ]
    }

    /// The decision for numbers 0..512 with all arguments 0, one letter each: A allowed,
    /// N ENOSYS, P EPERM (taken from the programs of main 91e86be, as the kernel runs them;
    /// since then Linux AIO, 206-210 and 333, is ENOSYS).
    #[cfg(target_arch = "x86_64")]
    const TABLE: [&str; 8] = [
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", // 0..
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAPAAAAAAAAAAAAAAAAAAAAAAAA", // 64..
        "AAAAAANANAANAAAAAAAAAAAAAPPPNAAPAAAPPPPPPPPPPPNPPNNPPNNNNNAAAAAA", // 128..
        "AAAAAAAAAAAAANNNNNNNPANNAAAAAAAAAAAPAAAAAAAANAAAAAAAAAPAPPPAAAAA", // 192..
        "PAAAAAAAAAAAAAAAPAAAAAAPAAAAAAAAAAAAAAAAAAPAPAAAPPAAPAAAAPAAAAAA", // 256..
        "PPAPAAAAAAAAANAANNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNN", // 320..
        "NNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNAPPPPPPPPPANAAAAAAPPAAAA", // 384..
        "AAAAAAAAAAANNNAAAAAPNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNNN", // 448..
    ];

    fn letter(r: u32) -> char {
        match r {
            ALLOW => 'A',
            ENOSYS => 'N',
            EPERM => 'P',
            KILL => 'K',
            _ => '?',
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_number_gets_the_decision_of_the_table() {
        let progs = stack();
        let table: String = TABLE.concat();
        let got: String = (0..512u32)
            .map(|nr| letter(decide(&progs, nr, ARCH, [0; 6])))
            .collect();
        for (nr, (want, got)) in table.chars().zip(got.chars()).enumerate() {
            assert_eq!(want, got, "system call {nr}");
        }
        for nr in [512u32, 600, 1000, 0xffff] {
            assert_eq!(decide(&progs, nr, ARCH, [0; 6]), ENOSYS, "{nr}");
        }
        // x32 numbers and another architecture's calls kill.
        for nr in [0u32, 1, 59, 600] {
            assert_eq!(
                decide(&progs, nr | 0x4000_0000, ARCH, [0; 6]),
                KILL,
                "x32 {nr}"
            );
            assert_eq!(decide(&progs, nr, 0x4000_0003, [0; 6]), KILL, "i386 {nr}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn argument_checks_give_the_decisions_of_the_table() {
        let progs = stack();
        let a = |x: &[u64]| {
            let mut args = [0u64; 6];
            args[..x.len()].copy_from_slice(x);
            args
        };
        // (call, arguments, decision)
        let cases: &[(i64, [u64; 6], u32)] = &[
            (libc::SYS_clone, a(&[0]), ALLOW),
            (libc::SYS_clone, a(&[0x3d_0f00]), ALLOW), // a thread
            (libc::SYS_clone, a(&[0x2_0000]), EPERM),  // CLONE_NEWNS
            (libc::SYS_clone, a(&[0x200_0000]), EPERM), // CLONE_NEWCGROUP
            (libc::SYS_clone, a(&[0x400_0000]), EPERM), // CLONE_NEWUTS
            (libc::SYS_clone, a(&[0x800_0000]), EPERM), // CLONE_NEWIPC
            (libc::SYS_clone, a(&[0x1000_0000]), EPERM), // CLONE_NEWUSER
            (libc::SYS_clone, a(&[0x2000_0000]), EPERM), // CLONE_NEWPID
            (libc::SYS_clone, a(&[0x4000_0000]), EPERM), // CLONE_NEWNET
            (libc::SYS_clone, a(&[0x103d_0f00]), EPERM),
            (libc::SYS_clone, a(&[0x1_0000_0000]), ALLOW), // upper half not compared
            (libc::SYS_ioctl, a(&[0, 0x5412]), EPERM),     // TIOCSTI
            (libc::SYS_ioctl, a(&[0, 0x541c]), EPERM),     // TIOCLINUX
            (libc::SYS_ioctl, a(&[0, 0x5423]), EPERM),     // TIOCSETD
            (libc::SYS_ioctl, a(&[0, 0x541b]), ALLOW),     // FIONREAD
            (libc::SYS_ioctl, a(&[0, 0x5401]), ALLOW),     // TCGETS
            (libc::SYS_ioctl, a(&[0, 0x1_0000_5412]), EPERM),
            (libc::SYS_personality, a(&[0x40_0000]), EPERM), // READ_IMPLIES_EXEC
            (libc::SYS_personality, a(&[0x20_0000]), EPERM), // ADDR_NO_RANDOMIZE|…
            (libc::SYS_personality, a(&[1]), EPERM),
            (libc::SYS_personality, a(&[0x1_0000_0000]), ALLOW),
            (libc::SYS_socket, a(&[38]), EPERM),       // AF_ALG
            (libc::SYS_socket, a(&[40]), EPERM),       // AF_VSOCK
            (libc::SYS_socket, a(&[16, 3, 0]), ALLOW), // AF_NETLINK, NETLINK_ROUTE
            (libc::SYS_socket, a(&[16, 3, 9]), EPERM), // NETLINK_AUDIT
            (libc::SYS_socket, a(&[16, 3, 4]), EPERM), // NETLINK_SOCK_DIAG
            (libc::SYS_socket, a(&[2, 1, 0]), ALLOW),
            (libc::SYS_socket, a(&[1, 1, 0]), ALLOW),
            (libc::SYS_socket, a(&[10, 2, 0]), ALLOW),
            (libc::SYS_socket, a(&[0x1_0000_0026]), EPERM),
        ];
        for &(nr, args, want) in cases {
            assert_eq!(
                decide(&progs, nr as u32, ARCH, args),
                want,
                "{nr} {args:x?}"
            );
        }
        for p in PERSONALITIES {
            let got = decide(&progs, libc::SYS_personality as u32, ARCH, a(&[p]));
            assert_eq!(got, ALLOW, "personality {p:#x}");
        }
    }

    #[test]
    fn the_read_only_program_refuses_new_unix_sockets_and_datagram_pairs() {
        let mut progs = stack();
        let ro = read_only_program().expect("read-only program");
        let ro: BpfProgram = ro
            .chunks(8)
            .map(|c| sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        progs.push(ro);
        let socket = libc::SYS_socket as u32;
        let pair = libc::SYS_socketpair as u32;
        let d = |nr, args: [u64; 3]| decide(&progs, nr, ARCH, [args[0], args[1], args[2], 0, 0, 0]);
        assert_eq!(d(socket, [1, 1, 0]), EPERM);
        assert_eq!(d(socket, [2, 1, 0]), ALLOW);
        assert_eq!(d(pair, [1, 1, 0]), ALLOW);
        assert_eq!(d(pair, [1, 5, 0]), ALLOW);
        assert_eq!(d(pair, [1, 0x8_0001, 0]), ALLOW); // SOCK_STREAM|SOCK_CLOEXEC
        assert_eq!(d(pair, [1, 2, 0]), EPERM);
        assert_eq!(d(pair, [1, 3, 0]), EPERM);
    }

    /// Every call the stack allows without looking at its arguments is in the kernel's
    /// action cache; only the four calls with argument checks (and the refused ones) run
    /// the programs.
    #[test]
    fn every_call_allowed_by_number_is_cached_by_the_kernel() {
        let progs = stack();
        let checked = [
            libc::SYS_clone,
            libc::SYS_ioctl,
            libc::SYS_personality,
            libc::SYS_socket,
        ];
        let mut cached = 0;
        for nr in allowed() {
            let is_cached = progs.iter().all(|p| const_allow(p, nr as u32));
            if checked.contains(&nr) {
                assert!(!is_cached, "{nr} has argument checks yet is cached");
            } else {
                assert!(is_cached, "allowed system call {nr} is not cacheable");
                cached += 1;
            }
        }
        assert!(cached > 250, "{cached}");
        // No denied or unlisted call is cached (the cache only ever says "allow").
        for nr in denied() {
            assert!(!progs.iter().all(|p| const_allow(p, nr as u32)), "{nr}");
        }
    }
}

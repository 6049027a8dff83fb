//! The command's own IPC namespace, with its SysV IPC and POSIX message queue limits set
//! before the command starts.
//!
//! A new IPC namespace starts with the kernel's defaults, not the host's: SysV shared
//! memory without a total (`kernel.shmall` of 2^64 pages), 32000 message queues of 16 KiB
//! text each (and as many empty messages, 64 bytes of kernel memory apiece: about 32 GiB),
//! a billion semaphores. Those sysctls belong to the namespace, and the kernel lets the
//! namespace's root (the effective id its owning user namespace maps to 0) write them. So
//! shade makes the namespace itself in bwrap's pre-exec hook and writes them there, bounded
//! by the command's memory limit ([`values`]); bwrap then runs in it (no `--unshare-ipc`).
//!
//! The command cannot raise them again: it reaches `/proc/sys` only through the read-only
//! bind bwrap.rs makes over it (EROFS, whoever it is), has no CAP_SYS_ADMIN to remount it,
//! and the seccomp filter refuses mount calls and new namespaces.
//!
//! Who owns the namespace: as root, the sandbox's user namespace (the command's root is
//! that namespace's root); as a plain user, a user namespace made for that alone by a
//! short-lived child, in which the user is 0 (the plain user's own namespace maps the user
//! to itself, so its 0 is nobody and nobody could write the limits). The hook then joins
//! the child's IPC namespace (it has every capability in its own user namespace, the
//! child's parent) and the child exits; its user namespace lives on with the IPC one.

use std::ffi::CStr;
use std::io;

use super::limits::Limits;

/// The page size the shared memory total is counted in (`kernel.shmall`).
const PAGE: u64 = 4096;
/// `kernel.msgmnb`: the bytes of message text one queue holds (the kernel's default).
const MSGMNB: u64 = 16384;
/// Kernel memory one message costs besides its text (its `msg_msg` header, a 64-byte
/// slab object): a queue holds as many messages as `msgmnb`, empty ones included.
const MSG_HEADER: u64 = 64;
/// Kernel memory one semaphore costs (`struct sem`, a cache line).
const SEM_COST: u64 = 64;
/// The processes assumed without a process limit, for the semaphores' undo records.
const UNLIMITED_PROCESSES: u64 = 4096;
/// `fs.mqueue.msg_max` and `msgsize_max`: the kernel's defaults.
const MQ_MSG_MAX: u64 = 10;
const MQ_MSGSIZE_MAX: u64 = 8192;

/// The limits written in the command's IPC namespace, each the kernel's default or less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpcValues {
    /// `kernel.shmmax`: the largest segment, bytes.
    pub shmmax: u64,
    /// `kernel.shmall`: all segments together, pages.
    pub shmall: u64,
    /// `kernel.msgmni`: message queues.
    pub msgmni: u64,
    /// `kernel.sem`'s SEMMSL and SEMMNS: semaphores per set, and in all.
    pub semmsl: u64,
    pub semmns: u64,
    /// `kernel.sem`'s SEMMNI: semaphore sets.
    pub semmni: u64,
    /// `fs.mqueue.queues_max`: POSIX message queues.
    pub mq_queues: u64,
}

/// The limits for a command of `memory` bytes and `processes` processes at most: SysV shared
/// memory up to `memory` in all (its segments' pages count against the memory limit as
/// well as root's cgroup, and are not mapped, so not counted by a plain user's
/// `RLIMIT_AS`); message queues, semaphores (with one undo record per process and set) and
/// POSIX message queues each at most an eighth of it in kernel memory.
pub(crate) fn values(memory: u64, processes: Option<u32>) -> IpcValues {
    let eighth = memory / 8;
    let procs = processes.map_or(UNLIMITED_PROCESSES, u64::from);
    let semmns = (eighth / (SEM_COST + 2 * procs)).clamp(1, 1_024_000_000);
    IpcValues {
        shmmax: memory,
        shmall: memory.div_ceil(PAGE),
        msgmni: (eighth / (MSGMNB + MSGMNB * MSG_HEADER)).clamp(1, 32000),
        semmsl: semmns.min(32000),
        semmns,
        semmni: semmns.min(32000),
        mq_queues: (eighth / (MQ_MSG_MAX * (MQ_MSGSIZE_MAX + MSG_HEADER))).clamp(1, 256),
    }
}

/// What the pre-exec hook does, prepared before the fork.
pub(crate) struct IpcPlan {
    /// (sysctl file, value) to write in the new namespace.
    sysctls: Vec<(&'static CStr, Vec<u8>)>,
    /// As a plain user: the id maps ("0 UID 1") of the user namespace that owns it.
    owner_maps: Option<(Vec<u8>, Vec<u8>)>,
}

impl IpcPlan {
    /// The plan for a command with `limits`, as root (`root`) or a plain user. Without a
    /// memory limit the namespace keeps the kernel's defaults.
    pub(crate) fn new(limits: &Limits, root: bool) -> IpcPlan {
        let sysctls = match limits.memory {
            Some(m) => {
                let v = values(m.max(super::cgroup::MIN_MEMORY), limits.max_processes);
                vec![
                    (c"/proc/sys/kernel/shmmax", v.shmmax),
                    (c"/proc/sys/kernel/shmall", v.shmall),
                    (c"/proc/sys/kernel/msgmax", 8192),
                    (c"/proc/sys/kernel/msgmnb", MSGMNB),
                    (c"/proc/sys/kernel/msgmni", v.msgmni),
                    (c"/proc/sys/fs/mqueue/msg_max", MQ_MSG_MAX),
                    (c"/proc/sys/fs/mqueue/msgsize_max", MQ_MSGSIZE_MAX),
                    (c"/proc/sys/fs/mqueue/queues_max", v.mq_queues),
                ]
                .into_iter()
                .map(|(f, n)| (f, format!("{n}\n").into_bytes()))
                .chain(std::iter::once((
                    c"/proc/sys/kernel/sem",
                    format!("{} {} 500 {}\n", v.semmsl, v.semmns, v.semmni).into_bytes(),
                )))
                .collect()
            }
            None => Vec::new(),
        };
        let owner_maps = (!root).then(|| {
            let uid = nix::unistd::geteuid();
            let gid = nix::unistd::getegid();
            (
                format!("0 {uid} 1\n").into_bytes(),
                format!("0 {gid} 1\n").into_bytes(),
            )
        });
        IpcPlan {
            sysctls,
            owner_maps,
        }
    }

    /// In the pre-exec hook, in the user namespace bwrap starts in (root's sandbox
    /// namespace, or a plain user's own, with every capability there): enter a new IPC
    /// namespace with the limits set. Where the kernel refuses the limits (before Linux
    /// 5.17 they were not the namespace root's to write), the namespace keeps its defaults.
    ///
    /// # Safety
    /// Async-signal-safe; between fork and exec.
    pub(crate) unsafe fn enter(&self) -> io::Result<()> {
        match &self.owner_maps {
            None => {
                if libc::unshare(libc::CLONE_NEWIPC) != 0 {
                    return Err(io::Error::last_os_error());
                }
                self.write_sysctls();
                Ok(())
            }
            Some((uid_map, gid_map)) => {
                if self.join_owned(uid_map, gid_map) {
                    return Ok(());
                }
                // No namespace of the user's own to be 0 in: a private one with the
                // kernel's defaults, as bwrap's would have been.
                if libc::unshare(libc::CLONE_NEWIPC) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            }
        }
    }

    /// Writes the limits in the current IPC namespace; one the kernel refuses is left.
    unsafe fn write_sysctls(&self) {
        for (file, value) in &self.sysctls {
            let _ = super::write_file(file, value);
        }
    }

    /// A child makes a user namespace with `uid_map`/`gid_map` (the user as 0) and an IPC
    /// namespace in it with the limits; we join that IPC namespace. Whether we did.
    unsafe fn join_owned(&self, uid_map: &[u8], gid_map: &[u8]) -> bool {
        let mut ready = [0; 2];
        let mut go = [0; 2];
        if libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return false;
        }
        if libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            libc::close(ready[0]);
            libc::close(ready[1]);
            return false;
        }
        let pid = libc::fork();
        if pid == 0 {
            libc::close(ready[0]);
            libc::close(go[1]);
            let ok = libc::unshare(libc::CLONE_NEWUSER) == 0
                && super::write_id_maps(uid_map, gid_map).is_ok()
                && libc::unshare(libc::CLONE_NEWIPC) == 0;
            if ok {
                self.write_sysctls();
            }
            let b = [u8::from(ok)];
            libc::write(ready[1], b.as_ptr().cast(), 1);
            // Until the parent has joined (or given up): EOF.
            let mut x = [0u8; 1];
            libc::read(go[0], x.as_mut_ptr().cast(), 1);
            libc::_exit(0);
        }
        libc::close(ready[1]);
        libc::close(go[0]);
        let mut joined = false;
        if pid > 0 {
            let mut b = [0u8; 1];
            if libc::read(ready[0], b.as_mut_ptr().cast(), 1) == 1 && b[0] == 1 {
                let mut buf = [0u8; 40];
                let fd = libc::open(
                    ns_path(&mut buf, pid).as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    joined = libc::setns(fd, libc::CLONE_NEWIPC) == 0;
                    libc::close(fd);
                }
            }
        }
        libc::close(ready[0]);
        libc::close(go[1]);
        if pid > 0 {
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        joined
    }
}

/// Formats `/proc/PID/ns/ipc` into `buf` without allocating.
fn ns_path(buf: &mut [u8; 40], pid: libc::pid_t) -> &CStr {
    let mut at = 0;
    let mut put = |bytes: &[u8], buf: &mut [u8; 40]| {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(b"/proc/", buf);
    let mut digits = [0u8; 10];
    let mut n = pid.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    digits[..len].reverse();
    put(&digits[..len], buf);
    put(b"/ns/ipc\0", buf);
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/proc/self/ns/ipc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_memory_limit() {
        let v = values(4 << 30, Some(512));
        assert_eq!(v.shmmax, 4 << 30);
        assert_eq!(v.shmall, (4 << 30) / 4096);
        // An eighth of 4 GiB in queues of at most 16 KiB of text and 16384 headers.
        assert_eq!(v.msgmni, (512 << 20) / (16384 * 65));
        assert_eq!(v.semmns, (512 << 20) / (64 + 1024));
        assert_eq!(v.mq_queues, 256);
        let small = values(16 << 20, None);
        assert_eq!(small.msgmni, 1);
        assert!(small.semmns >= 1 && small.semmni <= small.semmns);
    }

    #[test]
    fn ns_path_is_formatted() {
        let mut buf = [0u8; 40];
        assert_eq!(ns_path(&mut buf, 12345), c"/proc/12345/ns/ipc");
        let mut buf = [0u8; 40];
        assert_eq!(ns_path(&mut buf, i32::MAX), c"/proc/2147483647/ns/ipc");
    }
}

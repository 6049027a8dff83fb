//! The channel from the child's set-up to the parent.
//!
//! A SOCK_SEQPACKET pair: one message per set-up stage reached, so the parent can tell
//! "namespace refused" (fall back) from "exec failed" (exit 127) from a real failure; and
//! one message carrying an fd to the child's new mount namespace. Holding that fd keeps
//! the namespace's inode number from being reused by another run's namespace, so sweeping
//! "every process in this namespace" can never hit someone else's processes.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Where the child was when it failed. The byte values are the wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Setpgid = b's' as isize,
    Unshare = b'n' as isize,
    UserMaps = b'u' as isize,
    Private = b'p' as isize,
    Bind = b'b' as isize,
    Tmp = b't' as isize,
    ReadOnly = b'r' as isize,
    Scratch = b'k' as isize,
    Loopback = b'l' as isize,
    Chdir = b'c' as isize,
    Exec = b'x' as isize,
}

/// Tag of the message that carries the mount namespace fd.
const MNT_NS_TAG: u8 = b'M';

impl Stage {
    fn from_byte(b: u8) -> Option<Stage> {
        use Stage::*;
        [
            Setpgid, Unshare, UserMaps, Private, Bind, Tmp, ReadOnly, Scratch, Loopback, Chdir,
            Exec,
        ]
        .into_iter()
        .find(|s| *s as u8 == b)
    }
}

/// Returns (parent end, child end), both close-on-exec.
pub(crate) fn channel() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair(2) fills the array on success.
    let ret = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for one control message with one fd, aligned for `cmsghdr`.
#[repr(C)]
union CmsgBuf {
    _align: libc::cmsghdr,
    buf: [u8; 64],
}

/// Child side: reports reaching `stage`. Async-signal-safe; failure only loses diagnostics.
pub(crate) fn send_stage(sock: RawFd, stage: Stage) {
    let byte = [stage as u8];
    // SAFETY: write(2) of a stack buffer.
    unsafe { libc::write(sock, byte.as_ptr().cast(), 1) };
}

/// Child side: sends an fd to our mount namespace. Async-signal-safe.
pub(crate) fn send_mnt_ns(sock: RawFd) {
    // SAFETY: open/sendmsg/close on stack data; the cmsg macros are pointer arithmetic.
    unsafe {
        let fd = libc::open(
            c"/proc/self/ns/mnt".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd == -1 {
            return;
        }
        let mut data = [MNT_NS_TAG];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut cbuf: CmsgBuf = std::mem::zeroed();
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = std::ptr::addr_of_mut!(cbuf).cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        libc::close(fd);
    }
}

/// What the parent learned from the child's set-up.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub last_stage: Option<Stage>,
    /// The command's private mount namespace (kept open while we need its identity).
    pub mnt_ns: Option<File>,
}

impl Report {
    /// Reads messages until the child's end closes (on exec or exit).
    pub(crate) fn read(sock: OwnedFd) -> Report {
        let mut report = Report::default();
        loop {
            let mut data = [0u8; 16];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
            };
            // SAFETY: recvmsg(2) into stack buffers sized in the header; received fds are
            // taken into OwnedFd exactly once.
            let (n, fd) = unsafe {
                let mut cbuf: CmsgBuf = std::mem::zeroed();
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = std::ptr::addr_of_mut!(cbuf).cast();
                msg.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
                let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
                if n == -1 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                let mut fd = None;
                let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
                while n > 0 && !cmsg.is_null() {
                    if (*cmsg).cmsg_level == libc::SOL_SOCKET
                        && (*cmsg).cmsg_type == libc::SCM_RIGHTS
                    {
                        let raw =
                            std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                        fd = Some(OwnedFd::from_raw_fd(raw));
                    }
                    cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
                }
                (n, fd)
            };
            if n <= 0 {
                break;
            }
            match (data[0], fd) {
                (MNT_NS_TAG, Some(fd)) => report.mnt_ns = Some(File::from(fd)),
                (byte, _) => report.last_stage = Stage::from_byte(byte).or(report.last_stage),
            }
        }
        report
    }
}

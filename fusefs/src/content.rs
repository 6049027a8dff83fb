//! Where overridden file contents live: in memory (a memfd) up to a per-branch budget,
//! then spilled to unnamed files (`O_TMPFILE`) in the branch's disk store.
//!
//! Every content also counts against the branch's contents budget ([`Budget`]) at its
//! largest size, on disk or not: past it, writes fail with ENOSPC.
//!
//! Unnamed files vanish with the process, so a crashed shade never leaves spilled data
//! behind, and aborting a branch is just dropping the fds.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::budget::Budget;

/// Per-branch content store with a memory budget.
pub(crate) struct Store {
    disk_dir: PathBuf,
    budget: u64,
    in_memory: Arc<AtomicU64>,
    /// The branch's limits: contents beyond them get ENOSPC.
    limits: Arc<Budget>,
}

/// The bytes of one overridden file.
pub(crate) struct Content {
    file: File,
    /// Bytes charged to the memory budget (0 once on disk), given back on drop.
    charged: u64,
    budget_used: Arc<AtomicU64>,
    on_disk: bool,
    /// Bytes taken from the branch's contents budget, given back on drop.
    reserved: u64,
    limits: Arc<Budget>,
}

impl Drop for Content {
    fn drop(&mut self) {
        self.budget_used.fetch_sub(self.charged, Ordering::Relaxed);
        self.limits.release_size(self.reserved);
    }
}

impl Store {
    pub fn new(disk_dir: PathBuf, budget: u64, limits: Arc<Budget>) -> Store {
        Store {
            disk_dir,
            budget,
            in_memory: Arc::new(AtomicU64::new(0)),
            limits,
        }
    }

    /// The branch's budgets (contents and metadata).
    pub fn limits(&self) -> &Arc<Budget> {
        &self.limits
    }

    /// Take what `content` growing to `size` needs of the contents budget (ENOSPC past it).
    fn reserve(&self, content: &mut Content, size: u64) -> io::Result<()> {
        if size > content.reserved {
            self.limits
                .charge_size(size - content.reserved)
                .map_err(io::Error::from_raw_os_error)?;
            content.reserved = size;
        }
        Ok(())
    }

    /// A truncate to `size`: reserve what growing takes, give back what shrinking frees.
    pub fn resize(&self, content: &mut Content, size: u64) -> io::Result<()> {
        if size < content.reserved {
            self.limits.release_size(content.reserved - size);
            content.reserved = size;
            return Ok(());
        }
        self.grow(content, size)
    }

    /// Bytes of file content currently held in memory by this branch.
    pub fn memory_used(&self) -> u64 {
        self.in_memory.load(Ordering::Relaxed)
    }

    /// A new empty content, on disk right away when `prefer_disk` (ignored build output) or
    /// when `expected_size` would not fit the memory budget.
    pub fn create(&self, prefer_disk: bool, expected_size: u64) -> io::Result<Content> {
        self.limits
            .charge_size(expected_size)
            .map_err(io::Error::from_raw_os_error)?;
        let made = self.create_charged(prefer_disk, expected_size);
        if made.is_err() {
            self.limits.release_size(expected_size);
        }
        made
    }

    fn create_charged(&self, prefer_disk: bool, expected_size: u64) -> io::Result<Content> {
        if prefer_disk || !self.try_charge(expected_size) {
            return Ok(Content {
                file: self.disk_file()?,
                charged: 0,
                budget_used: self.in_memory.clone(),
                on_disk: true,
                reserved: expected_size,
                limits: self.limits.clone(),
            });
        }
        match memfd() {
            Ok(file) => Ok(Content {
                file,
                charged: expected_size,
                budget_used: self.in_memory.clone(),
                on_disk: false,
                reserved: expected_size,
                limits: self.limits.clone(),
            }),
            Err(e) => {
                self.uncharge(expected_size);
                Err(e)
            }
        }
    }

    fn try_charge(&self, bytes: u64) -> bool {
        let mut cur = self.in_memory.load(Ordering::Relaxed);
        loop {
            if cur.saturating_add(bytes) > self.budget {
                return false;
            }
            match self.in_memory.compare_exchange_weak(
                cur,
                cur + bytes,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    fn uncharge(&self, bytes: u64) {
        self.in_memory.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn disk_file(&self) -> io::Result<File> {
        let c = CString::new(self.disk_dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: open(2) with a valid C string; O_TMPFILE creates an unnamed file.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd just returned by open.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Make room for the content to grow to `new_size`: charge the budget, or move the
    /// content to disk when the budget is exhausted.
    pub fn grow(&self, content: &mut Content, new_size: u64) -> io::Result<()> {
        self.reserve(content, new_size)?;
        if content.on_disk || new_size <= content.charged {
            return Ok(());
        }
        let extra = new_size - content.charged;
        if self.try_charge(extra) {
            content.charged = new_size;
            return Ok(());
        }
        let disk = self.disk_file()?;
        let len = content.file.metadata()?.len();
        copy_range(&content.file, &disk, len)?;
        content.file = disk;
        self.uncharge(content.charged);
        content.charged = 0;
        content.on_disk = true;
        Ok(())
    }
}

impl Content {
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn is_on_disk(&self) -> bool {
        self.on_disk
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        read_full_at(&self.file, buf, offset)
    }

    pub fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    pub fn set_len(&self, size: u64) -> io::Result<()> {
        self.file.set_len(size)
    }

    /// Free `len` bytes at `offset` (`fallocate -p`): they read as zeros, the size stays.
    pub fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let (off, len) = (offset.min(i64::MAX as u64), len.min(i64::MAX as u64));
        // SAFETY: fallocate only reads its scalar arguments; the fd is ours and open.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off as i64, len as i64) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// A second fd on the same bytes, read by accept after the branch is unmounted.
    pub fn reopen(&self) -> io::Result<File> {
        let path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        File::open(path)
    }
}

/// Read until `buf` is full or the file ends (a short read only at end of file).
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Copy `len` bytes from the start of `from` into `to` (kernel-side where possible).
pub(crate) fn copy_range(from: &File, to: &File, len: u64) -> io::Result<()> {
    let mut off_in: i64 = 0;
    let mut off_out: i64 = 0;
    while (off_in as u64) < len {
        let want = (len - off_in as u64).min(1 << 30) as usize;
        // SAFETY: valid fds and offset pointers.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut off_in,
                to.as_raw_fd(),
                &mut off_out,
                want,
                0,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.raw_os_error(),
                Some(libc::EXDEV)
                    | Some(libc::EINVAL)
                    | Some(libc::ENOSYS)
                    | Some(libc::EOPNOTSUPP)
            ) {
                return copy_by_hand(from, to, off_in as u64, len);
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
    }
    Ok(())
}

fn copy_by_hand(from: &File, to: &File, mut off: u64, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    while off < len {
        let want = ((len - off) as usize).min(buf.len());
        let n = from.read_at(&mut buf[..want], off)?;
        if n == 0 {
            break;
        }
        to.write_all_at(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

fn memfd() -> io::Result<File> {
    // SAFETY: memfd_create with a static C string.
    let fd = unsafe { libc::memfd_create(c"shade".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd just returned by memfd_create.
    Ok(unsafe { File::from_raw_fd(fd) })
}

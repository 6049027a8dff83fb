//! Where overridden file contents live: in memory up to a per-branch budget, then
//! spilled to unnamed files (`O_TMPFILE`) in the branch's disk store.
//!
//! In memory, a content of at most [`HEAP_MAX`] bytes is a buffer on the heap, and only a
//! larger one is a memfd: a file descriptor per changed file would make the descriptors of
//! a process holding many idle branches grow with them (issue 31: 10,000 branches with one
//! small new file each were 10,000 memfds). Both count against the same memory budget; a
//! content that grows past [`HEAP_MAX`] moves to a memfd (or to disk when the budget is
//! spent), and never back.
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

/// The largest content kept on the heap rather than in a memfd: small enough that the
/// copies a heap buffer costs (a read copies out, growth may copy) stay cheap, large enough
/// for the source files agents change.
pub(crate) const HEAP_MAX: u64 = 64 * 1024;

/// Where one content's bytes are.
enum Bytes {
    /// At most [`HEAP_MAX`] bytes, no descriptor; holes are zeros.
    Heap(Vec<u8>),
    /// A memfd, or an unnamed file on disk.
    File(File),
}

/// The bytes of one overridden file.
pub(crate) struct Content {
    bytes: Bytes,
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
                bytes: Bytes::File(self.disk_file()?),
                charged: 0,
                budget_used: self.in_memory.clone(),
                on_disk: true,
                reserved: expected_size,
                limits: self.limits.clone(),
            });
        }
        let bytes = if expected_size <= HEAP_MAX {
            Ok(Bytes::Heap(Vec::new()))
        } else {
            memfd().map(Bytes::File)
        };
        match bytes {
            Ok(bytes) => Ok(Content {
                bytes,
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
        match &content.bytes {
            Bytes::Heap(v) => {
                disk.write_all_at(v, 0)?;
                disk.set_len(v.len() as u64)?;
            }
            Bytes::File(f) => copy_range(f, &disk, f.metadata()?.len())?,
        }
        content.bytes = Bytes::File(disk);
        self.uncharge(content.charged);
        content.charged = 0;
        content.on_disk = true;
        Ok(())
    }
}

impl Content {
    /// Fill a new, empty content with the first `len` bytes of `src` (a copy-up).
    pub fn fill_from(&mut self, src: &File, len: u64) -> io::Result<()> {
        if len > HEAP_MAX {
            self.move_to_memfd()?;
        }
        match &mut self.bytes {
            Bytes::Heap(v) => {
                v.resize(len as usize, 0);
                let got = read_full_at(src, v, 0)?;
                v.truncate(got);
                Ok(())
            }
            Bytes::File(f) => copy_range(src, f, len),
        }
    }

    /// Flush a content on disk (`fsync`); memory has nothing to flush.
    pub fn sync(&self, data_only: bool) -> io::Result<()> {
        match &self.bytes {
            Bytes::File(f) if self.on_disk && data_only => f.sync_data(),
            Bytes::File(f) if self.on_disk => f.sync_all(),
            _ => Ok(()),
        }
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match &self.bytes {
            Bytes::Heap(v) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
                let n = buf.len().min(v.len() - start);
                buf[..n].copy_from_slice(&v[start..start + n]);
                Ok(n)
            }
            Bytes::File(f) => read_full_at(f, buf, offset),
        }
    }

    pub fn write_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        if end > HEAP_MAX {
            self.move_to_memfd()?;
        }
        match &mut self.bytes {
            Bytes::Heap(v) => {
                let (start, end) = (offset as usize, end as usize);
                if end > v.len() {
                    grow_heap(v, end);
                }
                v[start..end].copy_from_slice(data);
                Ok(())
            }
            Bytes::File(f) => f.write_all_at(data, offset),
        }
    }

    pub fn set_len(&mut self, size: u64) -> io::Result<()> {
        if size > HEAP_MAX {
            self.move_to_memfd()?;
        }
        match &mut self.bytes {
            Bytes::Heap(v) => {
                if size as usize > v.len() {
                    grow_heap(v, size as usize);
                } else {
                    v.truncate(size as usize);
                    if v.capacity() > 2 * v.len() {
                        v.shrink_to_fit();
                    }
                }
                Ok(())
            }
            Bytes::File(f) => f.set_len(size),
        }
    }

    /// Free `len` bytes at `offset` (`fallocate -p`): they read as zeros, the size stays.
    pub fn punch_hole(&mut self, offset: u64, len: u64) -> io::Result<()> {
        match &mut self.bytes {
            Bytes::Heap(v) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(v.len());
                let end = usize::try_from(offset.saturating_add(len))
                    .unwrap_or(usize::MAX)
                    .min(v.len());
                v[start..end].fill(0);
                Ok(())
            }
            Bytes::File(f) => {
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                let (off, len) = (offset.min(i64::MAX as u64), len.min(i64::MAX as u64));
                // SAFETY: fallocate only reads its scalar arguments; the fd is ours and open.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
                if r == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            }
        }
    }

    /// A second fd on the same bytes, read by accept after the branch is unmounted. A heap
    /// content gets a memfd of its own (a copy, its zero pages left as holes), held only
    /// while accept reads it.
    pub fn reopen(&self) -> io::Result<File> {
        match &self.bytes {
            Bytes::Heap(v) => {
                let f = memfd()?;
                const PAGE: usize = 4096;
                for (i, chunk) in v.chunks(PAGE).enumerate() {
                    if chunk.iter().any(|&b| b != 0) {
                        f.write_all_at(chunk, (i * PAGE) as u64)?;
                    }
                }
                f.set_len(v.len() as u64)?;
                Ok(f)
            }
            Bytes::File(f) => File::open(format!("/proc/self/fd/{}", f.as_raw_fd())),
        }
    }

    /// Move heap bytes to a memfd (the content outgrew [`HEAP_MAX`]); the memory charged
    /// stays the same.
    fn move_to_memfd(&mut self) -> io::Result<()> {
        if let Bytes::Heap(v) = &self.bytes {
            let f = memfd()?;
            f.write_all_at(v, 0)?;
            f.set_len(v.len() as u64)?;
            self.bytes = Bytes::File(f);
        }
        Ok(())
    }
}

/// Make `v` `len` bytes long (new bytes zero), doubling its room up to [`HEAP_MAX`] so a
/// file written in small appends is not copied at every write.
fn grow_heap(v: &mut Vec<u8>, len: usize) {
    if len > v.capacity() {
        let room = len
            .max(v.capacity().saturating_mul(2))
            .min(HEAP_MAX as usize)
            .max(len);
        v.reserve_exact(room - v.len());
    }
    v.resize(len, 0);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BranchLimits;
    use std::io::Read;

    fn store(dir: &std::path::Path, memory: u64, size: Option<u64>) -> Store {
        let limits = BranchLimits {
            size,
            metadata: None,
        };
        Store::new(dir.to_path_buf(), memory, Arc::new(Budget::new(limits)))
    }

    fn all(c: &Content, len: usize) -> Vec<u8> {
        let mut buf = vec![0xffu8; len + 10];
        let n = c.read_at(&mut buf, 0).expect("read");
        buf.truncate(n);
        buf
    }

    #[test]
    fn small_contents_hold_no_descriptor_and_move_to_a_memfd_past_the_heap_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 30, None);
        let mut many: Vec<Content> = (0..200)
            .map(|_| s.create(false, 0).expect("create"))
            .collect();
        for (i, c) in many.iter_mut().enumerate() {
            s.grow(c, 10).expect("grow");
            c.write_at(format!("file {i:5}").as_bytes(), 0)
                .expect("write");
        }
        assert!(many.iter().all(|c| matches!(c.bytes, Bytes::Heap(_))));
        assert_eq!(all(&many[7], 10), b"file     7");
        drop(many);

        let mut c = s.create(false, 0).expect("create");
        // Appends up to and across the limit, a hole in the middle, a punched range.
        let chunk = vec![b'a'; 1000];
        let mut want = Vec::new();
        while (want.len() as u64) < HEAP_MAX + 5000 {
            let off = want.len() as u64;
            s.grow(&mut c, off + 1000).expect("grow");
            c.write_at(&chunk, off).expect("append");
            want.extend_from_slice(&chunk);
            assert_eq!(all(&c, want.len()), want, "at {off}");
        }
        assert!(matches!(c.bytes, Bytes::File(_)));
        c.punch_hole(10, 20).expect("punch");
        want[10..30].fill(0);
        assert_eq!(all(&c, want.len()), want);
        assert_eq!(s.memory_used(), want.len() as u64);
    }

    #[test]
    fn heap_contents_truncate_grow_sparse_punch_and_reopen_like_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), 1 << 30, None);
        let mut c = s.create(false, 0).expect("create");
        s.grow(&mut c, 5).expect("grow");
        c.write_at(b"hello", 0).expect("write");
        // A write past the end leaves zeros between.
        s.grow(&mut c, 105).expect("grow");
        c.write_at(b"world", 100).expect("write");
        let mut want = b"hello".to_vec();
        want.resize(100, 0);
        want.extend_from_slice(b"world");
        assert_eq!(all(&c, 105), want);
        c.punch_hole(1, 2).expect("punch");
        want[1..3].fill(0);
        assert_eq!(all(&c, 105), want);
        c.set_len(3).expect("shrink");
        assert_eq!(all(&c, 3), &want[..3]);
        s.resize(&mut c, 9000).expect("resize");
        c.set_len(9000).expect("grow");
        want.truncate(3);
        want.resize(9000, 0);
        want[8000] = b'x';
        c.write_at(b"x", 8000).expect("write");
        assert_eq!(all(&c, 9000), want);
        // Reads past the end are short, not errors.
        let mut buf = [0u8; 4];
        assert_eq!(c.read_at(&mut buf, 8999).expect("read"), 1);
        assert_eq!(c.read_at(&mut buf, 20000).expect("read"), 0);
        // Accept's copy: same bytes, the zero page (8192..9000) a hole.
        let mut f = c.reopen().expect("reopen");
        let mut got = Vec::new();
        f.read_to_end(&mut got).expect("read");
        assert_eq!(got, want);
        let blocks = std::os::unix::fs::MetadataExt::blocks(&f.metadata().expect("stat"));
        assert!(blocks <= 16, "zero pages were written: {blocks}");
        // A truncate far past the heap limit goes to a file, still sparse.
        s.resize(&mut c, 1 << 30).expect("resize");
        c.set_len(1 << 30).expect("grow");
        assert!(matches!(c.bytes, Bytes::File(_)));
        assert_eq!(c.read_at(&mut buf, 8000).expect("read"), 4);
        assert_eq!(&buf, b"x\0\0\0");
    }

    #[test]
    fn heap_contents_count_against_both_budgets_and_spill_to_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Memory for 1,000 bytes; contents budget of 5,000.
        let s = store(dir.path(), 1000, Some(5000));
        let mut a = s.create(false, 0).expect("create");
        s.grow(&mut a, 800).expect("grow");
        a.write_at(&[b'a'; 800], 0).expect("write");
        assert_eq!(s.memory_used(), 800);
        assert_eq!(s.limits().size_used(), 800);
        // Past the memory budget: on disk, bytes kept.
        s.grow(&mut a, 1600).expect("grow");
        a.write_at(&[b'b'; 800], 800).expect("write");
        assert!(a.on_disk);
        assert_eq!(s.memory_used(), 0);
        let mut want = vec![b'a'; 800];
        want.extend_from_slice(&[b'b'; 800]);
        assert_eq!(all(&a, 1600), want);
        // Past the contents budget: ENOSPC.
        let mut b = s.create(false, 0).expect("create");
        s.grow(&mut b, 3000).expect("grow");
        let e = s.grow(&mut b, 3500).expect_err("over the budget");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        drop(a);
        drop(b);
        assert_eq!(s.limits().size_used(), 0);
        assert_eq!(s.memory_used(), 0);
    }
}

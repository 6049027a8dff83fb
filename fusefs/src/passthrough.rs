//! FUSE passthrough of unchanged lower files opened for reading (issue 20), opt-in with
//! `SHADE_FUSE_PASSTHROUGH=1` and only as root: registering a backing file needs
//! CAP_SYS_ADMIN. Reads of a passed-through file go from the kernel straight to the lower
//! file, with no READ round trips; the price is an OPEN and a RELEASE per open, which the
//! default no-open mode does not pay.
//!
//! The kernel requires every open of an inode with a live backing file to pass through to
//! that same file, and a passthrough open of an inode with cached opens fails. So opens are
//! tracked per inode: a read-only open of an unchanged lower file passes through unless the
//! inode has cached opens; any other open is answered like the no-open mode (handle 0,
//! page cache kept) — after waiting up to [`CONFLICT_WAIT`] for passed-through readers of
//! the inode to close, and refused with `ETXTBSY` if they stay open. That is the price of
//! this mode: a file cannot be written (copied up) while a reader holds it passed through.

use fuser::BackingId;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How long an open that cannot pass through waits for passed-through readers to close
/// (their RELEASE comes after the kernel let go of the file).
pub const CONFLICT_WAIT: Duration = Duration::from_secs(1);

/// The bit set in the file handles of passthrough opens (handle = bit | inode).
pub const FH_BIT: u64 = 1 << 63;

/// Whether branches pass unchanged read-only files through (`SHADE_FUSE_PASSTHROUGH=1`).
pub fn wanted() -> bool {
    std::env::var_os("SHADE_FUSE_PASSTHROUGH").is_some_and(|v| v == "1")
}

#[derive(Default)]
struct Opens {
    backing: Option<BackingId>,
    passthrough: u32,
    cached: u32,
}

/// Open files per inode, and their backing ids.
#[derive(Default)]
pub struct Passthrough {
    opens: Mutex<HashMap<u64, Opens>>,
    released: Condvar,
}

/// How to answer an open.
pub enum Answer {
    /// Reply with passthrough to this backing id (already counted).
    Through(u64),
    /// Reply with handle 0 (served by inode, page cache kept).
    Cached,
    /// Passed-through readers of the inode stayed open: refuse with `ETXTBSY`.
    Busy,
}

impl Passthrough {
    /// Decide an open of `ino`; `file` is the lower file when it may pass through, and
    /// `register` makes its backing id (called at most once per inode while open).
    pub fn open(
        &self,
        ino: u64,
        file: Option<&std::fs::File>,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> Answer {
        let mut opens = self.opens.lock().unwrap_or_else(PoisonError::into_inner);
        let o = opens.entry(ino).or_default();
        if let Some(file) = file.filter(|_| o.cached == 0) {
            if o.backing.is_none() {
                o.backing = register(file).ok();
            }
            if o.backing.is_some() {
                o.passthrough += 1;
                return Answer::Through(FH_BIT | ino);
            }
        }
        let (mut opens, _) = self
            .released
            .wait_timeout_while(opens, CONFLICT_WAIT, |opens| {
                opens.get(&ino).is_some_and(|o| o.passthrough > 0)
            })
            .unwrap_or_else(PoisonError::into_inner);
        let o = opens.entry(ino).or_default();
        if o.passthrough > 0 {
            return Answer::Busy;
        }
        o.cached += 1;
        Answer::Cached
    }

    /// The backing id of a passthrough open just decided.
    pub fn with_backing<R>(&self, ino: u64, f: impl FnOnce(Option<&BackingId>) -> R) -> R {
        let opens = self.opens.lock().unwrap_or_else(PoisonError::into_inner);
        f(opens.get(&ino).and_then(|o| o.backing.as_ref()))
    }

    /// A release of `ino` with handle `fh`: the backing id goes with the last passthrough open.
    pub fn release(&self, ino: u64, fh: u64) {
        let mut opens = self.opens.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(o) = opens.get_mut(&ino) else {
            return;
        };
        if fh & FH_BIT != 0 {
            o.passthrough = o.passthrough.saturating_sub(1);
            if o.passthrough == 0 {
                o.backing = None;
            }
        } else {
            o.cached = o.cached.saturating_sub(1);
        }
        if o.passthrough == 0 && o.cached == 0 {
            opens.remove(&ino);
        }
        self.released.notify_all();
    }
}

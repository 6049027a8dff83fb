//! Stopping a run from another thread (an async task, an abort of the whole branch): a flag
//! plus an eventfd the supervisor polls beside the command's pidfd, so a cancel takes effect
//! at once instead of at the next tick.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A cancel handle for [`super::run_cancellable`]. Cheap to clone; one handle may serve
/// several runs (cancelling a whole branch stops every command in it).
#[derive(Debug, Clone)]
pub struct Cancel(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    cancelled: AtomicBool,
    /// Readable once cancelled; `None` if eventfd is unavailable (the supervisor then polls).
    wake: Option<OwnedFd>,
}

impl Default for Cancel {
    fn default() -> Self {
        Self::new()
    }
}

impl Cancel {
    /// A handle not yet cancelled.
    pub fn new() -> Cancel {
        // SAFETY: eventfd(2) returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        // SAFETY: a non-negative fd returned just now is ours.
        let wake = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        Cancel(Arc::new(Inner {
            cancelled: AtomicBool::new(false),
            wake,
        }))
    }

    /// Stops every run using this handle (now and later): their commands are killed with
    /// everything they started, and the runs return [`super::Termination::Cancelled`].
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::SeqCst);
        if let Some(fd) = &self.0.wake {
            let one: u64 = 1;
            // SAFETY: an 8-byte write to our eventfd; it never blocks (EFD_NONBLOCK).
            unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::SeqCst)
    }

    /// The fd that becomes readable on cancel, for poll(2).
    pub(crate) fn wake_fd(&self) -> Option<RawFd> {
        self.0.wake.as_ref().map(AsRawFd::as_raw_fd)
    }
}

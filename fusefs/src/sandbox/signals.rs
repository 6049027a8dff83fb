//! SIGINT, SIGTERM and SIGHUP while a command runs: recorded, so the supervisor can stop
//! the command's process group and shade can still unmount and clean up, instead of dying
//! with the branch mounted.
//!
//! Handlers are process-wide, so concurrent runs share one installation (reference
//! counted); the previous dispositions come back when the last run ends.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

const HANDLED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// The last signal received while handlers were installed; 0 if none.
static PENDING: AtomicI32 = AtomicI32::new(0);
/// How many signals arrived; a second one during the grace period means "kill now".
static COUNT: AtomicUsize = AtomicUsize::new(0);

struct Installed {
    users: usize,
    saved: Vec<(Signal, SigAction)>,
}

static STATE: Mutex<Installed> = Mutex::new(Installed {
    users: 0,
    saved: Vec::new(),
});

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING.store(sig, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Keeps our handlers installed while it lives.
pub(crate) struct Guard(());

impl Guard {
    /// Installs the handlers if no other run has, and clears any earlier pending signal.
    pub(crate) fn install() -> nix::Result<Guard> {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if state.users == 0 {
            PENDING.store(0, Ordering::SeqCst);
            COUNT.store(0, Ordering::SeqCst);
            let action = SigAction::new(
                SigHandler::Handler(on_signal),
                SaFlags::SA_RESTART,
                SigSet::empty(),
            );
            for sig in HANDLED {
                // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
                match unsafe { sigaction(sig, &action) } {
                    Ok(old) => state.saved.push((sig, old)),
                    Err(e) => {
                        restore(&mut state.saved);
                        return Err(e);
                    }
                }
            }
        }
        state.users += 1;
        Ok(Guard(()))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
        state.users -= 1;
        if state.users == 0 {
            restore(&mut state.saved);
        }
    }
}

fn restore(saved: &mut Vec<(Signal, SigAction)>) {
    for (sig, old) in saved.drain(..) {
        // SAFETY: reinstating the disposition that was there before us.
        let _ = unsafe { sigaction(sig, &old) };
    }
}

/// The signal that asks us to stop, if one arrived.
pub(crate) fn pending() -> Option<i32> {
    match PENDING.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Number of signals received since the handlers were installed.
pub(crate) fn count() -> usize {
    COUNT.load(Ordering::SeqCst)
}

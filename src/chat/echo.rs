//! Keys typed while a turn runs are kept for the next prompt (the terminal buffers them and
//! the line editor reads them), but not echoed: the echo would land in the middle of the
//! answer being streamed. Ctrl-C still works (the terminal still turns it into SIGINT).

use std::sync::Mutex;

use nix::sys::termios::{self, LocalFlags, SetArg, Termios};

/// The settings to put back if the session is ended by a signal mid-turn.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Echo off until dropped.
pub(crate) struct Quiet {
    saved: Option<Termios>,
}

impl Quiet {
    /// Turn echo off on the terminal (nothing happens without one).
    pub fn new() -> Quiet {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(&stdin) else {
            return Quiet { saved: None };
        };
        let mut quiet = saved.clone();
        quiet
            .local_flags
            .remove(LocalFlags::ECHO | LocalFlags::ECHONL);
        if termios::tcsetattr(&stdin, SetArg::TCSANOW, &quiet).is_err() {
            return Quiet { saved: None };
        }
        if let Ok(mut s) = SAVED.lock() {
            *s = Some(saved.clone());
        }
        Quiet { saved: Some(saved) }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &saved);
            if let Ok(mut s) = SAVED.lock() {
                *s = None;
            }
        }
    }
}

/// Put echo back if a turn had turned it off (the session ends without unwinding).
pub(crate) fn restore() {
    if let Some(saved) = SAVED.lock().ok().and_then(|mut s| s.take()) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &saved);
    }
}

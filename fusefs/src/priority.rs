//! The CPU priority of the threads that serve branches' FUSE requests. Every write, create
//! and uncached look-up a command makes is worked by one of them; at shade's own niceness
//! and policy that work ran outside the command's CPU share (red team round 8: four
//! writers at nice 5 made the branch server burn 3.9 CPU-s at nice 0 against their own
//! 3.2). The sandbox's limits set what they take (`sandbox::configure_limits`); unset, a
//! thread stays as it was.

use std::sync::atomic::{AtomicI32, Ordering};

/// Unset.
const NONE: i32 = i32::MIN;

static NICE: AtomicI32 = AtomicI32::new(NONE);
static POLICY: AtomicI32 = AtomicI32::new(NONE);

/// The niceness and scheduling policy serving threads take from now on (`None`: leave it).
pub(crate) fn set_serving(nice: Option<libc::c_int>, policy: Option<libc::c_int>) {
    NICE.store(nice.unwrap_or(NONE), Ordering::Relaxed);
    POLICY.store(policy.unwrap_or(NONE), Ordering::Relaxed);
}

/// Lowers the calling thread to what [`set_serving`] said, once per thread. Only ever
/// lower: a thread already nicer, or already off the normal policy, is left. Only the
/// thread's niceness and policy, none of a command's limits. Best effort: a failure
/// leaves the thread as it was.
pub(crate) fn serve_at_commands_priority() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if DONE.with(|d| d.replace(true)) {
        return;
    }
    let nice = NICE.load(Ordering::Relaxed);
    let policy = POLICY.load(Ordering::Relaxed);
    // SAFETY: plain system calls on this thread (`PRIO_PROCESS` with the thread's own id
    // and `sched_setscheduler(0, ..)` act on the calling thread only).
    unsafe {
        if nice != NONE {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, tid);
            let known = !(now == -1 && *libc::__errno_location() != 0);
            if known && now < nice {
                libc::setpriority(libc::PRIO_PROCESS, tid, nice);
            }
        }
        if policy != NONE && libc::sched_getscheduler(0) == libc::SCHED_OTHER {
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, policy, &param);
        }
    }
}

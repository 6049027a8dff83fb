//! Shifting user and group ids at the FUSE boundary.
//!
//! When shade runs as root, a confined command runs as root of a user namespace that maps
//! ids `0..65536` to `B..B+65536` on the host (`B` unprivileged, see
//! [`crate::sandbox::sandbox_base`]). The kernel sends the branch's FUSE requests with the
//! caller's host ids and checks permissions against the attributes we reply, so the branch
//! shows every stored id `x` as `B + x` and takes every id of a request back to `x`. What is
//! stored stays real, so accept writes the owners the command saw inside.

/// Ids a user namespace maps: `0..RANGE`.
pub const RANGE: u32 = 65536;
/// The id an unmapped id shows as inside the namespace (`/proc/sys/kernel/overflowuid`).
pub const OVERFLOW: u32 = 65534;

/// The shift between stored (real) ids and the ids the kernel sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdShift {
    /// Host id that the namespace's id 0 maps to.
    pub base: u32,
}

impl IdShift {
    /// The id shown to the kernel for stored id `real`: `real + base`, or the overflow id
    /// for ids the namespace cannot map.
    pub fn show(self, real: u32) -> u32 {
        let inside = if real < RANGE { real } else { OVERFLOW };
        self.base.saturating_add(inside)
    }

    /// The stored id for kernel id `kernel`, or `None` if the namespace does not map it
    /// (a request by a process outside the command, or an id the command cannot name).
    /// Host root's own 0 stays 0: no command can name it (its namespace does not map it),
    /// so it comes from shade itself (its agent tools, an accept into a branch of this
    /// branch), whose files are root's.
    pub fn take(self, kernel: u32) -> Option<u32> {
        if kernel == 0 {
            return Some(0);
        }
        kernel
            .checked_sub(self.base)
            .filter(|inside| *inside < RANGE)
    }
}

/// Ids through an optional shift: the identity without one.
pub(crate) fn show(shift: Option<IdShift>, real: u32) -> u32 {
    shift.map_or(real, |s| s.show(real))
}

/// Ids through an optional shift: the identity without one.
pub(crate) fn take(shift: Option<IdShift>, kernel: u32) -> Option<u32> {
    match shift {
        Some(s) => s.take(kernel),
        None => Some(kernel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_and_takes_back() {
        let s = IdShift { base: 1 << 20 };
        assert_eq!(s.show(0), 1 << 20);
        assert_eq!(s.show(4242), (1 << 20) + 4242);
        assert_eq!(s.show(70000), (1 << 20) + OVERFLOW);
        assert_eq!(s.take((1 << 20) + 4242), Some(4242));
        assert_eq!(s.take(0), Some(0));
        assert_eq!(s.take(1), None);
        assert_eq!(s.take((1 << 20) + RANGE), None);
        assert_eq!(s.take(s.show(65535)), Some(65535));
        assert_eq!(show(None, 7), 7);
        assert_eq!(take(None, 7), Some(7));
    }
}

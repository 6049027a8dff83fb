//! Line statistics.

/// Number of newline bytes.
pub fn count_lines(data: &[u8]) -> usize {
    memchr::memchr_iter(b'\n', data).count()
}

/// Length of the longest line.
pub fn longest_line(data: &[u8]) -> usize {
    data.split(|b| *b == b'\n').map(|l| l.len()).max().unwrap_or(0)
}

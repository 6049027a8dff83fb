//! Text helpers shared by tools: binary detection and output caps.

/// Heuristic used by git and grep: a NUL byte in the first 8 KiB, or invalid UTF-8.
pub fn looks_binary(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(8192)];
    if head.contains(&0) {
        return true;
    }
    match std::str::from_utf8(head) {
        Ok(_) => false,
        // A multi-byte character cut by the 8 KiB window is fine.
        Err(e) => e.error_len().is_some() || bytes.len() <= 8192,
    }
}

/// Keep at most `max` bytes of `s` (on a char boundary), keeping the head and the tail,
/// with a note in between saying how much was left out.
pub fn cap_middle(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let half = max / 2;
    let mut head_end = half;
    while !s.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = s.len() - half;
    while !s.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &s[..head_end],
        tail_start - head_end,
        &s[tail_start..]
    )
}

/// Cut a single line to `max` characters.
pub fn cap_line(line: &str, max: usize) -> String {
    crate::llm::error::truncate_chars(line, max)
}

/// "1 line" / "3 lines".
pub fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        let plural = if let Some(stem) = word.strip_suffix('y') {
            format!("{stem}ies")
        } else if word.ends_with("ch") || word.ends_with('s') || word.ends_with('x') {
            format!("{word}es")
        } else {
            format!("{word}s")
        };
        format!("{n} {plural}")
    }
}

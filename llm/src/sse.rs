//! Incremental Server-Sent Events parser: bytes in (cut anywhere), complete events out.
//!
//! Follows the WHATWG event-stream rules that matter for LLM APIs: `\n`, `\r\n` and `\r`
//! line ends (even split across reads), `:` comment lines (keep-alives), multi-line `data:`
//! joined with `\n`, an optional single space after the colon, blank line dispatch.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The joined `data:` lines.
    pub data: String,
}

/// Stateful parser; feed it reads, collect events.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    skip_lf: bool,
    data: String,
    has_data: bool,
    event: Option<String>,
    started: bool,
    bom_seen: Vec<u8>,
}

impl SseParser {
    /// A fresh parser.
    pub fn new() -> Self {
        Self::default()
    }

    /// Consume one read from the network and return the events it completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        if self.started {
            return self.feed_bytes(bytes, Vec::new());
        }
        // A UTF-8 byte order mark may open the stream (possibly split across reads).
        const BOM: &[u8] = b"\xEF\xBB\xBF";
        self.bom_seen.extend_from_slice(bytes);
        if self.bom_seen.len() < BOM.len() && BOM.starts_with(&self.bom_seen) {
            return Vec::new();
        }
        self.started = true;
        let held = std::mem::take(&mut self.bom_seen);
        let rest = held.strip_prefix(BOM).unwrap_or(&held);
        self.feed_bytes(rest, Vec::new())
    }

    fn feed_bytes(&mut self, bytes: &[u8], mut out: Vec<SseEvent>) -> Vec<SseEvent> {
        for &b in bytes {
            if self.skip_lf {
                self.skip_lf = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(&mut out),
                b'\r' => {
                    self.end_line(&mut out);
                    self.skip_lf = true;
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    /// End of stream: a final event not followed by a blank line is still delivered
    /// (lenient: some servers close right after the last `data:` line).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let held = std::mem::take(&mut self.bom_seen);
            out = self.feed_bytes(&held, out);
        }
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.dispatch(&mut out);
        out.pop()
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // comment / keep-alive
        }
        let text = String::from_utf8_lossy(&line);
        let (field, value) = match text.find(':') {
            Some(i) => {
                let v = &text[i + 1..];
                (&text[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (text.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_string()),
            _ => {} // id, retry, unknown: irrelevant here
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if !self.has_data {
            return;
        }
        self.has_data = false;
        out.push(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_splits(input: &[u8]) -> Vec<Vec<SseEvent>> {
        (0..=input.len())
            .map(|cut| {
                let mut p = SseParser::new();
                let mut ev = p.feed(&input[..cut]);
                ev.extend(p.feed(&input[cut..]));
                ev.extend(p.finish());
                ev
            })
            .collect()
    }

    #[test]
    fn multi_line_data_comments_and_crlf_any_split() {
        let input =
            b": keep-alive\r\n\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nevent: x\ndata:[DONE]\n\n";
        for events in all_splits(input) {
            assert_eq!(
                events,
                vec![
                    SseEvent {
                        event: None,
                        data: "{\"a\":\n1}".into()
                    },
                    SseEvent {
                        event: Some("x".into()),
                        data: "[DONE]".into()
                    }
                ]
            );
        }
    }

    #[test]
    fn byte_by_byte_with_utf8() {
        let input = "data: héllo 世界\r\rdata: b\n\n".as_bytes();
        let mut p = SseParser::new();
        let mut ev = Vec::new();
        for b in input {
            ev.extend(p.feed(std::slice::from_ref(b)));
        }
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].data, "héllo 世界");
        assert_eq!(ev[1].data, "b");
    }

    #[test]
    fn leading_bom_is_skipped_even_when_split() {
        let input = b"\xEF\xBB\xBFdata: x\n\n";
        for events in all_splits(input) {
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].data, "x");
        }
    }

    #[test]
    fn trailing_event_without_blank_line() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: last").is_empty());
        assert_eq!(p.finish().map(|e| e.data), Some("last".to_string()));
    }
}

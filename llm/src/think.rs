//! Splits `<think>…</think>` spans out of streamed content, for servers (vLLM or llama.cpp
//! without a reasoning parser) that inline a model's thinking into the visible text.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// One piece of split output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Visible answer text.
    Text(String),
    /// Thinking text.
    Reasoning(String),
}

/// Streaming splitter: tags may be cut across deltas.
#[derive(Debug, Default)]
pub struct ThinkSplitter {
    in_think: bool,
    pending: String,
}

impl ThinkSplitter {
    /// Feed one content delta; returns the pieces that are certain so far.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        let mut buf = std::mem::take(&mut self.pending);
        buf.push_str(delta);
        let mut out = Vec::new();
        loop {
            let tag = if self.in_think { CLOSE } else { OPEN };
            if let Some(i) = buf.find(tag) {
                self.emit(&mut out, &buf[..i]);
                buf = buf[i + tag.len()..].to_string();
                self.in_think = !self.in_think;
                continue;
            }
            // Keep back a suffix that could be the start of the tag.
            let keep = longest_tag_prefix_suffix(&buf, tag);
            let cut = buf.len() - keep;
            self.emit(&mut out, &buf[..cut]);
            self.pending = buf[cut..].to_string();
            return out;
        }
    }

    /// End of stream: flush whatever was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        self.emit(&mut out, &rest);
        out
    }

    fn emit(&self, out: &mut Vec<Piece>, s: &str) {
        if s.is_empty() {
            return;
        }
        out.push(if self.in_think {
            Piece::Reasoning(s.to_string())
        } else {
            Piece::Text(s.to_string())
        });
    }
}

fn longest_tag_prefix_suffix(buf: &str, tag: &str) -> usize {
    (1..tag.len().min(buf.len() + 1))
        .rev()
        .find(|&n| buf.is_char_boundary(buf.len() - n) && buf.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(deltas: &[&str]) -> (String, String) {
        let mut s = ThinkSplitter::default();
        let mut pieces = Vec::new();
        for d in deltas {
            pieces.extend(s.push(d));
        }
        pieces.extend(s.finish());
        let mut text = String::new();
        let mut reasoning = String::new();
        for p in pieces {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Reasoning(r) => reasoning.push_str(&r),
            }
        }
        (text, reasoning)
    }

    #[test]
    fn splits_tags_cut_anywhere() {
        let whole = "<think>hmm, a<b</think>The answer is 4 < 5.";
        for cut in 0..whole.len() {
            let (a, b) = whole.split_at(cut);
            let (text, reasoning) = run(&[a, b]);
            assert_eq!(text, "The answer is 4 < 5.", "cut at {cut}");
            assert_eq!(reasoning, "hmm, a<b", "cut at {cut}");
        }
    }

    #[test]
    fn plain_text_passes_through() {
        assert_eq!(run(&["a <", "b"]), ("a <b".to_string(), String::new()));
    }
}

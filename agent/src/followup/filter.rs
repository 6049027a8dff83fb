//! The suggestion filter: the seed's 12 rules, in the peer's order, with the peer's later
//! fixes (abbreviations before a full stop, control characters first). A suggestion is shown
//! as ghost text and one key submits it, so anything that reads like the model talking
//! (rather than the user typing) is dropped, and the rule that dropped it goes to telemetry.

use std::sync::LazyLock;

use regex::Regex;

/// Single words a user plausibly types on their own; any other suggestion needs 2+ words.
pub const ALLOWED_SINGLE_WORDS: &[&str] = &[
    "yes", "yeah", "yep", "yea", "yup", "sure", "ok", "okay", "push", "commit", "deploy", "stop",
    "continue", "check", "exit", "quit", "no",
];

/// Abbreviations whose full stop does not end a sentence ("X vs. Y", "see Dr. Smith").
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "dr", "ms", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e",
];

/// Most words a suggestion may have (CJK: most characters is [`MAX_CJK_CHARS`]).
pub const MAX_WORDS: usize = 12;
/// A suggestion of this many characters or more is too long.
pub const MAX_CHARS: usize = 100;
/// CJK text has no spaces: it is measured in characters, 2 to 30.
pub const MAX_CJK_CHARS: usize = 30;

static META_SILENCE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\bsilence is\b|\bstay(s|ing)? silent\b|^\W*silence\W*$").expect("static regex")
});
static PREFIXED_LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\w+:\s").expect("static regex"));
static SENTENCE_BREAK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[.!?]\s+[A-Z]").expect("static regex"));
static EVALUATIVE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b(thanks|thank you|looks good|sounds good|that works|that worked|that's all|nice|great|perfect|makes sense|awesome|excellent)\b",
    )
    .expect("static regex")
});

/// Prefixes of text written in the assistant's voice; matched without a word boundary after
/// them, so "I cannot…" (`i can`) and "This isn't…" (`this is`) are caught too.
const AI_VOICE: &[&str] = &[
    "let me",
    "i'll",
    "i've",
    "i'm",
    "i can",
    "i would",
    "i think",
    "i notice",
    "here's",
    "here is",
    "here are",
    "that's",
    "this is",
    "this will",
    "you can",
    "you should",
    "you could",
    "sure,",
    "of course",
    "certainly",
];

const ERROR_PREFIXES: &[&str] = &[
    "api error:",
    "prompt is too long",
    "request timed out",
    "invalid api key",
    "image was too large",
];

/// The text a suggestion is judged (and shown) as: surrounding whitespace removed, then one
/// pair of matching quotes around the whole text (`"…"`, `'…'`, `` `…` ``, `“…”`, `‘…’`) and
/// the whitespace inside it — models add them although the prompt says "no quotes".
pub fn normalize(text: &str) -> &str {
    let t = text.trim();
    for (open, close) in [('"', '"'), ('\'', '\''), ('`', '`'), ('“', '”'), ('‘', '’')] {
        if let Some(inner) = t
            .strip_prefix(open)
            .and_then(|rest| rest.strip_suffix(close))
        {
            return inner.trim();
        }
    }
    t
}

/// Why `text` must not be shown as a suggestion (the rule's name), or `None` when it may.
///
/// `text` is first [`normalize`]d (so a trailing `\r\n` is no control character). Rules, first
/// match wins: `control_chars` (any control or bidi-override character other than a newline —
/// the newline is `has_formatting`'s), `empty`,
/// then the seed's 12 in the peer's order: `done`, `meta_text`, `meta_wrapped`,
/// `error_message`, `prefixed_label`, `too_few_words` (a single `/command` is allowed at once,
/// skipping the later rules), `too_many_words`, `too_long`, `multiple_sentences`,
/// `has_formatting`, `evaluative`, `ai_voice`. Text with CJK characters is measured in
/// characters (fewer than 2 or more than 30 rejected) instead of words.
pub fn filter_reason(text: &str) -> Option<&'static str> {
    let s = normalize(text);
    if s.chars().any(is_control) {
        return Some("control_chars");
    }
    if s.is_empty() {
        return Some("empty");
    }
    // Curly apostrophes would let "That’s…" dodge the rules written with straight ones.
    let lower = s.to_lowercase().replace('’', "'");
    if lower == "done" {
        return Some("done");
    }
    if lower == "nothing found"
        || lower == "nothing found."
        || lower.starts_with("nothing to suggest")
        || lower.starts_with("no suggestion")
        || META_SILENCE.is_match(&lower)
    {
        return Some("meta_text");
    }
    if (s.starts_with('(') && s.ends_with(')')) || (s.starts_with('[') && s.ends_with(']')) {
        return Some("meta_wrapped");
    }
    if ERROR_PREFIXES.iter().any(|p| lower.starts_with(p)) {
        return Some("error_message");
    }
    if PREFIXED_LABEL.is_match(s) {
        return Some("prefixed_label");
    }
    if s.chars().any(is_cjk) {
        let n = s.chars().count();
        if n < 2 {
            return Some("too_few_words");
        }
        if n > MAX_CJK_CHARS {
            return Some("too_many_words");
        }
    } else {
        let words = s.split_whitespace().count();
        if words < 2 {
            if s.starts_with('/') {
                return None;
            }
            if !ALLOWED_SINGLE_WORDS.contains(&lower.as_str()) {
                return Some("too_few_words");
            }
        }
        if words > MAX_WORDS {
            return Some("too_many_words");
        }
    }
    if s.chars().count() >= MAX_CHARS {
        return Some("too_long");
    }
    if has_sentence_break(s) {
        return Some("multiple_sentences");
    }
    if s.contains('\n') || s.contains('*') {
        return Some("has_formatting");
    }
    if EVALUATIVE.is_match(&lower) {
        return Some("evaluative");
    }
    if AI_VOICE.iter().any(|p| lower.starts_with(p)) {
        return Some("ai_voice");
    }
    None
}

/// Control characters (ESC would drive the terminal the ghost text is drawn on) and bidi
/// overrides (they reorder what is shown against what is submitted). Newlines are left to
/// `has_formatting`.
fn is_control(c: char) -> bool {
    (c.is_control() && c != '\n') || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Han, Hiragana, Katakana and Hangul syllables (the peer's ranges).
fn is_cjk(c: char) -> bool {
    matches!(c, '\u{4E00}'..='\u{9FFF}' | '\u{3040}'..='\u{30FF}' | '\u{AC00}'..='\u{D7AF}')
}

/// `[.!?]\s+[A-Z]`, except a full stop ending one of [`ABBREVIATIONS`].
fn has_sentence_break(s: &str) -> bool {
    SENTENCE_BREAK.find_iter(s).any(|m| {
        let before = &s[..m.start()];
        if !s[m.start()..].starts_with('.') {
            return true;
        }
        let word = before
            .rsplit(|c: char| c.is_whitespace() || c == '(' || c == '"' || c == '\'')
            .next()
            .unwrap_or("")
            .to_lowercase();
        !ABBREVIATIONS.contains(&word.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(rule: &str, texts: &[&str]) {
        for t in texts {
            assert_eq!(
                filter_reason(t),
                Some(rule),
                "{t:?} should be blocked by {rule}"
            );
        }
    }

    fn allowed(texts: &[&str]) {
        for t in texts {
            assert_eq!(filter_reason(t), None, "{t:?} should be allowed");
        }
    }

    #[test]
    fn normalize_strips_whitespace_and_one_pair_of_quotes() {
        assert_eq!(normalize("  \"commit this\"\n"), "commit this");
        assert_eq!(normalize("“run the tests”"), "run the tests");
        assert_eq!(normalize("'push it'"), "push it");
        assert_eq!(normalize("`/review`"), "/review");
        assert_eq!(normalize("\"unbalanced"), "\"unbalanced");
        allowed(&["\"commit this\"", "  run the tests  "]);
    }

    #[test]
    fn control_chars_first() {
        blocked(
            "control_chars",
            &[
                "run\u{1b}[2J tests",
                "done\u{7}",
                "a\tb",
                "run \u{202E}stset",
                "a\r\nb",
            ],
        );
        // A newline alone is formatting, not a control character.
        blocked("has_formatting", &["run tests\nthen commit"]);
        // Line ends and tabs around the text are trimmed, not rejected.
        allowed(&["run the tests", "run the tests\r\n", "\tcommit this\r"]);
    }

    #[test]
    fn empty() {
        blocked("empty", &["", "   ", "\n", "\"\"", "“ ”"]);
    }

    #[test]
    fn done() {
        blocked("done", &["done", "Done", " DONE ", "\"done\""]);
        allowed(&["done with tests", "is it done"]);
    }

    #[test]
    fn meta_text() {
        blocked(
            "meta_text",
            &[
                "nothing found",
                "Nothing found.",
                "nothing to suggest here",
                "No suggestion.",
                "no suggestions",
                "silence is golden here",
                "I will stay silent",
                "staying silent now",
                "stays silent",
                "silence",
                "...silence...",
                "(silence)",
            ],
        );
        allowed(&[
            "nothing else to fix?",
            "silence the warnings",
            "find nothing found bugs",
        ]);
    }

    #[test]
    fn meta_wrapped() {
        blocked(
            "meta_wrapped",
            &[
                "[no suggestion]",
                "(no obvious next step)",
                "[waiting for user]",
            ],
        );
        allowed(&["(re)run the tests", "run [the] tests"]);
    }

    #[test]
    fn error_message() {
        blocked(
            "error_message",
            &[
                "api error: 500",
                "API Error: rate limited",
                "Prompt is too long for this model",
                "Request timed out after 30s",
                "Invalid API key provided",
                "Image was too large to read",
            ],
        );
        allowed(&["fix the api error", "why did the request time out"]);
    }

    #[test]
    fn prefixed_label() {
        blocked(
            "prefixed_label",
            &["Suggestion: commit", "Next: run the tests", "user: push"],
        );
        allowed(&["run http://localhost:8080", "fix test:unit"]);
    }

    #[test]
    fn too_few_words_and_the_allowed_single_words() {
        blocked("too_few_words", &["hmm", "tests", "Yes.", "great!", "x"]);
        allowed(ALLOWED_SINGLE_WORDS);
        allowed(&["Yes", "COMMIT", "okay", "push", "no"]);
        // A slash command is allowed at once, whatever follows it in the rules.
        allowed(&["/review", "/compact", "/help"]);
        allowed(&["run tests"]);
    }

    #[test]
    fn too_many_words() {
        blocked(
            "too_many_words",
            &["one two three four five six seven eight nine ten eleven twelve thirteen"],
        );
        allowed(&["one two three four five six seven eight nine ten eleven twelve"]);
    }

    #[test]
    fn too_long() {
        let long = format!("run {}", "x".repeat(95)); // 99 characters: allowed
        assert_eq!(long.chars().count(), 99);
        allowed(&[&long]);
        let longer = format!("{long}y");
        blocked("too_long", &[&longer]);
        // Characters, not bytes: 40 two-byte letters stay well under the limit.
        allowed(&[&format!("run {}", "é".repeat(40))]);
    }

    #[test]
    fn multiple_sentences() {
        blocked(
            "multiple_sentences",
            &[
                "Run tests. Then commit.",
                "Fix it! Then push",
                "Really? Do it",
                "fix e.g.x. Then go",
            ],
        );
        allowed(&[
            "compare X vs. Y",
            "ask Dr. Smith",
            "use tabs, spaces etc. Whatever works",
            "try e.g. Rust",
            "like i.e. This one",
            "mr. Brown's tests",
            "run tests. then commit",
            "version 1.2 Beta",
        ]);
    }

    #[test]
    fn has_formatting() {
        blocked(
            "has_formatting",
            &["run **all** tests", "run *all* tests", "a\nb"],
        );
        allowed(&["run all tests"]);
    }

    #[test]
    fn evaluative() {
        blocked(
            "evaluative",
            &[
                "thanks for that",
                "Thank you so much",
                "looks good to me",
                "sounds good, push",
                "that works now",
                "ok that worked",
                "that's all for now",
                "nice, now push",
                "great, commit it",
                "perfect, ship it",
                "makes sense now",
                "awesome, deploy",
                "excellent work here",
                "That’s all for today",
            ],
        );
        allowed(&[
            "format it nicely",
            "find the greatest value",
            "nicer error messages",
        ]);
    }

    #[test]
    fn ai_voice() {
        blocked(
            "ai_voice",
            &[
                "Let me check",
                "I'll run the tests",
                "I've fixed it",
                "I'm running tests",
                "I can help",
                "I cannot do that",
                "I would commit",
                "I think we should",
                "I notice a bug",
                "Here's the fix",
                "here is the plan",
                "Here are the tests",
                "That's fixed now",
                "This is done now",
                "This isn't right",
                "This will work",
                "You can push now",
                "you should commit",
                "You could deploy",
                "Sure, run it",
                "Of course, pushing",
                "Certainly running it",
                "I’ll push it",
            ],
        );
        allowed(&["sure", "run the tests", "it is done now", "this file too"]);
    }

    #[test]
    fn cjk_counts_characters() {
        blocked("too_few_words", &["好"]);
        blocked("too_many_words", &[&"修".repeat(31)]);
        allowed(&[
            "提交",
            "运行测试",
            &"修".repeat(30),
            "テストを実行",
            "커밋해",
        ]);
        // The other rules still apply.
        blocked("meta_wrapped", &["(没有建议)"]);
    }

    #[test]
    fn first_matching_rule_wins() {
        // done before too_few_words; meta_text before meta_wrapped; label before word count.
        assert_eq!(filter_reason("done"), Some("done"));
        assert_eq!(filter_reason("[silence]"), Some("meta_text"));
        assert_eq!(filter_reason("Suggestion: commit"), Some("prefixed_label"));
        // too_many_words before too_long before multiple_sentences.
        let many = "Run. Them all now please with every flag on and off again ok";
        assert_eq!(filter_reason(many), Some("too_many_words"));
    }
}

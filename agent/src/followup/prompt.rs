//! The words sent to the model for a suggestion: the seed's SUGGESTION_PROMPT verbatim (the
//! suggestion and the pipelined suggestion share it, so both have the same quality), and the
//! pipelined recipe that predicts the step after a speculated one.

/// The seed's prompt, verbatim (its lines as the seed has them): predict what the user would
/// type next, 2–12 words, or nothing.
pub const SUGGESTION_PROMPT: &str = r#"[SUGGESTION MODE: Suggest what the user might naturally type next.]
FIRST: Read the LAST FEW LINES of the assistant's most recent message — that's where
next-step hints, tips, and actionable suggestions usually appear. Then check the user's
recent messages and original request.
Your job is to predict what THEY would type - not what you think they should do.
THE TEST: Would they think "I was just about to type that"?
PRIORITY: If the assistant's last message contains a tip or hint like "Tip: type X to ..."
or "type X to ...", extract X as the suggestion. These are explicit next-step hints.
EXAMPLES:
Assistant says "Tip: type post comments to publish findings" → "post comments"
Assistant says "type /review to start" → "/review"
User asked "fix the bug and run tests", bug is fixed → "run the tests"
After code written → "try it out"
Task complete, obvious follow-up → "commit this" or "push it"
Format: 2-12 words, match the user's style. Or nothing.
Reply with ONLY the suggestion, no quotes or explanation."#;

/// How much of the speculated answer the pipelined prompt quotes.
pub const PIPELINED_TEXT_CHARS: usize = 500;

/// The prompt for the suggestion after a speculated turn: what the user (would have) said,
/// what the assistant answered (first 500 characters, or `(tool calls executed)` when it
/// only called tools), then [`SUGGESTION_PROMPT`].
pub fn pipelined_prompt(suggestion: &str, assistant_text: &str) -> String {
    let text = assistant_text.trim();
    let said = if text.is_empty() {
        "(tool calls executed)".to_string()
    } else {
        text.chars().take(PIPELINED_TEXT_CHARS).collect()
    };
    format!(
        "The user just said: \"{suggestion}\"\nThe assistant responded: {said}\n\n{SUGGESTION_PROMPT}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelined_prompt_quotes_the_turn_then_the_prompt() {
        let p = pipelined_prompt("commit this", "Committed as abc123.");
        assert!(p.starts_with(
            "The user just said: \"commit this\"\nThe assistant responded: Committed as abc123.\n"
        ));
        assert!(p.ends_with(SUGGESTION_PROMPT));
        let p = pipelined_prompt("run the tests", "  ");
        assert!(p.contains("The assistant responded: (tool calls executed)\n"));
        let long = "é".repeat(700);
        let p = pipelined_prompt("go", &long);
        assert!(p.contains(&"é".repeat(500)));
        assert!(!p.contains(&"é".repeat(501)));
    }

    #[test]
    fn prompt_is_the_seeds() {
        assert!(SUGGESTION_PROMPT.starts_with("[SUGGESTION MODE:"));
        assert!(
            SUGGESTION_PROMPT.contains("Format: 2-12 words, match the user's style. Or nothing.")
        );
        assert!(SUGGESTION_PROMPT.ends_with("no quotes or explanation."));
    }
}

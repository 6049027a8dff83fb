//! The value of a shell word as the program will see it, when the script alone fixes it.
//! Flag rules (`sed -i`, `find -delete`) are only sound on words whose value is known: an
//! expansion, a glob or a brace list can turn into any flag when the command runs.

use tree_sitter::Node;

/// One word of a command line.
#[derive(Debug, Clone)]
pub(super) struct Arg {
    /// The value after quote removal, or `None` when only the running shell knows it.
    pub value: Option<String>,
    /// The source text, for reasons.
    pub text: String,
    /// A dynamic word that is not inside double quotes: it may split into several words.
    pub may_split: bool,
}

impl Arg {
    pub fn of(node: Node, src: &[u8]) -> Arg {
        let text = node.utf8_text(src).unwrap_or("").to_string();
        let value = value(node, src);
        let may_split = value.is_none() && !matches!(node.kind(), "string" | "raw_string");
        Arg {
            value,
            text,
            may_split,
        }
    }
}

/// Node kinds that are words (arguments, loop values, case patterns).
pub(super) fn is_word(kind: &str) -> bool {
    matches!(
        kind,
        "word"
            | "string"
            | "raw_string"
            | "concatenation"
            | "simple_expansion"
            | "expansion"
            | "number"
            | "ansi_c_string"
            | "translated_string"
            | "brace_expression"
            | "extglob_pattern"
            | "regex"
    )
}

/// The static value of a word node, or `None` if it depends on the running shell
/// (variables, globs, brace lists, `$'…'` escapes, or kinds not modelled here).
pub(super) fn value(node: Node, src: &[u8]) -> Option<String> {
    value_of(node, src, false)
}

/// `braces_checked`: an enclosing concatenation already looked for brace lists across its
/// parts (a part alone, such as the `{` of `{}`, would look like one).
fn value_of(node: Node, src: &[u8], braces_checked: bool) -> Option<String> {
    let text = node.utf8_text(src).ok()?;
    match node.kind() {
        "word" if !braces_checked && has_brace_list(text) => None,
        "word" => unescape_word(text),
        "number" => Some(text.to_string()),
        "raw_string" => text
            .strip_prefix('\'')
            .and_then(|t| t.strip_suffix('\''))
            .map(str::to_string),
        "string" => {
            let mut out = String::new();
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                if child.kind() != "string_content" {
                    return None;
                }
                out.push_str(&unescape_double_quoted(child.utf8_text(src).ok()?));
            }
            Some(out)
        }
        "concatenation" => {
            // A brace list can span several word nodes (`{-o,out}`), so look at the whole.
            if has_brace_list(text) {
                return None;
            }
            let mut out = String::new();
            let mut cursor = node.walk();
            for child in node.children(&mut cursor) {
                out.push_str(&value_of(child, src, true)?);
            }
            Some(out)
        }
        _ => None,
    }
}

/// An unquoted word: backslashes quote the next character; glob and brace characters make
/// the value unknown.
fn unescape_word(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(n) => out.push(n),
            },
            '*' | '?' | '[' | '$' | '`' => return None,
            _ => out.push(c),
        }
    }
    Some(out)
}

/// `{a,b}` and `{1..3}` expand to several words; an empty `{}` (find, xargs) does not. Any
/// other `{` counts as a possible brace list, quoted or not: erring towards "unknown".
fn has_brace_list(text: &str) -> bool {
    text.replace("\\{", "").replace("{}", "").contains('{')
}

/// Inside double quotes a backslash only quotes `$`, `` ` ``, `"`, `\` and a newline.
fn unescape_double_quoted(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.peek() {
                Some('$' | '`' | '"' | '\\') => {
                    out.extend(chars.next());
                    continue;
                }
                Some('\n') => {
                    chars.next();
                    continue;
                }
                _ => {}
            }
        }
        out.push(c);
    }
    out
}

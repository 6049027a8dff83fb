//! Which diagnostics an edit introduced: lines of edited files are mapped back through
//! the diff to the unedited file, then diagnostics are matched with the baseline by path,
//! mapped line, code and message; what is left is matched by path, code and message alone
//! (a diagnostic whose line the edit rewrote but which said the same before). The
//! unmatched remainder is new.

use super::diag::Diagnostic;
use std::collections::HashMap;

/// For each line of a new text (1-based index), the line of the old text it is unchanged
/// from, if any.
#[derive(Debug, Clone, Default)]
pub struct LineMap {
    new_to_old: Vec<Option<u32>>,
}

impl LineMap {
    /// Diff `old` and `new` by lines.
    pub fn between(old: &str, new: &str) -> LineMap {
        let diff = similar::TextDiff::from_lines(old, new);
        let mut new_to_old = vec![None; new.lines().count() + 1];
        for op in diff.ops() {
            if let similar::DiffOp::Equal {
                old_index,
                new_index,
                len,
            } = *op
            {
                for k in 0..len {
                    if let Some(slot) = new_to_old.get_mut(new_index + k + 1) {
                        *slot = Some((old_index + k + 1) as u32);
                    }
                }
            }
        }
        LineMap { new_to_old }
    }

    /// The old line for new line `line`, `None` if the edit wrote it.
    pub fn old_line(&self, line: u32) -> Option<u32> {
        self.new_to_old.get(line as usize).copied().flatten()
    }
}

/// Set `new` on each of `edited` that the baseline (`before`) does not explain. `maps`
/// holds the line maps of the files the edit changed; other files map lines to themselves.
pub fn mark_new(before: &[Diagnostic], edited: &mut [Diagnostic], maps: &HashMap<String, LineMap>) {
    type Key<'a> = (&'a str, &'a str, Option<&'a str>, &'a str);
    let mut exact: HashMap<(Key<'_>, u32), usize> = HashMap::new();
    let mut loose: HashMap<Key<'_>, usize> = HashMap::new();
    for b in before {
        let k = (
            b.path.as_str(),
            b.checker.as_str(),
            b.code.as_deref(),
            b.message.as_str(),
        );
        *exact.entry((k, b.line)).or_default() += 1;
        *loose.entry(k).or_default() += 1;
    }
    let mut unmatched = Vec::new();
    for (i, e) in edited.iter().enumerate() {
        let k = (
            e.path.as_str(),
            e.checker.as_str(),
            e.code.as_deref(),
            e.message.as_str(),
        );
        let old_line = match maps.get(&e.path) {
            Some(m) => m.old_line(e.line),
            None => Some(e.line),
        };
        let hit = old_line
            .and_then(|l| exact.get_mut(&(k, l)))
            .filter(|n| **n > 0);
        match hit {
            Some(n) => {
                *n -= 1;
                if let Some(l) = loose.get_mut(&k) {
                    *l = l.saturating_sub(1);
                }
            }
            None => unmatched.push(i),
        }
    }
    // Second pass: a baseline diagnostic not yet used may explain an edited one whose line
    // moved into rewritten text. Only as many as the baseline had are explained.
    let mut flags = Vec::with_capacity(unmatched.len());
    for &i in &unmatched {
        let e = &edited[i];
        let k = (
            e.path.as_str(),
            e.checker.as_str(),
            e.code.as_deref(),
            e.message.as_str(),
        );
        let explained = match loose.get_mut(&k) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        };
        flags.push((i, !explained));
    }
    for d in edited.iter_mut() {
        d.new = false;
    }
    for (i, new) in flags {
        edited[i].new = new;
    }
}

#[cfg(test)]
mod tests {
    use super::super::diag::Severity;
    use super::*;

    fn d(path: &str, line: u32, msg: &str) -> Diagnostic {
        Diagnostic {
            path: path.into(),
            line,
            column: 1,
            end_line: line,
            end_column: 1,
            severity: Severity::Warning,
            code: Some("c".into()),
            message: msg.into(),
            checker: "t".into(),
            new: false,
        }
    }

    #[test]
    fn line_map_follows_inserted_lines() {
        let m = LineMap::between("a\nb\nc\n", "a\nX\nY\nb\nc\n");
        assert_eq!(m.old_line(1), Some(1));
        assert_eq!(m.old_line(2), None);
        assert_eq!(m.old_line(4), Some(2));
        assert_eq!(m.old_line(5), Some(3));
    }

    #[test]
    fn shifted_old_diagnostics_are_not_new_and_duplicates_are() {
        let before = vec![d("a.rs", 2, "unused x"), d("b.rs", 7, "other")];
        let mut edited = vec![
            d("a.rs", 4, "unused x"), // shifted by two inserted lines
            d("a.rs", 2, "type mismatch"),
            d("a.rs", 3, "unused x"), // a second one, in new text
            d("b.rs", 7, "other"),
        ];
        let mut maps = HashMap::new();
        maps.insert(
            "a.rs".to_string(),
            LineMap::between("a\nb\nc\n", "a\nX\nY\nb\nc\n"),
        );
        mark_new(&before, &mut edited, &maps);
        let new: Vec<bool> = edited.iter().map(|d| d.new).collect();
        assert_eq!(new, [false, true, true, false]);
    }

    #[test]
    fn a_rewritten_line_keeping_its_diagnostic_is_not_new() {
        let before = vec![d("a.py", 1, "unused import os")];
        let mut edited = vec![d("a.py", 1, "unused import os")];
        let mut maps = HashMap::new();
        maps.insert(
            "a.py".to_string(),
            LineMap::between("import os\n", "import os  # hm\n"),
        );
        mark_new(&before, &mut edited, &maps);
        assert!(!edited[0].new);
    }
}

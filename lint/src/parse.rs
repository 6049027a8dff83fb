//! Parsers of checkers' machine-readable output into [`Raw`] diagnostics.

use super::diag::{Raw, Severity};
use regex::Regex;
use serde_json::Value;
use std::sync::OnceLock;

/// Which output format a checker speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// `cargo check --message-format=json` (one JSON object per line).
    CargoJson,
    /// `ruff check --output-format=json`.
    RuffJson,
    /// `eslint -f json`.
    EslintJson,
    /// `pyright --outputjson`.
    PyrightJson,
    /// `tsc --pretty false`: `file(line,col): error TS1234: message`.
    Tsc,
    /// `file:line[:col]: [severity:] message [code]` (gcc, clang, mypy, go vet, most tools).
    Gcc,
}

/// Parse a checker's stdout (and, for formats that print there, stderr).
pub fn parse(format: Format, stdout: &str, stderr: &str) -> Vec<Raw> {
    match format {
        Format::CargoJson => cargo(stdout),
        Format::RuffJson => ruff(stdout),
        Format::EslintJson => eslint(stdout),
        Format::PyrightJson => pyright(stdout),
        Format::Tsc => tsc(stdout),
        Format::Gcc => {
            let mut v = gcc(stdout);
            v.extend(gcc(stderr));
            v
        }
    }
}

fn cargo(out: &str) -> Vec<Raw> {
    let mut v = Vec::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-message" {
            continue;
        }
        let m = &msg["message"];
        let Some(span) = m["spans"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["is_primary"] == true))
        else {
            continue; // "aborting due to…", "N warnings emitted": no place in the code
        };
        v.push(Raw {
            path: str_of(&span["file_name"]),
            line: num(&span["line_start"]),
            column: num(&span["column_start"]),
            end_line: num(&span["line_end"]),
            end_column: num(&span["column_end"]),
            severity: m["level"].as_str().map(Severity::parse),
            code: m["code"]["code"].as_str().map(str::to_string),
            message: str_of(&m["message"]),
        });
    }
    v
}

fn ruff(out: &str) -> Vec<Raw> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(out.trim()) else {
        return Vec::new();
    };
    items
        .iter()
        .map(|d| {
            let code = d["code"].as_str().map(str::to_string);
            Raw {
                path: str_of(&d["filename"]),
                line: num(&d["location"]["row"]),
                column: num(&d["location"]["column"]),
                end_line: num(&d["end_location"]["row"]),
                end_column: num(&d["end_location"]["column"]),
                severity: Some(ruff_severity(code.as_deref())),
                code,
                message: str_of(&d["message"]),
            }
        })
        .collect()
}

/// Ruff has no severities: syntax errors (no code), `E9` (io/syntax) and the undefined-name
/// family are errors (the program cannot run), every other rule a warning.
fn ruff_severity(code: Option<&str>) -> Severity {
    match code {
        None => Severity::Error,
        Some(c) if c.starts_with("E9") || matches!(c, "F821" | "F822" | "F823" | "F706") => {
            Severity::Error
        }
        Some(_) => Severity::Warning,
    }
}

fn eslint(out: &str) -> Vec<Raw> {
    let Ok(Value::Array(files)) = serde_json::from_str::<Value>(out.trim()) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for f in &files {
        for m in f["messages"].as_array().into_iter().flatten() {
            v.push(Raw {
                path: str_of(&f["filePath"]),
                line: num(&m["line"]),
                column: num(&m["column"]),
                end_line: num(&m["endLine"]),
                end_column: num(&m["endColumn"]),
                severity: Some(if m["severity"] == 2 || m["fatal"] == true {
                    Severity::Error
                } else {
                    Severity::Warning
                }),
                code: m["ruleId"].as_str().map(str::to_string),
                message: str_of(&m["message"]),
            });
        }
    }
    v
}

fn pyright(out: &str) -> Vec<Raw> {
    let Ok(doc) = serde_json::from_str::<Value>(out.trim()) else {
        return Vec::new();
    };
    doc["generalDiagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            let r = &d["range"];
            Raw {
                path: str_of(&d["file"]),
                line: num(&r["start"]["line"]) + 1,
                column: num(&r["start"]["character"]) + 1,
                end_line: num(&r["end"]["line"]) + 1,
                end_column: num(&r["end"]["character"]) + 1,
                severity: d["severity"].as_str().map(Severity::parse),
                code: d["rule"].as_str().map(str::to_string),
                message: str_of(&d["message"]),
            }
        })
        .collect()
}

fn tsc(out: &str) -> Vec<Raw> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let Some(re) = RE
        .get_or_init(|| {
            Regex::new(r"^(.+?)\((\d+),(\d+)\): (error|warning|message) (TS\d+): (.*)$").ok()
        })
        .as_ref()
    else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| re.captures(l.trim_end()))
        .map(|c| Raw {
            path: c[1].to_string(),
            line: c[2].parse().unwrap_or(0),
            column: c[3].parse().unwrap_or(0),
            severity: Some(Severity::parse(&c[4])),
            code: Some(c[5].to_string()),
            message: c[6].to_string(),
            ..Default::default()
        })
        .collect()
}

/// `file:line[:col]: [severity[code]:] message [code]`; lines without a position are
/// context (gcc's "In function …", go vet's "# pkg") and skipped.
fn gcc(out: &str) -> Vec<Raw> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    let Some(re) = RE
        .get_or_init(|| {
            Regex::new(
                r"^(?P<file>[^:\s][^:]*):(?P<line>\d+)(?::(?P<col>\d+))?:(?:\s*(?P<sev>fatal error|error|warning|note|info|hint)(?:\[(?P<code1>[^\]]+)\])?:)?\s*(?P<msg>.*?)(?:\s+\[(?P<code2>[^\]\s]+)\])?\s*$",
            )
            .ok()
        })
        .as_ref()
    else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| re.captures(l))
        .filter(|c| !c["msg"].is_empty())
        .map(|c| Raw {
            path: c["file"].to_string(),
            line: c["line"].parse().unwrap_or(0),
            column: c
                .name("col")
                .and_then(|m| m.as_str().parse().ok())
                .unwrap_or(0),
            severity: c.name("sev").map(|m| Severity::parse(m.as_str())),
            code: c
                .name("code1")
                .or(c.name("code2"))
                .map(|m| m.as_str().trim_start_matches("-W").to_string()),
            message: c["msg"].to_string(),
            ..Default::default()
        })
        .collect()
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or("").to_string()
}

fn num(v: &Value) -> u32 {
    v.as_u64()
        .map(|n| n.min(u32::MAX as u64) as u32)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_messages_with_a_primary_span() {
        let out = r#"{"reason":"compiler-artifact","package_id":"x"}
{"reason":"compiler-message","message":{"level":"error","message":"mismatched types","code":{"code":"E0308"},"spans":[{"file_name":"src/main.rs","line_start":4,"line_end":4,"column_start":18,"column_end":25,"is_primary":true}]}}
{"reason":"compiler-message","message":{"level":"error","message":"aborting due to 1 previous error","code":null,"spans":[]}}
not json"#;
        let v = parse(Format::CargoJson, out, "");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].path, "src/main.rs");
        assert_eq!((v[0].line, v[0].column, v[0].end_column), (4, 18, 25));
        assert_eq!(v[0].code.as_deref(), Some("E0308"));
        assert_eq!(v[0].severity, Some(Severity::Error));
    }

    #[test]
    fn ruff_json_and_its_severities() {
        let out = r#"[{"code":"F401","message":"`os` imported but unused","filename":"/p/a.py","location":{"row":1,"column":8},"end_location":{"row":1,"column":10}},
        {"code":"F821","message":"Undefined name `x`","filename":"/p/a.py","location":{"row":3,"column":1},"end_location":{"row":3,"column":2}},
        {"code":null,"message":"SyntaxError: Expected an expression","filename":"/p/b.py","location":{"row":2,"column":5},"end_location":{"row":2,"column":6}}]"#;
        let v = parse(Format::RuffJson, out, "");
        let sev: Vec<_> = v.iter().map(|d| d.severity).collect();
        assert_eq!(
            sev,
            [
                Some(Severity::Warning),
                Some(Severity::Error),
                Some(Severity::Error)
            ]
        );
        assert_eq!(v[0].end_column, 10);
    }

    #[test]
    fn eslint_pyright_tsc() {
        let e = r#"[{"filePath":"/p/a.js","messages":[{"ruleId":"no-unused-vars","severity":1,"message":"'x' is defined but never used.","line":2,"column":7,"endLine":2,"endColumn":8}]}]"#;
        let v = parse(Format::EslintJson, e, "");
        assert_eq!(v[0].code.as_deref(), Some("no-unused-vars"));
        assert_eq!(v[0].severity, Some(Severity::Warning));

        let p = r#"{"generalDiagnostics":[{"file":"/p/a.py","severity":"error","message":"Cannot access attribute","range":{"start":{"line":0,"character":4},"end":{"line":0,"character":9}},"rule":"reportAttributeAccessIssue"}]}"#;
        let v = parse(Format::PyrightJson, p, "");
        assert_eq!((v[0].line, v[0].column, v[0].end_column), (1, 5, 10));

        let t = "src/a.ts(3,7): error TS2322: Type 'string' is not assignable to type 'number'.\n";
        let v = parse(Format::Tsc, t, "");
        assert_eq!((v[0].line, v[0].column), (3, 7));
        assert_eq!(v[0].code.as_deref(), Some("TS2322"));
    }

    #[test]
    fn gcc_style_from_gcc_mypy_and_go_vet() {
        let out = "a.c: In function 'main':\n\
            a.c:4:9: warning: unused variable 'y' [-Wunused-variable]\n\
            a.c:5:12: error: 'z' undeclared (first use in this function)\n\
            m.py:7:5: error: Incompatible types in assignment  [assignment]\n\
            ./main.go:6:2: fmt.Printf format %d has arg s of wrong type string\n\
            # example.com/x\n";
        let v = parse(Format::Gcc, "", out);
        assert_eq!(v.len(), 4);
        assert_eq!(v[0].code.as_deref(), Some("unused-variable"));
        assert_eq!(v[0].message, "unused variable 'y'");
        assert_eq!(v[1].severity, Some(Severity::Error));
        assert_eq!(v[2].code.as_deref(), Some("assignment"));
        assert_eq!(v[2].message, "Incompatible types in assignment");
        assert_eq!(v[3].severity, None);
        assert_eq!(v[3].path, "./main.go");
    }
}

/// The parsers on output the real tools printed (mypy 1.x, pyright 1.1.414, eslint 9 with
/// `@eslint/js` recommended, tsc 5, go vet 1.19), captured from small projects with known
/// mistakes; see `testdata/`.
#[cfg(test)]
mod captured {
    use super::*;
    use crate::diag::PathBase;
    use std::path::Path;

    /// Parse `out` (stdout, or stderr for go vet) and normalise it as the linter does,
    /// for a project at `root`.
    fn shown(format: Format, stdout: &str, stderr: &str, root: &str) -> Vec<String> {
        let base = PathBase {
            project: Path::new(root),
            cwd: Path::new(root),
            mount: None,
        };
        parse(format, stdout, stderr)
            .into_iter()
            .map(|r| {
                let d = r.normalise(&base, "x", Severity::Error);
                format!("{d} {}:{}", d.end_line, d.end_column)
            })
            .collect()
    }

    #[test]
    fn mypy() {
        let out = include_str!("testdata/mypy.out");
        assert_eq!(
            shown(Format::Gcc, out, "", "/var/tmp/capture/py"),
            [
                "m.py:9:10: error: Incompatible types in assignment (expression has type \"int\", variable has type \"str\") [assignment] (x) 9:10",
                "m.py:10:24: error: Name \"undefined_name\" is not defined [name-defined] (x) 10:24",
            ]
        );
    }

    #[test]
    fn pyright() {
        let out = include_str!("testdata/pyright.json");
        assert_eq!(
            shown(Format::PyrightJson, out, "", "/var/tmp/capture/py"),
            [
                // A multi-line message keeps its first line.
                "m.py:9:10: error: Type \"int\" is not assignable to declared type \"str\" [reportAssignmentType] (x) 9:19",
                "m.py:10:24: error: \"undefined_name\" is not defined [reportUndefinedVariable] (x) 10:38",
            ]
        );
    }

    #[test]
    fn eslint() {
        let out = include_str!("testdata/eslint.json");
        assert_eq!(
            shown(Format::EslintJson, out, "", "/var/tmp/capture/js"),
            [
                "b.js:2:9: error: 'x' is assigned a value but never used. [no-unused-vars] (x) 2:10",
                "b.js:3:10: error: 'y' is not defined. [no-undef] (x) 3:11",
            ]
        );
    }

    #[test]
    fn tsc() {
        let out = include_str!("testdata/tsc.out");
        assert_eq!(
            shown(Format::Tsc, out, "", "/var/tmp/capture/js"),
            [
                "a.ts:3:9: error: Type 'string' is not assignable to type 'number'. [TS2322] (x) 3:9",
                "a.ts:4:14: error: Cannot find name 'missing'. [TS2304] (x) 4:14",
            ]
        );
    }

    #[test]
    fn go_vet() {
        let err = include_str!("testdata/go-vet.err");
        assert_eq!(
            shown(Format::Gcc, "", err, "/var/tmp/capture/go"),
            [
                "main.go:7:2: error: fmt.Printf format %d has arg s of wrong type string (x) 7:2",
                "main.go:10:2: error: unreachable code (x) 10:2",
            ]
        );
    }
}

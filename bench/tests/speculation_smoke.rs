//! CI smoke of the speculation benchmark: the two inline sessions (bench/corpus/sessions/
//! fix-add and docs-lookup) × `none` and `runnable`, run for real (branches mounted, the
//! sessions' commands run in them). It fails when accept → result or the accounting breaks:
//! the accepted turns, their speculations' outcomes, tokens and CPU accounted, time saved
//! equal to the waits' difference, a ready speculation's accept faster than the same turn
//! live, no replay miss, no mount left behind; every accepted speculation's result (tool
//! outcomes, files changed) compared with the live run's, and a divergent one never credited
//! (a run whose JSON is tampered to diverge is re-rendered and must list it); and a replay
//! whose tool result differs from the recording refuses, loudly (a tampered cassette).
//! Needs root and /dev/fuse, and says so.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn turns<'a>(doc: &'a Value, session: &str, strategy: &str) -> &'a Vec<Value> {
    doc["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["session"] == session && r["strategy"] == strategy)
        .unwrap_or_else(|| panic!("no run of {session} / {strategy}"))["turns"]
        .as_array()
        .expect("turns")
}

#[test]
fn two_sessions_two_strategies_account_correctly() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: speculations mount FUSE branches"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test needs /dev/fuse: speculations mount FUSE branches"
    );
    let sessions = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/sessions");
    let out_dir = std::env::temp_dir().join(format!("shade-spec-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).expect("out dir");
    let prefix = out_dir.join("smoke");
    // Slow enough a model that a live turn (two calls or more) takes ≥ 0.8 s; long enough a
    // think time that the speculations finish before the accept.
    let out = Command::new(env!("CARGO_BIN_EXE_speculation"))
        .arg(sessions.join("fix-add"))
        .arg(sessions.join("docs-lookup"))
        .args(["--strategies", "none,runnable,peer"])
        .args([
            "--ttft-ms",
            "400",
            "--tokens-per-s",
            "200",
            "--think-ms",
            "2500",
        ])
        .arg("--out")
        .arg(&prefix)
        .output()
        .expect("run the benchmark");
    assert!(
        out.status.success(),
        "the benchmark failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(prefix.with_extension("json")).expect("json");
    let doc: Value = serde_json::from_str(&text).expect("parse json");
    let md = std::fs::read_to_string(prefix.with_extension("md")).expect("markdown");
    let svg = std::fs::read_to_string(prefix.with_extension("svg")).expect("svg");
    assert!(md.contains("| all | runnable |"), "{md}");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));

    for run in doc["runs"].as_array().expect("runs") {
        assert_eq!(run["leftover_mounts"], 0, "mounts left: {run}");
        assert_eq!(run["replay_missed"], 0, "the run left the recording: {run}");
    }
    // Who accepted what comes from the recording, whatever the strategy.
    for (session, expected) in [("fix-add", 2), ("docs-lookup", 1)] {
        for strategy in ["none", "runnable"] {
            let accepted = turns(&doc, session, strategy)
                .iter()
                .filter(|t| t["accepted"] == true)
                .count();
            assert_eq!(accepted, expected, "{session} / {strategy}");
        }
        for t in turns(&doc, session, "none") {
            assert_eq!(t["speculation_tokens"], 0, "none speculated: {t}");
        }
    }
    // Accepted speculations were used: fix-add's completed, docs-lookup's stopped at
    // web_fetch and went on live.
    for (session, outcome) in [("fix-add", "completed"), ("docs-lookup", "boundary")] {
        let live = turns(&doc, session, "none");
        for (i, t) in turns(&doc, session, "runnable").iter().enumerate() {
            if t["accepted"] == true {
                assert_eq!(t["speculation"], outcome, "{session}: {t}");
                assert!(t["speculation_tokens"].as_u64().unwrap_or(0) > 0, "{t}");
                assert_eq!(t["discarded_tokens"], 0, "{t}");
                assert!(
                    t["speculation_used"]["cpu_ms"].as_f64().unwrap_or(0.0) > 0.0,
                    "no CPU measured: {t}"
                );
                // A finished speculation makes no model call at accept; the same turn live
                // makes two or more, each ≥ 0.4 s.
                if outcome == "completed" && t["ready_at_accept"] == true {
                    let (spec, base) = (
                        t["wait_ms"].as_f64().unwrap_or(f64::MAX),
                        live[i]["wait_ms"].as_f64().unwrap_or(0.0),
                    );
                    assert!(
                        spec < base,
                        "{session} turn {i}: accept {spec} ms, live {base} ms"
                    );
                }
            } else if t["speculation"] == "aborted" {
                assert_eq!(t["discarded_tokens"], t["speculation_tokens"], "{t}");
                assert!(
                    t["discarded_used"].is_object(),
                    "discarded work not measured: {t}"
                );
            }
        }
    }
    assert!(
        turns(&doc, "fix-add", "runnable")
            .iter()
            .any(|t| t["speculation"] == "aborted"
                && t["discarded_tokens"].as_u64().unwrap_or(0) > 0),
        "the ignored suggestion's speculation was not accounted"
    );
    // Time saved is the difference of the waits, per session and overall.
    let sum = |session: Option<&str>, strategy: &str| -> f64 {
        doc["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .filter(|r| r["strategy"] == strategy && session.is_none_or(|s| r["session"] == s))
            .flat_map(|r| r["turns"].as_array().expect("turns").iter())
            .map(|t| t["wait_ms"].as_f64().expect("wait"))
            .sum()
    };
    for row in doc["summary"].as_array().expect("summary") {
        if row["strategy"] != "runnable" {
            continue;
        }
        let session = row["session"].as_str().expect("session");
        let pick = (session != "all").then_some(session);
        let expected = sum(pick, "none") - sum(pick, "runnable");
        let saved = row["figures"]["saved_ms"].as_f64().expect("saved_ms");
        assert!(
            (saved - expected).abs() < 1e-6,
            "{session}: {saved} vs {expected}"
        );
    }
    // The peer as it ships: a speculation stopped at a boundary (fix-add's test script, a
    // writing command for its gate; docs-lookup's web_fetch) is thrown away on accept, and
    // the turn runs live.
    for session in ["fix-add", "docs-lookup"] {
        let accepted: Vec<&Value> = turns(&doc, session, "peer")
            .iter()
            .filter(|t| t["accepted"] == true)
            .collect();
        assert!(!accepted.is_empty());
        for t in accepted {
            assert_eq!(t["speculation"], "discarded", "{session}: {t}");
            assert!(t["boundary"].is_string(), "{t}");
            assert_eq!(t["discarded_tokens"], t["speculation_tokens"], "{t}");
        }
    }
    // Results, not only times: each accepted speculation was compared with the live turn, and
    // the credited accepts are exactly those whose tool outcomes and changes equal it.
    let edit_turn = turns(&doc, "fix-add", "runnable")
        .iter()
        .find(|t| t["accepted"] == true && t["changes"].as_array().is_some_and(|c| !c.is_empty()))
        .expect("fix-add's accepted fix changed no file");
    assert!(
        edit_turn["changes"][0]
            .as_str()
            .unwrap_or("")
            .starts_with("add.sh: "),
        "{edit_turn}"
    );
    for row in doc["summary"].as_array().expect("summary") {
        if row["strategy"] != "runnable" || row["session"] == "all" {
            continue;
        }
        let session = row["session"].as_str().expect("session");
        let live = turns(&doc, session, "none");
        let same = turns(&doc, session, "runnable")
            .iter()
            .enumerate()
            .filter(|(i, t)| {
                t["accepted"] == true
                    && (!matches!(t["speculation"].as_str(), Some("completed" | "boundary"))
                        || (t["tools"] == live[*i]["tools"] && t["changes"] == live[*i]["changes"]))
            })
            .count();
        assert_eq!(row["figures"]["accepted"], same, "{session}: {row}");
        assert_eq!(row["figures"]["divergent"], 0, "{session}: {row}");
        assert_eq!(row["figures"]["unchecked"], 0, "{session}: {row}");
    }
    // The guard bites: the same run with one accepted speculation's result made different
    // from live (its test "failed") is re-rendered with that accept counted as a miss.
    let mut tampered = doc.clone();
    let run = tampered["runs"]
        .as_array_mut()
        .expect("runs")
        .iter_mut()
        .find(|r| r["session"] == "fix-add" && r["strategy"] == "runnable")
        .expect("fix-add / runnable");
    let turn = run["turns"]
        .as_array_mut()
        .expect("turns")
        .iter_mut()
        .find(|t| t["accepted"] == true && t["speculation"] == "completed")
        .expect("a completed accept");
    turn["tools"] = serde_json::json!(["shell: exit 2"]);
    let file = out_dir.join("tampered.json");
    std::fs::write(&file, tampered.to_string()).expect("write");
    let re = out_dir.join("tampered");
    let out = Command::new(env!("CARGO_BIN_EXE_speculation"))
        .arg("--rerender")
        .arg(&file)
        .arg("--out")
        .arg(&re)
        .output()
        .expect("rerender");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(re.with_extension("md")).expect("markdown");
    assert!(
        md.contains("1 divergent accept(s) counted as misses"),
        "{md}"
    );
    assert!(md.contains("| fix-add | runnable | 1 | "), "{md}");
    assert!(
        md.contains("| fix-add | runnable | 3 | 1 | "),
        "credited: {md}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// A copy of `session` with `from` replaced by `to` in both cassettes.
fn tampered_session(session: &Path, dir: &Path, from: &str, to: &str) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(session)
        .arg(dir)
        .status()
        .expect("cp");
    assert!(status.success());
    let mut hits = 0;
    for f in ["chat.jsonl", "chat.background.jsonl"] {
        let p = dir.join(f);
        let text = std::fs::read_to_string(&p).expect("cassette");
        hits += text.matches(from).count();
        std::fs::write(&p, text.replace(from, to)).expect("write cassette");
    }
    assert!(hits > 0, "{from} is not in the recording");
}

#[test]
fn a_replay_whose_tool_results_drift_from_the_recording_fails_loudly() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: the benchmark runs as root"
    );
    let sessions = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/sessions");
    let out_dir = std::env::temp_dir().join(format!("shade-spec-drift-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    std::fs::create_dir_all(&out_dir).expect("out dir");
    let session = out_dir.join("fix-add");
    // The recording says the first test run passed; for real it fails (the planted bug).
    tampered_session(
        &sessions.join("fix-add"),
        &session,
        "Exit code: 1\\nStdout:\\nFAIL",
        "Exit code: 0\\nStdout:\\nFAIL",
    );
    let out = Command::new("timeout")
        .args(["-k", "10", "300"])
        .arg(env!("CARGO_BIN_EXE_speculation"))
        .arg(&session)
        .args(["--strategies", "none", "--ttft-ms", "0", "--think-ms", "0"])
        .output()
        .expect("run the benchmark");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the drift was ignored:\n{stderr}");
    assert!(
        stderr.contains("replay drift in fix-add / none") && stderr.contains("recorded [exit 0]"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// Run the benchmark binary (bounded in time) and return its stdout, failing on error.
fn bench(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new("timeout")
        .args(["-k", "10", "600"])
        .arg(env!("CARGO_BIN_EXE_speculation"))
        .args(args)
        .output()
        .expect("run the benchmark");
    assert!(
        out.status.success(),
        "the benchmark failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What must not depend on how the grid was split: per run (job order) the session,
/// strategy, pass and every turn's input, suggestion, accept, speculation outcome and result.
fn outcomes(doc: &Value) -> Vec<String> {
    doc["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            let turns: Vec<String> = r["turns"]
                .as_array()
                .expect("turns")
                .iter()
                .map(|t| {
                    format!(
                        "{} / {} / {} / {} / {} / {}",
                        t["input"],
                        t["suggestion"],
                        t["accepted"],
                        t["speculation"],
                        t["tools"],
                        t["changes"]
                    )
                })
                .collect();
            format!(
                "job {} {} {} pass {}: {}",
                r["job"],
                r["session"],
                r["strategy"],
                r["pass"],
                turns.join(" | ")
            )
        })
        .collect()
}

#[test]
fn shards_run_as_separate_processes_merge_to_the_report_of_one_run() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: speculations mount FUSE branches"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test needs /dev/fuse: speculations mount FUSE branches"
    );
    let sessions = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/sessions");
    let dir = std::env::temp_dir().join(format!("shade-spec-shards-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (fix, docs) = (sessions.join("fix-add"), sessions.join("docs-lookup"));
    let common = |out: &Path, shard: Option<&str>| {
        let mut v: Vec<std::ffi::OsString> = vec![
            fix.clone().into(),
            docs.clone().into(),
            "--strategies".into(),
            "none,runnable".into(),
            "--runs".into(),
            "2".into(),
            "--ttft-ms".into(),
            "50".into(),
            "--tokens-per-s".into(),
            "2000".into(),
            "--think-ms".into(),
            "500".into(),
            "--out".into(),
            out.into(),
        ];
        if let Some(s) = shard {
            v.push("--shard".into());
            v.push(s.into());
        }
        v
    };
    let run = |v: Vec<std::ffi::OsString>| {
        let refs: Vec<&std::ffi::OsStr> = v.iter().map(|s| s.as_os_str()).collect();
        bench(&refs)
    };
    let one = dir.join("one");
    run(common(&one, None));
    run(common(&dir.join("s0"), Some("0/2")));
    run(common(&dir.join("s1"), Some("1/2")));
    let merged = dir.join("merged");
    run(vec![
        "--merge".into(),
        dir.join("s0.json").into(),
        dir.join("s1.json").into(),
        "--out".into(),
        merged.clone().into(),
    ]);
    let read = |p: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(p.with_extension("json")).expect("json"))
            .expect("parse")
    };
    let (a, b) = (read(&one), read(&merged));
    // The shards ran disjoint halves of the same grid, and together the same runs with the
    // same results as one process (times aside, which no two runs share).
    let (s0, s1) = (read(&dir.join("s0")), read(&dir.join("s1")));
    let n = |d: &Value| d["runs"].as_array().expect("runs").len();
    assert!(n(&s0) > 0 && n(&s1) > 0, "a shard ran nothing");
    assert_eq!(n(&s0) + n(&s1), n(&a));
    assert_eq!(outcomes(&a), outcomes(&b));
    // The merge step itself is exact: the one run's JSON split by shard and merged renders
    // byte for byte what the one run's JSON renders.
    let mut halves = Vec::new();
    for i in 0..2u64 {
        let mut half = a.clone();
        half["runs"] = Value::Array(
            a["runs"]
                .as_array()
                .expect("runs")
                .iter()
                .filter(|r| r["job"].as_u64().expect("job") % 2 == i)
                .cloned()
                .collect(),
        );
        let p = dir.join(format!("half{i}.json"));
        std::fs::write(&p, half.to_string()).expect("write");
        halves.push(p);
    }
    let whole = run(vec!["--rerender".into(), one.with_extension("json").into()]);
    let parts = run(vec![
        "--merge".into(),
        halves[0].clone().into(),
        halves[1].clone().into(),
    ]);
    assert_eq!(whole, parts);
    assert!(whole.contains("## Spread and think-time sweep"), "{whole}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_live_suggester_is_scored_against_the_held_out_next_input() {
    use shade_testkit::{last_real_user, FakeLlm, Reply};
    use std::sync::Arc;
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: speculations mount FUSE branches"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test needs /dev/fuse: speculations mount FUSE branches"
    );
    // A stand-in for a live model: it sees the conversation up to the turn just answered (its
    // last input), never the next one. After the first input it suggests an equivalent of the
    // real next input ("run tests" for "run the tests"), after the second another ("fix it,
    // then run the tests"), after the third something the user did not type.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let suggester = FakeLlm::start(Arc::new(move |body: &Value| {
        let last = last_real_user(body);
        if let Ok(mut l) = log.lock() {
            l.push(body.to_string());
        }
        let text = match last.as_str() {
            "what does this project do?" => "Run tests.",
            "run the tests" | "Run tests." => "fix it, then run the tests",
            _ => "commit this",
        };
        Reply::text(text)
    }))
    .expect("fake suggester");
    let sessions = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/sessions");
    let dir = std::env::temp_dir().join(format!("shade-spec-live-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let prefix = dir.join("live");
    bench(&[
        sessions.join("fix-add").as_os_str(),
        "--strategies".as_ref(),
        "none,runnable".as_ref(),
        "--ttft-ms".as_ref(),
        "50".as_ref(),
        "--think-ms".as_ref(),
        "1500".as_ref(),
        "--suggester-url".as_ref(),
        suggester.base_url.as_ref(),
        "--suggester-model".as_ref(),
        "stand-in".as_ref(),
        "--out".as_ref(),
        prefix.as_os_str(),
    ]);
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(prefix.with_extension("json")).expect("json"),
    )
    .expect("parse");
    for strategy in ["none", "runnable"] {
        let t = turns(&doc, "fix-add", strategy);
        let shown: Vec<(&str, bool)> = t
            .iter()
            .filter_map(|t| Some((t["suggestion"].as_str()?, t["accepted"] == true)))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("Run tests.", true),
                ("fix it, then run the tests", true),
                ("commit this", false)
            ],
            "{strategy}"
        );
    }
    // Equivalents are answered as the input they stand for: the accepted speculations are the
    // live turns' results (not divergent), and suggestion tokens were counted.
    for row in doc["summary"].as_array().expect("summary") {
        if row["session"] == "fix-add" && row["strategy"] == "runnable" {
            let f = &row["figures"];
            assert_eq!(f["accepted"], 2, "{row}");
            assert_eq!(f["divergent"], 0, "{row}");
            assert!(
                f["tokens"]["suggestion"]["calls"].as_u64().unwrap_or(0) >= 3,
                "{row}"
            );
        }
    }
    let md = std::fs::read_to_string(prefix.with_extension("md")).expect("md");
    assert!(md.contains("made live by stand-in"), "{md}");
    // The suggester never saw an input the user had not typed yet.
    let requests = seen.lock().expect("log").clone();
    assert!(!requests.is_empty());
    for r in &requests {
        assert!(
            !r.contains("show me the diff"),
            "the next input leaked: {r}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

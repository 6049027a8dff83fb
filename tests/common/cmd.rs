//! The `shade` binary as the command-line tests run it: in a private home with none of the
//! caller's model settings (a developer's own config never leaks into a test), and with
//! input typed on its stdin.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use shade_testkit::FakeLlm;

/// `shade SUB` in `dir`, with `home` as `HOME` and `XDG_CONFIG_HOME` and no model settings
/// from the environment (`SHADE_MODEL`, `SHADE_FAST_MODEL`, `OPENAI_*`, `SHADE_CONFIG`).
pub fn shade_in(sub: &str, dir: &Path, home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shade"));
    c.arg(sub)
        .current_dir(dir)
        .env("XDG_CONFIG_HOME", home)
        .env("HOME", home)
        .env_remove("SHADE_MODEL")
        .env_remove("SHADE_FAST_MODEL")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("SHADE_CONFIG");
    c
}

/// `shade chat` with `home` as its project and its home (config and state dir below it),
/// talking to `llm` as `model`.
pub fn chat_in_home(home: &Path, llm: &FakeLlm, model: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shade"));
    c.arg("chat")
        .current_dir(home)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("SHADE_STATE_DIR", home.join("state"))
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("SHADE_MODEL", model)
        .env_remove("SHADE_FAST_MODEL")
        .env_remove("SHADE_CONFIG");
    c
}

/// Run `cmd` with `input` on its stdin, capturing its output.
pub fn run_with_input(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Err(e) = child.stdin.take().unwrap().write_all(input) {
        // A process that stops before reading all its input (an error at start) closes it.
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

/// The tool results the model saw in its last request.
pub fn tool_results(llm: &FakeLlm) -> Vec<String> {
    let reqs = llm.requests();
    let last = reqs.last().expect("no model request");
    last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(shade_testkit::content_text)
        .collect()
}

/// Read one HTTP request from `conn` (a hand-written test server): its head, each line
/// lower-cased and ending in a newline, and its body (`Content-Length` bytes).
pub fn read_request(conn: &TcpStream) -> (String, Vec<u8>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut len = 0;
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        head.push_str(&l);
        head.push('\n');
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    (head, body)
}

//! What a project holds that a command must never see or change (red team round 8, routes
//! 1, 3 and 8): with the home as the project (the supported `cd ~ && shade …` layout) the
//! branch hides, and accept refuses to write, every shade state dir inside it (the own
//! default one, another listed in the registry and marked), the state-dir registry, and —
//! for the agent's modes — the home's credentials (`~/.ssh/id_ed25519`, a project's `.env`).
//!
//! The home is a fixture bound over the test user's password-database home in a private
//! mount namespace of its own (`unshare -m`), so the registry shade reads is the fixture's
//! and neither the real home nor another session is touched. Three ways in: `shade run`
//! (served by the branch server, and in-process), `shade mcp`'s `run_command`, and
//! `shade mcp`'s own file tools (`read_file`, `grep`, `ls`, `write_file`, run in shade's
//! process on the branch). As root and as the plain user; needs root, /dev/fuse, bwrap,
//! python3 and unshare, and fails loudly where one is missing.
#![allow(clippy::unwrap_used)]

mod common;

use common::plain::{copy_of as plain_copy, ids as plain_ids, PLAIN};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Root,
    Plain,
}

/// What the command tries in its branch (cwd: the project, the home). Each line it prints
/// names something it could do.
const PROBE: &str = r#"
for f in .ssh/id_ed25519 proj/.env other/state/history/entry .local/state/shade-state-dirs/0000000000000001/history/entry; do
  v=$(cat "$f" 2>/dev/null) && echo "READ $f: $v"
done
v=$(cat xdg/shade/history/entry 2>/dev/null) && echo "READ-XDG $v"
v=$(cat .aws/credentials dotfiles/aws/credentials 2>/dev/null) && echo "READ aws: $v"
echo "LS-other: $(ls -A other 2>&1 | tr '\n' ' ')"
echo "LS-state: $(ls -A .local/state 2>&1 | tr '\n' ' ')"
echo "LS-ssh: $(ls -A .ssh 2>&1 | tr '\n' ' ')"
mkdir other/state 2>/dev/null && echo "MADE other/state"
mkdir .local/state/shade 2>/dev/null && echo "MADE own-state"
ln -s /etc .local/state/shade-state-dirs 2>/dev/null && echo "MADE registry-link"
mkdir .local/state/shade-state-dirs 2>/dev/null && echo "MADE registry-dir"
mv other other2 2>/dev/null && echo "MOVED other"
mv .local .local2 2>/dev/null && echo "MOVED .local"
rmdir other 2>/dev/null && echo "REMOVED other"
echo key > .ssh/id_ed25519 2>/dev/null && echo "REPLACED .ssh/id_ed25519"
echo key > .ssh/authorized_keys 2>/dev/null && echo "MADE .ssh/authorized_keys"
rm .aws 2>/dev/null && mkdir .aws 2>/dev/null && echo "REPLACED .aws"
echo PROBE-END
"#;

/// An MCP client over stdio: argv is shade's (run with `mcp` added). Creates a branch and
/// tries the agent's file tools and `run_command` on what must stay hidden.
const CLIENT: &str = r#"
import json, subprocess, sys
p = subprocess.Popen(sys.argv[2:] + ["mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
probe = open(sys.argv[1]).read()
n = 0
def rpc(method, params, notify=False):
    global n
    msg = {"jsonrpc": "2.0", "method": method, "params": params}
    if not notify:
        n += 1; msg["id"] = n
    p.stdin.write(json.dumps(msg) + "\n"); p.stdin.flush()
    if notify:
        return None
    while True:
        line = p.stdout.readline()
        if not line:
            sys.exit("shade mcp closed")
        r = json.loads(line)
        if r.get("id") == n:
            return r
def call(name, args):
    r = rpc("tools/call", {"name": name, "arguments": args})
    res = r.get("result", r.get("error"))
    text = " ".join(c.get("text", "") for c in res.get("content", [])) if isinstance(res, dict) else str(res)
    print(f"TOOL {name} {json.dumps(args)} => {text}".replace("\n", " | "))
    return res
rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
rpc("notifications/initialized", {}, notify=True)
b = call("create_branch", {})["structuredContent"]["branch"]
for path in [".ssh/id_ed25519", "proj/.env", "other/state/history/entry", ".local/state/shade-state-dirs"]:
    call("read_file", {"branch": b, "path": path})
call("grep", {"branch": b, "pattern": "h39", "path": "."})
call("ls", {"branch": b, "path": "."})
call("ls", {"branch": b, "path": ".local/state"})
call("ls", {"branch": b, "path": "other"})
call("write_file", {"branch": b, "path": ".ssh/authorized_keys", "content": "key\n"})
call("write_file", {"branch": b, "path": "other/state/history/forged", "content": "x\n"})
call("write_file", {"branch": b, "path": ".local/state/shade-state-dirs", "content": "x\n"})
call("run_command", {"branch": b, "command": probe})
call("abort_branch", {"branch": b})
p.stdin.close(); p.wait(timeout=60)
print("CLIENT-END")
"#;

/// The namespace's script: bind the fixture home over the user's home, then run shade
/// (`"$@"`) three ways from it, and end the branch servers it started.
const SCRIPT: &str = r#"
set -u
H=$1; PH=$2; T=$3; shift 3
mount --bind "$H" "$PH" || { echo "BIND-FAILED"; exit 97; }
cd "$PH"
export HOME="$PH"
unset SHADE_STATE_DIR XDG_STATE_HOME XDG_CONFIG_HOME SHADE_CONFIG
echo "== run (served)"
timeout 120 "$@" run -- sh "$T/probe.sh" 2>&1
echo "== run (served, another environment)"
SHADE_LOG=shade_fusefs::served=debug SHADE_STATE_DIR="$PH/.local/state/shade" XDG_STATE_HOME="$PH/xdg" timeout 120 "$@" run -- sh "$T/probe.sh" 2>&1
echo "== run (in-process)"
SHADE_BRANCH_SERVER=0 timeout 120 "$@" run -- sh "$T/probe.sh" 2>&1
echo "== accept"
timeout 120 "$@" run --accept -- sh -c 'echo new > newfile; echo forged > far/st2/forged' 2>&1
echo "accept-status=$?"
echo "== mcp"
timeout 180 python3 "$T/client.py" "$T/probe.sh" "$@" 2>&1
echo "== end"
rm -f "$PH/.local/state/shade/servers/"*.sock
for i in $(seq 400); do grep -q "$PH/.local/state/shade/" /proc/self/mountinfo || break; sleep 0.05; done
"#;

/// Runs the whole scenario as `who`; returns the output by section (run served, run
/// in-process, accept, mcp) and the fixture home (on the host) for what accept wrote.
fn scenario(who: Who) -> (Vec<String>, tempfile::TempDir, PathBuf) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests run as root (they also become the plain user {PLAIN})"
    );
    for tool in ["/usr/bin/python3", "/usr/bin/setpriv", "/usr/bin/unshare"] {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: run scripts/setup.sh"
        );
    }
    if who == Who::Plain {
        common::plain::require_fuse();
    }
    let tmp = tempfile::Builder::new()
        .prefix("shade-hidden-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let t = tmp.path().canonicalize().unwrap();
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = t.join("home");
    let passwd_home = match who {
        Who::Root => PathBuf::from("/root"),
        Who::Plain => PathBuf::from(format!("/home/{PLAIN}")),
    };
    let files = [
        (".ssh/id_ed25519", "SECRET-SSH-h39"),
        ("proj/.env", "SECRET-ENV-h39"),
        ("proj/main.rs", "fn main() {}"),
        // Another state dir, marked and listed in the registry (as the home sees it).
        ("other/state/SHADE-STATE-DIR", "marker"),
        ("other/state/history/entry", "SECRET-STATE-h39"),
        // A marked one no list names: found at accept by its marker.
        ("far/st2/SHADE-STATE-DIR", "marker"),
        // `$XDG_STATE_HOME/shade` of a client whose environment the branch server (started
        // by another client) does not share: a state dir for that client only.
        ("xdg/shade/history/entry", "XDG-STATE-h39"),
        // A credential directory that is a symlink to another place in the project.
        ("dotfiles/aws/credentials", "SECRET-AWS-h39"),
    ];
    for (rel, text) in files {
        let p = home.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    }
    let reg = home.join(".local/state/shade-state-dirs");
    std::fs::create_dir_all(&reg).unwrap();
    std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(
        passwd_home.join("other/state"),
        reg.join("0000000000000001"),
    )
    .unwrap();
    std::fs::set_permissions(home.join(".ssh"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink("dotfiles/aws", home.join(".aws")).unwrap();
    std::fs::write(t.join("probe.sh"), PROBE).unwrap();
    std::fs::write(t.join("client.py"), CLIENT).unwrap();
    if who == Who::Plain {
        common::plain::chown_tree(&home);
        let (uid, gid) = plain_ids();
        std::os::unix::fs::lchown(reg.join("0000000000000001"), Some(uid), Some(gid)).unwrap();
    }
    // SHADE_HIDDEN_BIN: the same scenario against another build (one without the fix).
    let bin = std::env::var("SHADE_HIDDEN_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_shade").to_string());
    let shade: Vec<String> = match who {
        Who::Root => vec![bin],
        Who::Plain => vec![
            "/usr/bin/setpriv".into(),
            format!("--reuid={PLAIN}"),
            format!("--regid={PLAIN}"),
            "--init-groups".into(),
            "--".into(),
            plain_copy(&bin).display().to_string(),
        ],
    };
    let out = Command::new("/usr/bin/unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "bash",
            "-c",
            SCRIPT,
            "bash",
        ])
        .arg(&home)
        .arg(&passwd_home)
        .arg(&t)
        .args(&shade)
        .env_remove("SHADE_STATE_DIR")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!text.contains("BIND-FAILED"), "{text}");
    let sections: Vec<String> = format!("\n{text}")
        .split("\n== ")
        .map(str::to_string)
        .collect();
    assert_eq!(sections.len(), 7, "sections missing:\n{text}");
    (sections[1..6].to_vec(), tmp, home)
}

/// Lines of `s` that show something hidden was read, listed, made, moved or replaced.
fn breaches(s: &str, credentials_hidden: bool) -> Vec<String> {
    let mut bad = Vec::new();
    // A tool's result is one line, its output lines joined by " | ".
    let lines = s.lines().flat_map(|l| match l.split_once(" => ") {
        Some((call, result)) if call.starts_with("TOOL ") => result.split(" | ").collect(),
        _ => vec![l],
    });
    for line in lines {
        let l = line.trim();
        let cred = l.contains(".ssh")
            || l.contains(".env")
            || l.contains("aws")
            || l.contains("SECRET-SSH");
        let state_read = l.contains("SECRET-STATE");
        let made = ["MADE ", "MOVED ", "REMOVED ", "REPLACED "]
            .iter()
            .any(|w| l.starts_with(w));
        let listed = (l.starts_with("LS-state:")
            && (l.contains("shade-state-dirs") || l.split(' ').any(|w| w == "shade")))
            || (l.starts_with("LS-other:") && l.contains("state"));
        if state_read || listed || (made && !cred) {
            bad.push(line.to_string());
        }
        if credentials_hidden
            && (l.contains("SECRET-SSH")
                || l.contains("SECRET-ENV")
                || l.contains("SECRET-AWS")
                || (made && cred))
        {
            bad.push(line.to_string());
        }
        if credentials_hidden && l.starts_with("LS-ssh:") && l.contains("id_ed25519") {
            bad.push(line.to_string());
        }
    }
    bad
}

fn hidden_in_project(who: Who) {
    let (s, _tmp, home) = scenario(who);
    let (run, other_env, inproc, accept, mcp) = (&s[0], &s[1], &s[2], &s[3], &s[4]);
    // The server was started by the first run, without XDG_STATE_HOME: what the second
    // client's environment names is hidden all the same (the client sends it along).
    assert!(run.contains("READ-XDG XDG-STATE-h39"), "{run}");
    assert!(other_env.contains("PROBE-END"), "{other_env}");
    assert!(
        other_env.contains("branch served by the branch server"),
        "{other_env}"
    );
    assert!(!other_env.contains("XDG-STATE-h39"), "{other_env}");
    for (what, out) in [
        ("served", run),
        ("served, another environment", other_env),
        ("in-process", inproc),
    ] {
        assert!(
            out.contains("PROBE-END"),
            "{what} run did not finish:\n{out}"
        );
        let bad = breaches(out, false);
        assert!(
            bad.is_empty(),
            "shade run ({what}) got through: {bad:#?}\n{out}"
        );
        // `shade run` is the user's own command: it keeps the credentials (unless
        // `hide_credentials`), as outside the project.
        assert!(
            out.contains("READ .ssh/id_ed25519: SECRET-SSH-h39"),
            "shade run lost the user's key ({what}):\n{out}"
        );
    }
    // The marked state dir no list names is visible, but accept refuses to write it, and
    // nothing of the changeset is written.
    assert!(!home.join("far/st2/forged").exists(), "{accept}");
    assert!(!home.join("newfile").exists(), "{accept}");
    assert!(
        !accept.contains("accept-status=0") && accept.contains("state-dir marker"),
        "accept was not refused:\n{accept}"
    );
    assert!(mcp.contains("CLIENT-END"), "mcp did not finish:\n{mcp}");
    assert!(mcp.contains("PROBE-END"), "run_command did not run:\n{mcp}");
    let bad = breaches(mcp, true);
    assert!(bad.is_empty(), "shade mcp got through: {bad:#?}\n{mcp}");
    if std::env::var_os("SHOW").is_some() {
        println!("{}", s.join("\n== "));
    }
    // The agent's file tools: no secret, no listing of what is hidden, no write there.
    for line in mcp.lines().filter(|l| l.starts_with("TOOL ")) {
        let (call, result) = line.split_once(" => ").unwrap_or((line, ""));
        for secret in [
            "SECRET-SSH-h39",
            "SECRET-ENV-h39",
            "SECRET-STATE-h39",
            "SECRET-AWS-h39",
        ] {
            assert!(!result.contains(secret), "{line}");
        }
        if call.starts_with("TOOL ls") {
            for name in ["shade-state-dirs", "id_ed25519", ".env"] {
                assert!(!result.contains(name), "{line}");
            }
            if call.contains("\"other\"") || call.contains("\".local/state\"") {
                assert!(result.ends_with("is empty."), "{line}");
            }
        }
    }
    for rel in [
        ".ssh/authorized_keys",
        "other/state/history/forged",
        "other2",
        ".local2",
    ] {
        assert!(!home.join(rel).exists(), "{rel} was written\n{mcp}");
    }
    assert_eq!(
        std::fs::read_to_string(home.join(".ssh/id_ed25519")).unwrap(),
        "SECRET-SSH-h39"
    );
    assert!(std::fs::symlink_metadata(home.join(".aws"))
        .unwrap()
        .is_symlink());
    assert!(
        std::fs::symlink_metadata(home.join(".local/state/shade-state-dirs"))
            .unwrap()
            .is_dir()
    );
}

#[test]
fn hidden_in_project_as_root() {
    hidden_in_project(Who::Root);
}

#[test]
fn hidden_in_project_as_plain_user() {
    hidden_in_project(Who::Plain);
}

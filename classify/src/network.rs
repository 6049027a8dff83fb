//! Does a script need the network? Speculative commands run with the network off, so the
//! speculation engine stops (a boundary) before one that does. Every command in the script
//! counts, wherever it sits (also inside substitutions), read-only or not.

use tree_sitter::Node;

use super::{git, words};

/// Programs that exist to talk to other hosts.
const ALWAYS: &[&str] = &[
    "curl",
    "wget",
    "ssh",
    "scp",
    "sftp",
    "rsync",
    "nc",
    "ncat",
    "netcat",
    "telnet",
    "ftp",
    "ping",
    "ping6",
    "dig",
    "nslookup",
    "host",
    "whois",
    "http",
    "https",
    "xh",
    "aria2c",
    "gh",
    "aws",
    "gcloud",
    "az",
    "npx",
    "bunx",
    "pnpx",
    "traceroute",
    "mosh",
    "socat",
];

pub(super) fn needs_network(root: Node, src: &[u8]) -> bool {
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        if node.kind() == "command" && command_needs_network(node, src) {
            return true;
        }
        // bash opens a socket for `< /dev/tcp/HOST/PORT`.
        if node.kind() == "file_redirect" {
            let dest = node
                .child_by_field_name("destination")
                .and_then(|d| d.utf8_text(src).ok())
                .unwrap_or("");
            if dest.starts_with("/dev/tcp/") || dest.starts_with("/dev/udp/") {
                return true;
            }
        }
        let mut cursor = node.walk();
        stack.extend(node.children(&mut cursor));
    }
    false
}

fn command_needs_network(node: Node, src: &[u8]) -> bool {
    let Some(name) = node
        .child_by_field_name("name")
        .and_then(|n| n.named_child(0))
        .and_then(|n| words::value(n, src))
    else {
        return false;
    };
    let mut cursor = node.walk();
    let args: Vec<String> = node
        .children_by_field_name("argument", &mut cursor)
        .map(|a| words::value(a, src).unwrap_or_default())
        .collect();
    program_needs_network(&name, &args)
}

/// Whether running `name args…` talks to the network. The name is compared without its
/// directory and case (`/usr/bin/CURL` is curl).
pub(super) fn program_needs_network(name: &str, args: &[String]) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    let words: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let sub = words.first().copied().unwrap_or("");
    let sub2 = words.get(1).copied().unwrap_or("");
    match base.as_str() {
        b if ALWAYS.contains(&b) => true,
        "git" => git_needs_network(args),
        "npm" | "pnpm" | "bun" => matches!(
            sub,
            "install"
                | "i"
                | "ci"
                | "add"
                | "update"
                | "up"
                | "upgrade"
                | "publish"
                | "view"
                | "info"
                | "show"
                | "outdated"
                | "audit"
                | "login"
                | "dlx"
                | "create"
                | "exec"
                | "x"
                | "search"
                | "unpublish"
                | "deprecate"
                | "pack"
                | "init"
        ),
        "yarn" => matches!(
            sub,
            "" | "install"
                | "add"
                | "upgrade"
                | "up"
                | "dlx"
                | "create"
                | "info"
                | "npm"
                | "publish"
                | "outdated"
                | "audit"
        ),
        "pip" | "pip3" | "pipx" | "poetry" | "pdm" | "conda" | "mamba" | "micromamba" => matches!(
            sub,
            "install"
                | "download"
                | "search"
                | "add"
                | "update"
                | "upgrade"
                | "lock"
                | "index"
                | "run"
                | "create"
                | "publish"
                | "sync"
        ),
        "uv" => {
            matches!(
                sub,
                "add" | "sync" | "lock" | "run" | "tool" | "venv" | "publish"
            ) || (sub == "pip" && matches!(sub2, "install" | "download" | "sync" | "compile"))
        }
        "python" | "python3" => {
            let m = args.iter().position(|a| a == "-m");
            m.and_then(|i| args.get(i + 1)).map(String::as_str) == Some("pip")
                && args
                    .iter()
                    .any(|a| matches!(a.as_str(), "install" | "download"))
        }
        "cargo" => matches!(
            sub,
            "install"
                | "fetch"
                | "update"
                | "publish"
                | "search"
                | "login"
                | "add"
                | "yank"
                | "owner"
                | "vendor"
        ),
        "go" => matches!(sub, "get" | "install") || (sub == "mod" && sub2 == "download"),
        "gem" => matches!(sub, "install" | "update" | "fetch" | "push" | "search"),
        "bundle" | "bundler" => matches!(sub, "" | "install" | "update" | "add"),
        "composer" => matches!(sub, "install" | "require" | "update" | "create-project"),
        "apt" | "apt-get" | "aptitude" => matches!(
            sub,
            "install"
                | "update"
                | "upgrade"
                | "dist-upgrade"
                | "full-upgrade"
                | "download"
                | "source"
        ),
        "dnf" | "yum" | "zypper" => matches!(sub, "install" | "update" | "upgrade" | "download"),
        "apk" => matches!(sub, "add" | "update" | "upgrade" | "fetch"),
        "brew" => matches!(sub, "install" | "update" | "upgrade" | "fetch" | "tap"),
        "docker" | "podman" => matches!(sub, "pull" | "push" | "login" | "search" | "build"),
        "rustup" => matches!(
            sub,
            "update" | "install" | "toolchain" | "target" | "component" | "self"
        ),
        "deno" => matches!(sub, "install" | "cache" | "add"),
        _ => false,
    }
}

/// `git fetch/pull/push/clone/…`, `git remote update/show/prune`, `git submodule update`.
fn git_needs_network(args: &[String]) -> bool {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if !a.starts_with('-') {
            break;
        }
        // Global options whose value is the next argument.
        i += if matches!(
            a.as_str(),
            "-C" | "-c" | "--git-dir" | "--work-tree" | "--namespace"
        ) {
            2
        } else {
            1
        };
    }
    let sub = args.get(i).map(String::as_str).unwrap_or("");
    let next = args
        .get(i + 1..)
        .unwrap_or(&[])
        .iter()
        .find(|a| !a.starts_with('-'))
        .map(String::as_str)
        .unwrap_or("");
    git::NETWORK.contains(&sub)
        || (sub == "remote" && matches!(next, "update" | "show" | "prune"))
        || (sub == "archive" && args.iter().any(|a| a.starts_with("--remote")))
}

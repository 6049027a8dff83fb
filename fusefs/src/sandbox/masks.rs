//! The home as an agent's command sees it through the outside layer: credential files
//! absent and configuration files that carry secrets among settings tools need served as
//! sanitized copies (red team round 5).
//!
//! Both are made in an extra lower layer of the overlay of the unit that holds them (see
//! outside.rs): a whiteout hides a file or directory, a copy stands over the host's file.
//! Neither is read-only: the command may write the copy, or create a file where one is
//! hidden, and the write lands in the branch's outside layer as any other. Where no layer
//! covers a path, the sandbox hides it the old way (bound to `/dev/null`, see
//! [`super::env::hide_args`]).

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::env::{self, EnvPolicy};

/// What a command sees of one host path of a home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Masked {
    /// Absent.
    Hidden,
    /// This content (the host file sanitized) in the host file's place.
    Copy(Vec<u8>),
}

/// How a configuration file is sanitized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// git's config: no credential helper, include, extra header, URL with a login.
    Git,
    /// `key = value` / `key: value` lines (TOML, INI, properties, env files, cabal's).
    Lines,
    /// mise's: [`Kind::Lines`], and no `[env]` section at all (variables by any name).
    Mise,
}

/// Configuration files of a home that tools read and that may carry secrets, relative to
/// it, with how they are sanitized.
const SANITIZED: &[(&str, Kind)] = &[
    (".gitconfig", Kind::Git),
    (".config/git/config", Kind::Git),
    (".cargo/config.toml", Kind::Lines),
    (".cargo/config", Kind::Lines),
    (".config/go/env", Kind::Lines),
    (".config/uv/uv.toml", Kind::Lines),
    (".config/pip/pip.conf", Kind::Lines),
    (".pip/pip.conf", Kind::Lines),
    (".condarc", Kind::Lines),
    (".config/mise/config.toml", Kind::Mise),
    (".config/mise/config.local.toml", Kind::Mise),
    (".mise.toml", Kind::Mise),
    (".cabal/config", Kind::Lines),
    (".config/cabal/config", Kind::Lines),
    (".ccache/ccache.conf", Kind::Lines),
    (".config/ccache/ccache.conf", Kind::Lines),
    (".config/pypoetry/config.toml", Kind::Lines),
];

/// Directories of scripts a build tool runs for every build (sbt's global settings,
/// Gradle's init scripts), which are code and cannot be sanitized: each file there that
/// mentions a credential is hidden.
const SCANNED: &[&str] = &[
    ".sbt/0.13",
    ".sbt/1.0",
    ".gradle/init.d",
    ".gradle/init.gradle",
    ".gradle/init.gradle.kts",
];

/// Files larger than this are hidden rather than sanitized (a copy is made per command).
const MAX_COPY: u64 = 256 * 1024;

/// Words whose mention hides a file of [`SCANNED`].
const SCAN_WORDS: &[&str] = &[
    "credential",
    "password",
    "passwd",
    "token",
    "secret",
    "apikey",
    "api_key",
    "authorization",
];

/// The host paths of `homes` a command of `policy` sees otherwise than they are, resolved,
/// none that holds `project` or lies in it: every credential path of a home
/// ([`env::credential_paths`], hidden) and the sanitized configuration files whose copy
/// differs. Empty for the user's own commands unless `hide_credentials`.
pub(crate) fn home_masks(
    policy: EnvPolicy,
    homes: &[PathBuf],
    project: &Path,
) -> Vec<(PathBuf, Masked)> {
    if policy == EnvPolicy::User && !env::config().hide_credentials {
        return Vec::new();
    }
    masks_of(&env::credential_paths(homes, Some(project)), homes, project)
}

/// [`home_masks`] for a command whose files are hidden, with `credentials` the
/// [`env::credential_paths`] of `homes` already found.
pub(crate) fn masks_of(
    credentials: &[PathBuf],
    homes: &[PathBuf],
    project: &Path,
) -> Vec<(PathBuf, Masked)> {
    let real_homes: Vec<PathBuf> = homes
        .iter()
        .filter_map(|h| std::fs::canonicalize(h).ok())
        .collect();
    let project_real = std::fs::canonicalize(project).unwrap_or_else(|_| project.to_path_buf());
    let clear =
        |p: &Path| !(p.starts_with(&project_real) || project_real.starts_with(p) || p == project);
    let credentials: Vec<PathBuf> = credentials
        .iter()
        .filter(|p| real_homes.iter().any(|h| p.starts_with(h) && *p != h))
        .cloned()
        .collect();
    masks_where(&credentials, homes, clear)
}

/// The paths of the home a command of a mode that hides credentials may not see that lie
/// inside `project` (canonical): the credential paths there
/// ([`env::credential_paths_inside`]) and the secret-bearing configuration files and build
/// scripts [`masks_of`] would sanitize or hide outside it. The branch hides them all, the
/// sanitized copies too (a copy would be a change of the branch, written back by accept).
pub(crate) fn inside_project(homes: &[PathBuf], project: &Path) -> Vec<PathBuf> {
    let credentials = env::credential_paths_inside(homes, project);
    let inside = |p: &Path| p.starts_with(project) && p != project;
    // Only homes that meet the project have configuration files inside it.
    let homes: Vec<PathBuf> = homes
        .iter()
        .filter_map(|h| std::fs::canonicalize(h).ok())
        .filter(|h| h.starts_with(project) || project.starts_with(h))
        .collect();
    let mut out: Vec<PathBuf> = masks_where(&credentials, &homes, inside)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The masks of `credentials` (hidden) and of the configuration files of `homes`, of the
/// paths `clear` lets through.
fn masks_where(
    credentials: &[PathBuf],
    homes: &[PathBuf],
    clear: impl Fn(&Path) -> bool,
) -> Vec<(PathBuf, Masked)> {
    let mut out: Vec<(PathBuf, Masked)> = credentials
        .iter()
        .filter(|p| clear(p))
        .map(|p| (p.clone(), Masked::Hidden))
        .collect();
    let hidden = |out: &[(PathBuf, Masked)], p: &Path| out.iter().any(|(h, _)| p.starts_with(h));
    let mut configs: Vec<(PathBuf, Kind)> = Vec::new();
    for home in homes {
        configs.extend(SANITIZED.iter().map(|(rel, k)| (home.join(rel), *k)));
        for rel in SCANNED {
            let p = home.join(rel);
            let files: Vec<PathBuf> = match std::fs::read_dir(&p) {
                Ok(d) => d.flatten().map(|e| e.path()).collect(),
                Err(_) => vec![p],
            };
            for f in files {
                let Ok(real) = std::fs::canonicalize(&f) else {
                    continue;
                };
                if !real.is_file() || hidden(&out, &real) || !clear(&real) {
                    continue;
                }
                let text = read_small(&real);
                // Too large to read: hidden as well.
                if text.as_deref().is_none_or(mentions_secret) && file_len(&real) > 0 {
                    out.push((real, Masked::Hidden));
                }
            }
        }
    }
    if let Some(xdg) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        configs.push((PathBuf::from(xdg).join("git/config"), Kind::Git));
    }
    for (path, kind) in configs {
        let Ok(real) = std::fs::canonicalize(&path) else {
            continue;
        };
        if !real.is_file()
            || hidden(&out, &real)
            || !clear(&real)
            || out.iter().any(|(p, _)| *p == real)
        {
            continue;
        }
        let Some(text) = read_small(&real) else {
            // Too large or unreadable: hidden, never shown as it is.
            out.push((real, Masked::Hidden));
            continue;
        };
        let clean = match kind {
            Kind::Git => sanitize_git(&text),
            Kind::Lines => sanitize_lines(&text, false),
            Kind::Mise => sanitize_lines(&text, true),
        };
        if clean != text {
            out.push((real, Masked::Copy(clean)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// A regular file's content, when it is at most [`MAX_COPY`] bytes.
fn read_small(p: &Path) -> Option<Vec<u8>> {
    let f = std::fs::File::open(p).ok()?;
    if f.metadata().ok()?.len() > MAX_COPY {
        return None;
    }
    let mut buf = Vec::new();
    f.take(MAX_COPY + 1).read_to_end(&mut buf).ok()?;
    (buf.len() as u64 <= MAX_COPY).then_some(buf)
}

/// Whether a setting `name = value` carries a secret: a secret's name
/// ([`env::is_secret`], with `.` and `-` as word separators) or a credential in the value.
fn secret_setting(name: &[u8], value: &[u8]) -> bool {
    let name: Vec<u8> = name
        .iter()
        .map(|&b| if matches!(b, b'.' | b'-') { b'_' } else { b })
        .collect();
    let name = String::from_utf8_lossy(&name);
    let name = name.trim().trim_matches('"');
    // is_secret keeps a few names whatever their value (HOME, PATH): a value with a login
    // is still one.
    env::is_secret(OsStr::new(name), OsStr::from_bytes(value)) || env::value_has_credential(value)
}

/// git's config without what carries or reaches a credential: `[credential]` sections
/// (helpers and their stores), `[include]`/`[includeIf]` (files elsewhere, unsanitized),
/// sections whose name is a URL with a login (`[url "https://TOKEN@host/"]`,
/// `[http "https://u:pw@host"]`), `extraHeader`, cookie files, `askpass`, and any setting
/// whose name or value looks secret; lines git cannot parse go too. Names, e-mails,
/// aliases, cores and the rest stay.
pub(crate) fn sanitize_git(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut drop_section = false;
    let mut continuing = false;
    for line in text.split_inclusive(|&b| b == b'\n') {
        let body = line.trim_ascii();
        if continuing {
            // The continuation of a dropped value (`\` at its end).
            continuing = body.ends_with(b"\\");
            continue;
        }
        if body.is_empty() || body.starts_with(b"#") || body.starts_with(b";") {
            out.extend_from_slice(line);
            continue;
        }
        if body.starts_with(b"[") {
            let Some(close) = body.iter().position(|&b| b == b']') else {
                drop_section = true;
                continue;
            };
            let header = &body[1..close];
            let lower = header.to_ascii_lowercase();
            let section = lower
                .split(|&b| b == b' ' || b == b'"' || b == b'.')
                .next()
                .unwrap_or_default();
            drop_section = matches!(section, b"credential" | b"include" | b"includeif")
                || env::url_with_login(header)
                || env::value_has_credential(header);
            if !drop_section {
                // A setting after the header on the same line (`[user] name = x`) is not
                // kept: rare, and checked as one more line would need splitting.
                out.extend_from_slice(&line[..line.len() - line.trim_ascii_start().len()]);
                out.extend_from_slice(&body[..=close]);
                out.push(b'\n');
            }
            continue;
        }
        if drop_section {
            continue;
        }
        let (name, value) = match body.iter().position(|&b| b == b'=') {
            Some(eq) => (&body[..eq], &body[eq + 1..]),
            None => (body, &b""[..]),
        };
        let name_ok = !name.is_empty()
            && name
                .trim_ascii()
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'-');
        let lname = name.trim_ascii().to_ascii_lowercase();
        let dropped = !name_ok
            || matches!(
                lname.as_slice(),
                b"extraheader" | b"cookiefile" | b"askpass" | b"helper"
            )
            || secret_setting(&lname, value);
        if dropped {
            continuing = body.ends_with(b"\\");
            continue;
        }
        out.extend_from_slice(line);
    }
    out
}

/// `key = value` lines (TOML, INI, properties, env and cabal files) without the settings
/// whose name or value looks secret; a value spanning lines goes whole; lines that are no
/// setting, section or comment stay unless they look secret. With
/// `drop_env`, `[env]` sections go whole.
pub(crate) fn sanitize_lines(text: &[u8], drop_env: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut in_env = false;
    // Inside a multi-line array (kept) or string (dropped with its setting), and whether
    // the setting that opened it is kept.
    let mut array: Option<bool> = None;
    let mut string: Option<(&[u8], bool)> = None;
    for line in text.split_inclusive(|&b| b == b'\n') {
        let body = line.trim_ascii();
        if let Some((close, keep)) = string {
            if body.windows(close.len()).any(|w| w == close) {
                string = None;
            }
            if keep {
                out.extend_from_slice(line);
            }
            continue;
        }
        if let Some(keep) = array {
            if body.starts_with(b"]") || body.ends_with(b"]") {
                array = None;
            }
            if keep && !env::value_has_credential(body) {
                out.extend_from_slice(line);
            }
            continue;
        }
        if body.is_empty() || body.starts_with(b"#") || body.starts_with(b";") {
            out.extend_from_slice(line);
            continue;
        }
        if body.starts_with(b"[") && body.ends_with(b"]") {
            let name = body.trim_ascii_start_matches(b'[');
            in_env = drop_env && (name.starts_with(b"env]") || name.starts_with(b"env."));
            if !in_env && !env::value_has_credential(body) {
                out.extend_from_slice(line);
            }
            continue;
        }
        if in_env {
            continue;
        }
        let sep = body.iter().position(|&b| b == b'=' || b == b':');
        let Some(sep) = sep else {
            // No setting (cabal's `repository NAME`, a stanza's name): kept unless it
            // looks secret.
            if !mentions_secret(body) {
                out.extend_from_slice(line);
            }
            continue;
        };
        let (name, value) = (&body[..sep], body[sep + 1..].trim_ascii());
        let bare = name.trim_ascii().trim_ascii_start_matches(b'-');
        let bare = bare.strip_prefix(b"export ").unwrap_or(bare);
        let keep = !bare.is_empty() && !secret_setting(bare, value);
        for q in [&b"\"\"\""[..], &b"'''"[..]] {
            if value.starts_with(q) && !value[3..].windows(3).any(|w| w == q) {
                string = Some((q, keep));
            }
        }
        if value.starts_with(b"[") && !value.ends_with(b"]") && string.is_none() {
            array = Some(keep);
        }
        if keep {
            out.extend_from_slice(line);
        }
    }
    out
}

/// Whether `text` names a credential ([`SCAN_WORDS`]) or carries one.
fn mentions_secret(text: &[u8]) -> bool {
    let lower = text.to_ascii_lowercase();
    SCAN_WORDS
        .iter()
        .any(|w| lower.windows(w.len()).any(|x| x == w.as_bytes()))
        || env::value_has_credential(text)
}

/// `trim_start_matches` for byte slices.
trait TrimBytes {
    fn trim_ascii_start_matches(&self, b: u8) -> &[u8];
}

impl TrimBytes for [u8] {
    fn trim_ascii_start_matches(&self, b: u8) -> &[u8] {
        let n = self.iter().take_while(|&&c| c == b).count();
        &self[n..]
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(b: Vec<u8>) -> String {
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn git_config_keeps_identity_drops_credentials() {
        let text = b"SECRET-junk\n[user]\n\tname = Ann\n\temail = ann@x\n\
[alias]\n\tco = checkout\n\
[url \"https://x-access-token:TOK1@github.com/\"]\n\tinsteadOf = https://github.com/\n\
[http]\n\textraHeader = Authorization: Bearer TOK2\n\tpostBuffer = 100\n\
[http \"https://u:TOK3@h/\"]\n\tsslVerify = false\n\
[credential]\n\thelper = store --file /x\n\
[credential \"https://h\"]\n\tusername = u\n\
[include]\n\tpath = ~/.secret.inc\n\
[includeIf \"gitdir:~/w/\"]\n\tpath = w.inc\n\
[github]\n\ttoken = TOK4\n\
[remote \"o\"]\n\turl = https://u:TOK5@h/r.git\n\tfetch = +refs/*\n\
[sendemail]\n\tsmtpPass = TOK6 \\\n\tTOK7\n\tsmtpserver = s\n";
        let out = s(sanitize_git(text));
        for gone in ["SECRET", "TOK", "helper", "include", "path", "extraHeader"] {
            assert!(!out.contains(gone), "{gone} in\n{out}");
        }
        for kept in [
            "name = Ann",
            "email = ann@x",
            "co = checkout",
            "postBuffer = 100",
            "fetch = +refs/*",
            "smtpserver = s",
            "[remote \"o\"]",
        ] {
            assert!(out.contains(kept), "{kept} lost in\n{out}");
        }
    }

    #[test]
    fn lines_drop_secret_settings() {
        let text =
            b"SECRET-junk\nrepository hackage\n[registry]\ntoken = \"TOK1\"\n[build]\njobs = 4\n\
paths = [\n  \"a\",\n  \"https://u:TOK2@h\",\n]\n\
[[index]]\nurl = \"https://u:TOK3@h/simple\"\n\
GOPROXY=https://u:TOK4@proxy\nGOFLAGS=-mod=mod\n\
password: TOK5\nremote_storage = redis://:TOK6@h\n\
key = \"\"\"\nTOK7\n\"\"\"\nrustflags = \"-C x\"\n";
        let out = s(sanitize_lines(text, false));
        for gone in ["SECRET", "TOK"] {
            assert!(!out.contains(gone), "{gone} in\n{out}");
        }
        for kept in [
            "repository hackage",
            "jobs = 4",
            "\"a\",",
            "GOFLAGS=-mod=mod",
            "rustflags",
            "[[index]]",
        ] {
            assert!(out.contains(kept), "{kept} lost in\n{out}");
        }
        let mise = s(sanitize_lines(
            b"[tools]\nnode = \"20\"\n[env]\nFOO = \"TOK\"\n[settings]\nx = 1\n",
            true,
        ));
        assert!(!mise.contains("TOK") && mise.contains("node") && mise.contains("x = 1"));
    }
}

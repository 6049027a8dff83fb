//! Which checkers a project has: detected from its files (Cargo.toml, pyproject.toml,
//! package.json, go.mod, compile_commands.json) or named in the `[lint]` config section,
//! and how each one is run and read.

use super::diag::{lexical, Severity};
use super::exec::on_path;
use super::parse::Format;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Default time budget of the post-edit diagnostics.
pub const DEFAULT_BUDGET: std::time::Duration = std::time::Duration::from_secs(4);

/// The `[lint]` section of the config file; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LintConfig {
    /// Checkers to use instead of detecting them (`["cargo"]`, `["ruff", "mypy"]`,
    /// `["command"]`, or an LSP server name).
    pub checkers: Option<Vec<String>>,
    /// A project's own lint command, read in the `file:line:col: severity: message` format
    /// (the fallback when nothing is detected).
    pub command: Option<Vec<String>>,
    /// A language server to use (beside the built-in `clangd`, `pylsp`, `ruff-server`).
    pub lsp: Option<LspConfig>,
    /// Time budget of the diagnostics appended to an agent's edit (ms; default 4000).
    pub budget_ms: Option<u64>,
    /// Stop a warm checker daemon after this long without requests (s; default 600).
    pub idle_secs: Option<u64>,
    /// Stop a language server after this long without requests (s; default 300).
    pub server_idle_secs: Option<u64>,
}

impl LintConfig {
    /// The post-edit budget.
    pub fn budget(&self) -> std::time::Duration {
        self.budget_ms
            .map(std::time::Duration::from_millis)
            .unwrap_or(DEFAULT_BUDGET)
    }

    /// The daemon's idle time.
    pub fn idle(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.idle_secs.unwrap_or(600))
    }

    /// A language server's idle time.
    pub fn server_idle(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.server_idle_secs.unwrap_or(300))
    }
}

/// A language server named in the config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LspConfig {
    /// What diagnostics are tagged with and `--checker` selects.
    pub name: String,
    /// The server and its arguments (speaks LSP on stdio).
    pub command: Vec<String>,
    /// File extensions it handles (`["c", "h"]`).
    pub extensions: Vec<String>,
}

/// How a checker runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// Run commands to completion and parse their output.
    Batch {
        /// The commands (most checkers have one; `cc` has one per compile command).
        runs: Vec<Invocation>,
        /// Their output format.
        format: Format,
        /// Severity of diagnostics whose output names none (go vet).
        default_severity: Severity,
    },
    /// A language server kept running and fed the edited files.
    Lsp {
        /// Server and arguments.
        command: Vec<String>,
        /// File extensions it is asked about.
        extensions: Vec<String>,
    },
}

/// One command of a batch checker.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Working directory relative to the project root (`""`: the root).
    pub cwd: String,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

/// A checker of one project.
#[derive(Debug, Clone, PartialEq)]
pub struct Checker {
    /// `cargo`, `ruff`, `clangd`, …
    pub name: String,
    /// How it runs.
    pub kind: Kind,
}

impl Checker {
    fn batch(name: &str, argv: &[&str], format: Format) -> Checker {
        Checker {
            name: name.into(),
            kind: Kind::Batch {
                runs: vec![Invocation {
                    argv: argv.iter().map(|s| s.to_string()).collect(),
                    cwd: String::new(),
                    env: Vec::new(),
                }],
                format,
                default_severity: Severity::Error,
            },
        }
    }

    /// A stable identity of what this checker runs, for the baseline cache key.
    pub fn identity(&self) -> String {
        format!("{}:{:?}", self.name, self.kind)
    }

    /// Whether it is a language server.
    pub fn is_lsp(&self) -> bool {
        matches!(self.kind, Kind::Lsp { .. })
    }
}

/// Why no checker could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    /// Nothing detected and nothing configured.
    #[error("no checker found for {0} (no Cargo.toml, pyproject.toml/*.py with ruff, package.json with eslint/tsc, go.mod, compile_commands.json); set `[lint] command` in the config file")]
    NoneFound(String),
    /// `--checker NAME` or `[lint] checkers` names something unknown or not installed.
    #[error("checker {0}")]
    Unavailable(String),
}

/// Every checker name `--checker` accepts.
pub const KNOWN: &[&str] = &[
    "cargo",
    "ruff",
    "mypy",
    "pyright",
    "eslint",
    "tsc",
    "go-vet",
    "cc",
    "command",
    "clangd",
    "pylsp",
    "ruff-server",
];

/// The checkers to run on `project`: `only` (from `--checker`), else the configured list,
/// else what the project's files call for.
pub fn choose(
    project: &Path,
    cfg: &LintConfig,
    only: Option<&str>,
) -> Result<Vec<Checker>, DetectError> {
    let names: Vec<String> = match (only, &cfg.checkers) {
        (Some(n), _) => vec![n.to_string()],
        (None, Some(list)) => list.clone(),
        (None, None) => {
            let found = detect(project);
            if found.is_empty() {
                if cfg.command.is_some() {
                    vec!["command".into()]
                } else {
                    return Err(DetectError::NoneFound(project.display().to_string()));
                }
            } else {
                found
            }
        }
    };
    names.iter().map(|n| build(project, cfg, n)).collect()
}

/// Names of the checkers whose marker files are in `project` and whose tools are installed.
pub fn detect(project: &Path) -> Vec<String> {
    let has = |f: &str| project.join(f).exists();
    let node_bin = |t: &str| has(&format!("node_modules/.bin/{t}"));
    let mut v = Vec::new();
    if has("Cargo.toml") && on_path("cargo") {
        v.push("cargo".into());
    }
    let python = has("pyproject.toml")
        || has("setup.py")
        || has("ruff.toml")
        || has(".ruff.toml")
        || any_with_ext(project, "py");
    if python && on_path("ruff") {
        v.push("ruff".into());
    }
    if python && (has("mypy.ini") || has(".mypy.ini")) && on_path("mypy") {
        v.push("mypy".into());
    }
    if python && has("pyrightconfig.json") && on_path("pyright") {
        v.push("pyright".into());
    }
    if has("package.json") || has("tsconfig.json") {
        let eslint_cfg = std::fs::read_dir(project).ok().is_some_and(|d| {
            d.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.starts_with(".eslintrc") || n.starts_with("eslint.config.")
            })
        });
        if eslint_cfg && (node_bin("eslint") || on_path("eslint")) {
            v.push("eslint".into());
        }
        if has("tsconfig.json") && (node_bin("tsc") || on_path("tsc")) {
            v.push("tsc".into());
        }
    }
    if has("go.mod") && on_path("go") {
        v.push("go-vet".into());
    }
    if compile_commands(project).is_some() {
        v.push("cc".into());
    }
    v
}

fn any_with_ext(dir: &Path, ext: &str) -> bool {
    std::fs::read_dir(dir).ok().is_some_and(|d| {
        d.flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == ext))
    })
}

/// `compile_commands.json` at the root or in `build/`, project-relative.
fn compile_commands(project: &Path) -> Option<&'static str> {
    ["compile_commands.json", "build/compile_commands.json"]
        .into_iter()
        .find(|f| project.join(f).is_file())
}

/// The checker called `name` for `project`.
pub fn build(project: &Path, cfg: &LintConfig, name: &str) -> Result<Checker, DetectError> {
    let tool = |t: &str| -> Result<String, DetectError> {
        let local = project.join("node_modules/.bin").join(t);
        if local.exists() {
            return Ok(local.to_string_lossy().into_owned());
        }
        if on_path(t) {
            Ok(t.to_string())
        } else {
            Err(DetectError::Unavailable(format!(
                "{name}: `{t}` is not installed"
            )))
        }
    };
    if let Some(l) = cfg.lsp.as_ref().filter(|l| l.name == name) {
        return Ok(Checker {
            name: name.into(),
            kind: Kind::Lsp {
                command: l.command.clone(),
                extensions: l.extensions.clone(),
            },
        });
    }
    let lsp = |cmd: &[&str], exts: &[&str]| -> Result<Checker, DetectError> {
        tool(cmd[0])?;
        Ok(Checker {
            name: name.into(),
            kind: Kind::Lsp {
                command: cmd.iter().map(|s| s.to_string()).collect(),
                extensions: exts.iter().map(|s| s.to_string()).collect(),
            },
        })
    };
    Ok(match name {
        "cargo" => {
            tool("cargo")?;
            let mut c = Checker::batch(
                "cargo",
                &[
                    "cargo",
                    "check",
                    "--workspace",
                    "--message-format=json",
                    "--offline",
                    "--quiet",
                ],
                Format::CargoJson,
            );
            if let Kind::Batch { runs, .. } = &mut c.kind {
                runs[0]
                    .env
                    .push(("CARGO_TERM_COLOR".into(), "never".into()));
                if let Some(dir) = cargo_target_dir(project)? {
                    runs[0].argv.push(format!("--target-dir={}", dir.display()));
                }
            }
            c
        }
        "ruff" => {
            let r = tool("ruff")?;
            Checker::batch(
                "ruff",
                &[
                    &r,
                    "check",
                    "--output-format=json",
                    "--exit-zero",
                    "--no-fix",
                    ".",
                ],
                Format::RuffJson,
            )
        }
        "mypy" => {
            let m = tool("mypy")?;
            Checker::batch(
                "mypy",
                &[
                    &m,
                    "--show-column-numbers",
                    "--show-error-codes",
                    "--no-error-summary",
                    "--no-color-output",
                    "--no-pretty",
                    ".",
                ],
                Format::Gcc,
            )
        }
        "pyright" => {
            let p = tool("pyright")?;
            Checker::batch("pyright", &[&p, "--outputjson"], Format::PyrightJson)
        }
        "eslint" => {
            let e = tool("eslint")?;
            Checker::batch("eslint", &[&e, "-f", "json", "."], Format::EslintJson)
        }
        "tsc" => {
            let t = tool("tsc")?;
            Checker::batch("tsc", &[&t, "--noEmit", "--pretty", "false"], Format::Tsc)
        }
        "go-vet" => {
            tool("go")?;
            Checker::batch("go-vet", &["go", "vet", "./..."], Format::Gcc)
        }
        "cc" => cc(project)?,
        "command" => {
            let argv = cfg.command.clone().ok_or_else(|| {
                DetectError::Unavailable("command: no `[lint] command` in the config file".into())
            })?;
            if argv.is_empty() {
                return Err(DetectError::Unavailable(
                    "command: `[lint] command` is empty".into(),
                ));
            }
            Checker {
                name: "command".into(),
                kind: Kind::Batch {
                    runs: vec![Invocation {
                        argv,
                        cwd: String::new(),
                        env: Vec::new(),
                    }],
                    format: Format::Gcc,
                    default_severity: Severity::Error,
                },
            }
        }
        "clangd" => lsp(
            &[
                "clangd",
                "--log=error",
                "--background-index=false",
                "--pch-storage=memory",
            ],
            &["c", "h", "cc", "cpp", "cxx", "hpp", "hh"],
        )?,
        "pylsp" => lsp(&["pylsp"], &["py"])?,
        "ruff-server" => lsp(&["ruff", "server"], &["py", "pyi"])?,
        other => {
            return Err(DetectError::Unavailable(format!(
                "{other} is unknown (known: {})",
                KNOWN.join(", ")
            )))
        }
    })
}

/// Where cargo must write in `project` so its build output stays in the branch: `None` for
/// its own `target/` (the usual case, where the user's build reads through), else
/// `<project>/target` for a target directory configured outside the project. A project
/// that is a member of a larger workspace is refused: cargo would build the whole
/// workspace into the workspace's target/, outside the project and so outside the branch.
///
/// Found by reading the manifests and cargo's configuration files as cargo does, running
/// nothing: this is decided on the host, and any program run here in the project would be
/// the project's to choose (rustup's `cargo` obeys the project's `rust-toolchain.toml`,
/// whose `path` names any directory; cargo itself obeys `.cargo/config.toml`).
fn cargo_target_dir(project: &Path) -> Result<Option<PathBuf>, DetectError> {
    if let Some(root) = cargo_workspace_root(project).filter(|r| r != project) {
        return Err(DetectError::Unavailable(format!(
            "cargo: {} is a member of the cargo workspace at {}, which builds into its own \
             target/ outside this directory; lint the workspace (-C {})",
            project.display(),
            root.display(),
            root.display()
        )));
    }
    Ok(match configured_target_dir(project) {
        Some(t) if !lexical(&t).starts_with(project) => Some(project.join("target")),
        _ => None,
    })
}

/// A TOML file's table, or `None` when it is missing or unreadable (cargo, run in the
/// sandbox, then reports what is wrong with it).
fn toml_table(path: &Path) -> Option<toml::Table> {
    // A regular file only: a FIFO planted under the name would block shade.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() < 16 << 20) {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    text.parse::<toml::Table>().ok()
}

/// The workspace root cargo would use for the package at `project`: the project itself
/// when its manifest has `[workspace]`, the directory `package.workspace` names, else the
/// nearest ancestor whose manifest has `[workspace]` and does not `exclude` the project
/// (cargo's own search). `None`: no workspace, or a manifest that cannot be read.
fn cargo_workspace_root(project: &Path) -> Option<PathBuf> {
    let manifest = toml_table(&project.join("Cargo.toml"))?;
    if manifest.contains_key("workspace") {
        return Some(project.to_path_buf());
    }
    if let Some(ws) = manifest
        .get("package")
        .and_then(|p| p.get("workspace"))
        .and_then(|w| w.as_str())
    {
        return Some(lexical(&project.join(ws)));
    }
    for dir in project.ancestors().skip(1) {
        let Some(root) = toml_table(&dir.join("Cargo.toml")) else {
            continue;
        };
        let Some(ws) = root.get("workspace") else {
            continue;
        };
        let excluded = ws
            .get("exclude")
            .and_then(|e| e.as_array())
            .is_some_and(|list| {
                list.iter()
                    .filter_map(|e| e.as_str())
                    .any(|e| project.starts_with(lexical(&dir.join(e))))
            });
        if !excluded {
            return Some(dir.to_path_buf());
        }
    }
    None
}

/// `build.target-dir` as cargo run in `project` reads it from its configuration files:
/// `.cargo/config.toml` (or the older `.cargo/config`) in the project and each directory
/// above it, nearest first, then `$CARGO_HOME/config.toml`; a relative path is relative to
/// the directory holding that `.cargo`. The environment's `CARGO_TARGET_DIR` and
/// `CARGO_BUILD_TARGET_DIR` are not passed to the checker (see exec's `UNSET`).
fn configured_target_dir(project: &Path) -> Option<PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let mut dirs: Vec<PathBuf> = project.ancestors().map(|d| d.join(".cargo")).collect();
    if let Some(home) = cargo_home.filter(|h| !dirs.contains(h)) {
        dirs.push(home);
    }
    for dot_cargo in dirs {
        // Cargo reads `config` when both are there.
        let file = ["config", "config.toml"]
            .iter()
            .map(|f| dot_cargo.join(f))
            .find(|f| f.is_file());
        let Some(config) = file.and_then(|f| toml_table(&f)) else {
            continue;
        };
        if let Some(t) = config
            .get("build")
            .and_then(|b| b.get("target-dir"))
            .and_then(|t| t.as_str())
        {
            let base = dot_cargo.parent().unwrap_or(Path::new("/"));
            return Some(lexical(&base.join(t)));
        }
    }
    None
}

/// One `-fsyntax-only` compile per entry of the project's compile database.
fn cc(project: &Path) -> Result<Checker, DetectError> {
    let unavailable = |m: String| DetectError::Unavailable(format!("cc: {m}"));
    let rel = compile_commands(project)
        .ok_or_else(|| unavailable("no compile_commands.json at the root or in build/".into()))?;
    let text = std::fs::read_to_string(project.join(rel))
        .map_err(|e| unavailable(format!("{rel}: {e}")))?;
    let entries: Vec<serde_json::Value> =
        serde_json::from_str(&text).map_err(|e| unavailable(format!("{rel}: {e}")))?;
    let mut runs = Vec::new();
    for e in &entries {
        let args: Vec<String> = match (e["arguments"].as_array(), e["command"].as_str()) {
            (Some(a), _) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            (None, Some(c)) => c.split_whitespace().map(str::to_string).collect(),
            _ => continue,
        };
        let dir = e["directory"].as_str().unwrap_or("");
        let cwd = Path::new(dir)
            .strip_prefix(project)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        runs.push(Invocation {
            argv: syntax_only(&args),
            cwd,
            env: Vec::new(),
        });
    }
    if runs.is_empty() {
        return Err(unavailable(format!("{rel} has no entries")));
    }
    Ok(Checker {
        name: "cc".into(),
        kind: Kind::Batch {
            runs,
            format: Format::Gcc,
            default_severity: Severity::Error,
        },
    })
}

/// A compile command turned into a syntax check: no output file, no linking.
fn syntax_only(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        match a.as_str() {
            "-o" | "-MF" | "-MT" | "-MQ" => skip = true,
            "-c" | "-MD" | "-MMD" => {}
            _ if a.starts_with("-o") && a.len() > 2 => {}
            _ => out.push(a.clone()),
        }
    }
    out.insert(1.min(out.len()), "-fsyntax-only".into());
    out.insert(2.min(out.len()), "-fdiagnostics-color=never".into());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_commands_become_syntax_checks() {
        let a: Vec<String> = ["cc", "-Iinc", "-c", "-o", "a.o", "a.c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            syntax_only(&a),
            [
                "cc",
                "-fsyntax-only",
                "-fdiagnostics-color=never",
                "-Iinc",
                "a.c"
            ]
        );
    }

    #[test]
    fn detection_follows_marker_files_and_config_wins() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            d.path().join("compile_commands.json"),
            r#"[{"directory":"/x","file":"a.c","arguments":["cc","-c","a.c"]}]"#,
        )
        .expect("write");
        assert!(detect(d.path()).contains(&"cc".to_string()));
        let cfg = LintConfig {
            checkers: Some(vec!["command".into()]),
            command: Some(vec!["make".into(), "lint".into()]),
            ..Default::default()
        };
        let c = choose(d.path(), &cfg, None).expect("configured");
        assert_eq!(c[0].name, "command");
        assert!(matches!(
            choose(d.path(), &cfg, Some("nope")),
            Err(DetectError::Unavailable(_))
        ));
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            choose(empty.path(), &LintConfig::default(), None),
            Err(DetectError::NoneFound(_))
        ));
    }

    /// The target directory and the workspace root come from the files, as cargo reads
    /// them, with nothing run: a configuration nearer the project wins, a relative path is
    /// relative to the directory holding `.cargo`, a workspace above claims the project
    /// unless it excludes it.
    #[test]
    fn cargo_layout_is_read_from_the_files() {
        let d = tempfile::tempdir().expect("tempdir");
        let top = std::fs::canonicalize(d.path()).expect("canonical");
        let project = top.join("ws/p");
        std::fs::create_dir_all(project.join("src")).expect("mkdir");
        let manifest = "[package]\nname = \"p\"\nversion = \"0.1.0\"\n";
        std::fs::write(project.join("Cargo.toml"), manifest).expect("write");
        assert_eq!(cargo_target_dir(&project), Ok(None));
        // A target directory configured above, relative to the directory holding .cargo.
        std::fs::create_dir_all(top.join(".cargo")).expect("mkdir");
        std::fs::write(
            top.join(".cargo/config.toml"),
            "[build]\ntarget-dir = \"out\"\n",
        )
        .expect("write");
        assert_eq!(configured_target_dir(&project), Some(top.join("out")));
        assert_eq!(cargo_target_dir(&project), Ok(Some(project.join("target"))));
        // The project's own configuration wins: a directory inside the project is cargo's.
        std::fs::create_dir_all(project.join(".cargo")).expect("mkdir");
        std::fs::write(
            project.join(".cargo/config.toml"),
            "[build]\ntarget-dir = \"t2\"\n",
        )
        .expect("write");
        assert_eq!(cargo_target_dir(&project), Ok(None));
        // A workspace above claims the project...
        std::fs::write(
            top.join("ws/Cargo.toml"),
            "[workspace]\nmembers = [\"p\"]\n",
        )
        .expect("write");
        assert!(matches!(
            cargo_target_dir(&project),
            Err(DetectError::Unavailable(m)) if m.contains("is a member of the cargo workspace")
        ));
        // ... unless it excludes it; the project's own `[workspace]` makes it a root.
        std::fs::write(
            top.join("ws/Cargo.toml"),
            "[workspace]\nexclude = [\"p\"]\n",
        )
        .expect("write");
        assert_eq!(cargo_workspace_root(&project), None);
        std::fs::write(
            top.join("ws/Cargo.toml"),
            "[workspace]\nmembers = [\"p\"]\n",
        )
        .expect("write");
        std::fs::write(
            project.join("Cargo.toml"),
            format!("{manifest}[workspace]\n"),
        )
        .expect("write");
        assert_eq!(cargo_workspace_root(&project), Some(project.clone()));
    }
}

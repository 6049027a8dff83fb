//! An agent's turn in `shade exec --shadow` that installs a Python package for the user
//! (`pip install --user` of a local wheel) and then uses it: both commands run in the same
//! branch, so the second sees what the first wrote under `~/.local`, and the host's home
//! never does (issue 29). Root; needs /dev/fuse, bubblewrap and a python3 with pip (fails
//! loudly without).
#![allow(clippy::unwrap_used)]

mod common;

use common::Fixture;
use serde_json::{json, Value};
use shade_testkit::{last_tool_result, tool_results_since_user, FakeLlm, Reply};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// An interpreter that has pip, by absolute path (the command runs it in the sandbox).
fn python_with_pip() -> PathBuf {
    for candidate in ["python3", "/usr/bin/python3"] {
        let o = Command::new(candidate)
            .args(["-c", "import sys, pip; print(sys.executable)"])
            .output();
        if let Ok(o) = o {
            if o.status.success() {
                return PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
            }
        }
    }
    panic!("no python3 with pip here (scripts/setup.sh installs one)");
}

/// A pure-Python wheel holding `shadeprobe` (VALUE = 42), made by hand in `dir`.
fn wheel(python: &Path, dir: &Path) -> PathBuf {
    let path = dir.join("shadeprobe-1.0-py3-none-any.whl");
    let script = r#"
import sys, zipfile
info = "shadeprobe-1.0.dist-info/"
files = {
    "shadeprobe.py": "VALUE = 42\n",
    info + "METADATA": "Metadata-Version: 2.1\nName: shadeprobe\nVersion: 1.0\n",
    info + "WHEEL": "Wheel-Version: 1.0\nGenerator: shade-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join(f"{name},,\n" for name in files) + info + "RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr(info + "RECORD", record)
"#;
    let o = Command::new(python)
        .args(["-c", script])
        .arg(&path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::describe(&o));
    path
}

#[test]
fn pip_install_user_in_a_shadow_turn_is_used_in_the_branch_and_never_reaches_the_home() {
    common::require_fuse_root();
    let fx = Fixture::new();
    let python = python_with_pip();
    let whl = wheel(&python, fx.tmp.path());
    // Not under the fixture's dir: that one is shared with the sandbox (written for real).
    let home_dir = tempfile::Builder::new()
        .prefix("shade-pip-home-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let home = home_dir.path().to_path_buf();
    let install = format!(
        "{} -m pip install --user --no-index --no-deps --break-system-packages \
         --disable-pip-version-check --no-warn-script-location {} >/dev/null 2>&1; \
         echo installed-$?",
        python.display(),
        whl.display()
    );
    let run = format!(
        "{} -c 'import shadeprobe; print(\"value\", shadeprobe.VALUE, shadeprobe.__file__)'",
        python.display()
    );
    let router = move |body: &Value| match tool_results_since_user(body) {
        0 => Reply::tool("shell", json!({ "command": install })),
        1 => Reply::tool("shell", json!({ "command": run })),
        _ => Reply::text("Installed and used."),
    };
    let llm = FakeLlm::start(Arc::new(router)).unwrap();
    let o = fx
        .shade()
        .args(["exec", "--shadow", "--approval", "yolo"])
        .arg("install shadeprobe for me and use it")
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", fx.tmp.path().join("config"))
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("SHADE_MODEL", "main-model")
        .env_remove("SHADE_FAST_MODEL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("SHADE_CONFIG")
        .env_remove("PYTHONUSERBASE")
        .output()
        .unwrap();
    let log = common::describe(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    let results: Vec<String> = llm.requests().iter().filter_map(last_tool_result).collect();
    assert!(
        results.iter().any(|r| r.contains("installed-0")),
        "pip failed in the branch: {results:?}\n{log}"
    );
    let used = results
        .iter()
        .find(|r| r.contains("value 42"))
        .unwrap_or_else(|| panic!("the package was not importable: {results:?}\n{log}"));
    assert!(
        used.contains(&format!("{}/.local/lib/", home.display())),
        "imported from elsewhere: {used}"
    );
    // The host's home never saw it; the run said where it went.
    assert!(!home.join(".local").exists(), "pip wrote the host's home");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("outside the project (not written by accept):\n  A ~/.local/\n"),
        "the outside write was not listed:\n{log}"
    );
    common::assert_no_shade_mounts(&fx.state);
}

//! The trees the benchmark runs on, built reproducibly on the run's tmpfs.
//!
//! `lower/` is the "project" every system shows: `tree/` holds real crate sources copied
//! from the local cargo registry (crates in name order until the file count is reached,
//! padded with generated files if the registry is small), `big/blob.bin` is the file for
//! sequential reads, `crate/` a real crate with registry dependencies for `cargo check`,
//! `accept/` the files accept-latency runs change. `gen/` is a larger generated tree for
//! branch creation at 100k files. Keeping find/tar inside `tree/` means the blob and the
//! crate's `target/` never distort them.

use crate::timing::{run, sh};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Paths of everything the benchmark builds.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The tmpfs root.
    pub base: PathBuf,
    /// The project every system shows.
    pub lower: PathBuf,
    /// Per-system scratch: overlay upper/work dirs, mount points, copies.
    pub work: PathBuf,
    /// shade's state dir (branch stores and mount points).
    pub state: PathBuf,
    /// Generated tree for branch creation at the large size.
    pub gen: PathBuf,
    /// Bare git repos whose worktrees are `lower/tree` and `gen`, for `git worktree add`.
    pub git_tree: PathBuf,
    pub git_gen: PathBuf,
}

/// Paths relative to a system's root (native lower or a mount point): the find/tar tree,
/// the sequential-read file, the cargo crate, the files accept runs change.
pub const TREE: &str = "tree";
pub const BLOB: &str = "big/blob.bin";
pub const CRATE: &str = "crate";
pub const ACCEPT: &str = "accept";
/// A git repository of the tree's files with a second branch, for `git status`/`checkout`.
pub const REPO: &str = "repo";
/// The fresh-branch section's `cargo test` crate (semver, with its dev-dependencies, test
/// binaries built natively) and `pytest` package (more-itertools' sdist, a git repository),
/// copied from what `scripts/setup.sh bench` fetched into [`FIXTURES`].
pub const CARGO_TEST: &str = "semver";
pub const PYTEST: &str = "more-itertools";
/// Where `scripts/setup.sh bench` leaves the fixtures (outside the run's tmpfs).
pub const FIXTURES: &str = "/var/tmp/shade-bench-fixtures";
const FIXTURE_CRATE: &str = "semver-1.0.28";
const FIXTURE_PY: &str = "more-itertools-10.5.0";
/// An npm project whose lock file `npm ci --offline` installs from the local cache.
pub const NPM: &str = "npm";

/// How big to make things.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sizes {
    pub tree_files: usize,
    pub gen_files: usize,
    pub blob_bytes: u64,
    pub accept_files: usize,
}

/// What was built, for the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TreeInfo {
    pub tree_files: usize,
    pub tree_bytes: u64,
    pub registry_crates: Vec<String>,
    pub generated_padding: usize,
    pub gen_files: usize,
    pub blob_bytes: u64,
    /// Fixtures of the fresh section missing (setup.sh bench not run): their rows skip.
    pub missing_fixtures: Vec<String>,
}

impl Layout {
    /// The layout under the tmpfs at `base` (nothing is created yet).
    pub fn new(base: &Path) -> Layout {
        Layout {
            base: base.to_path_buf(),
            lower: base.join("lower"),
            work: base.join("work"),
            state: base.join("state"),
            gen: base.join("gen"),
            git_tree: base.join("git-tree.git"),
            git_gen: base.join("git-gen.git"),
        }
    }

    /// The real-source tree find and tar walk.
    pub fn tree(&self) -> PathBuf {
        self.lower.join(TREE)
    }
}

/// Build everything under `layout.base`; the generated tree and the git repos only when
/// branch creation is measured (`with_creation`), as they take the longest to make; the
/// npm project for the agent workloads, `repo/` for them and the fresh-branch section.
pub fn build(
    layout: &Layout,
    sizes: &Sizes,
    with_creation: bool,
    with_agent: bool,
    with_repo: bool,
) -> Result<TreeInfo> {
    for d in [&layout.lower, &layout.work, &layout.state] {
        mkdir(d)?;
    }
    // Build output under target/ is gitignored, as in a real project: shade sends its
    // writes to the branch's disk store and accept skips it.
    std::fs::write(layout.lower.join(".gitignore"), "target/\n")?;
    let mut info = TreeInfo::default();
    copy_registry(&layout.tree(), sizes.tree_files, &mut info)?;
    let (files, bytes) = count(&layout.tree())?;
    info.tree_files = files;
    info.tree_bytes = bytes;
    eprintln!(
        "bench: tree: {files} files, {:.0} MB from {} registry crates + {} generated",
        bytes as f64 / 1e6,
        info.registry_crates.len(),
        info.generated_padding
    );
    write_blob(&layout.lower.join(BLOB), sizes.blob_bytes)?;
    info.blob_bytes = sizes.blob_bytes;
    write_crate(&layout.lower.join(CRATE))?;
    let acc = layout.lower.join(ACCEPT);
    mkdir(&acc)?;
    for i in 0..sizes.accept_files {
        std::fs::write(acc.join(format!("f{i:04}.txt")), source_text(i, 2048))?;
    }
    if with_repo {
        eprintln!("bench: git repository of the tree");
        agent_repo(&layout.lower.join(REPO), &layout.tree())?;
        fixtures(layout, &mut info)?;
    }
    if with_agent {
        eprintln!("bench: agent workloads: npm project");
        let npm = layout.lower.join(NPM);
        mkdir(&npm)?;
        std::fs::write(
            npm.join("package.json"),
            include_str!("../npm/package.json"),
        )?;
        std::fs::write(
            npm.join("package-lock.json"),
            include_str!("../npm/package-lock.json"),
        )?;
    }
    if with_creation {
        generate(&layout.gen, sizes.gen_files)?;
        info.gen_files = sizes.gen_files;
        eprintln!(
            "bench: generated tree: {} files; committing both to git",
            sizes.gen_files
        );
        git_repo(&layout.git_tree, &layout.tree())?;
        git_repo(&layout.git_gen, &layout.gen)?;
    }
    Ok(info)
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))
}

/// The local cargo registry's unpacked sources.
fn registry_src() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let src = home.join("registry/src");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&src)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs.into_iter().next()
}

/// Copy whole crates in name order until `want` files are reached; pad with generated files.
fn copy_registry(dest: &Path, want: usize, info: &mut TreeInfo) -> Result<()> {
    mkdir(dest)?;
    let mut have = 0;
    if let Some(src) = registry_src() {
        let mut crates: Vec<PathBuf> = std::fs::read_dir(&src)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        crates.sort();
        for c in crates {
            if have >= want {
                break;
            }
            let name = c.file_name().unwrap_or_default().to_owned();
            have += copy_dir(&c, &dest.join(&name))?;
            info.registry_crates
                .push(name.to_string_lossy().into_owned());
        }
    }
    if have < want {
        let pad = want - have;
        generate(&dest.join("generated"), pad)?;
        info.generated_padding = pad;
    }
    Ok(())
}

/// Recursive copy of regular files, directories and symlinks; returns files copied.
fn copy_dir(src: &Path, dest: &Path) -> Result<usize> {
    mkdir(dest)?;
    let mut n = 0;
    let mut entries: Vec<_> = std::fs::read_dir(src)?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let ft = e.file_type()?;
        let to = dest.join(e.file_name());
        if ft.is_dir() {
            n += copy_dir(&e.path(), &to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &to)?;
        } else if ft.is_file() {
            std::fs::copy(e.path(), &to)
                .with_context(|| format!("copying {}", e.path().display()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Regular files and their bytes under `dir`.
pub fn count(dir: &Path) -> Result<(usize, u64)> {
    let mut files = 0;
    let mut bytes = 0;
    for e in std::fs::read_dir(dir)?.flatten() {
        let ft = e.file_type()?;
        if ft.is_dir() {
            let (f, b) = count(&e.path())?;
            files += f;
            bytes += b;
        } else if ft.is_file() {
            files += 1;
            bytes += e.metadata()?.len();
        }
    }
    Ok((files, bytes))
}

/// Deterministic source-like text of about `len` bytes, different for each `i`.
pub fn source_text(i: usize, len: usize) -> String {
    let mut s = format!("// generated file {i}\n");
    let mut k = 0;
    while s.len() < len {
        s.push_str(&format!(
            "pub fn f{i}_{k}(x: u64) -> u64 {{\n    x.wrapping_mul({}) ^ {}\n}}\n",
            i * 31 + k + 1,
            k * 7 + 3
        ));
        k += 1;
    }
    s
}

/// `n` generated files, 100 per directory in two levels, sizes 200–2,000 bytes.
fn generate(dest: &Path, n: usize) -> Result<()> {
    for i in 0..n {
        let dir = dest.join(format!("d{:03}/e{:02}", i / 10_000, (i / 100) % 100));
        if i % 100 == 0 {
            mkdir(&dir)?;
        }
        let len = 200 + (i * 7919) % 1800;
        std::fs::write(dir.join(format!("f{i}.rs")), source_text(i, len))?;
    }
    Ok(())
}

/// A file of pseudo-random bytes (xorshift, fixed seed) so no layer can compress it away.
fn write_blob(path: &Path, bytes: u64) -> Result<()> {
    if let Some(parent) = path.parent() {
        mkdir(parent)?;
    }
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// The fresh section's `cargo test` and `pytest` projects, made warm as a project that has
/// been worked in: the crate's test binaries built and run once, the package's tests run
/// once (`__pycache__`, `.pytest_cache`) and committed to git for the worktree row.
fn fixtures(layout: &Layout, info: &mut TreeInfo) -> Result<()> {
    let base = Path::new(FIXTURES);
    let krate = base.join(FIXTURE_CRATE);
    if krate.join("Cargo.lock.fetched").exists() {
        eprintln!("bench: fixture crate {FIXTURE_CRATE}: building its tests natively");
        let dest = layout.lower.join(CARGO_TEST);
        run(
            "cp",
            &[OsStr::new("-a"), krate.as_os_str(), dest.as_os_str()],
        )?;
        sh(
            &dest,
            "cargo test --offline --locked -q >/dev/null 2>&1 || cargo test --offline --locked -q",
        )
        .with_context(|| format!("building and running the tests of {FIXTURE_CRATE}"))?;
    } else {
        info.missing_fixtures.push(CARGO_TEST.into());
    }
    let py = base.join(FIXTURE_PY);
    if py.is_dir() && Path::new("/usr/lib/python3/dist-packages/pytest").exists() {
        let dest = layout.lower.join(PYTEST);
        run("cp", &[OsStr::new("-a"), py.as_os_str(), dest.as_os_str()])?;
        let git = "git -c user.name=bench -c user.email=bench@localhost";
        sh(
            &dest,
            &format!(
                "git init -q -b main . && printf '__pycache__/\\n.pytest_cache/\\n' >> .git/info/exclude \
                 && {git} add -A && {git} commit -q --no-verify -m sdist \
                 && /usr/bin/python3 -m pytest -q >/dev/null"
            ),
        )
        .with_context(|| format!("running the tests of {FIXTURE_PY}"))?;
    } else {
        info.missing_fixtures.push(PYTEST.into());
    }
    Ok(())
}

/// A small real crate with registry dependencies (resolved offline), plus a lock file.
fn write_crate(dir: &Path) -> Result<()> {
    mkdir(&dir.join("src"))?;
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"benchcrate\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nanyhow = \"1\"\nglobset = \"0.4\"\nserde_json = \"1\"\n\n[workspace]\n",
    )?;
    let mut lib = String::from(
        "//! A crate for the warm `cargo check` benchmark.\n\n\
         /// Whether `path` matches `glob` and `json` is an array.\n\
         pub fn check(glob: &str, path: &str, json: &str) -> anyhow::Result<bool> {\n    \
         let g = globset::Glob::new(glob)?.compile_matcher();\n    \
         let v: serde_json::Value = serde_json::from_str(json)?;\n    \
         Ok(g.is_match(path) && v.is_array())\n}\n\n",
    );
    for m in 0..20 {
        lib.push_str(&format!("pub mod m{m};\n"));
        std::fs::write(dir.join(format!("src/m{m}.rs")), source_text(m, 4000))?;
    }
    std::fs::write(dir.join("src/lib.rs"), lib)?;
    sh(dir, "cargo generate-lockfile --offline --quiet")
        .context("resolving the bench crate's dependencies offline from ~/.cargo/registry")?;
    Ok(())
}

/// A bare repo at `git_dir` with one commit of everything in `work_tree` (forced past any
/// .gitignore files the crates ship, so worktrees hold the same files).
fn git_repo(git_dir: &Path, work_tree: &Path) -> Result<()> {
    let g = |args: &[&str]| -> Result<()> {
        let mut all: Vec<&OsStr> = vec![
            OsStr::new("-c"),
            OsStr::new("user.name=bench"),
            OsStr::new("-c"),
            OsStr::new("user.email=bench@localhost"),
            OsStr::new("--git-dir"),
            git_dir.as_os_str(),
            OsStr::new("--work-tree"),
            work_tree.as_os_str(),
        ];
        all.extend(args.iter().map(OsStr::new));
        run("git", &all)
    };
    run(
        "git",
        &[
            OsStr::new("init"),
            OsStr::new("-q"),
            OsStr::new("--bare"),
            git_dir.as_os_str(),
        ],
    )?;
    g(&["add", "-A", "-f"])?;
    g(&["commit", "-q", "--no-verify", "-m", "bench tree"])?;
    if !git_dir.join("HEAD").exists() {
        bail!("git repo {} not created", git_dir.display());
    }
    Ok(())
}

/// A git repository at `dir` holding a copy of `src` on branch `main`, and a branch
/// `other` that changes every 10th file, deletes every 97th and adds 100: what switching
/// to a colleague's branch looks like. Left on `main`, clean.
fn agent_repo(dir: &Path, src: &Path) -> Result<()> {
    copy_dir(src, dir)?;
    let git = "git -c user.name=bench -c user.email=bench@localhost";
    sh(
        dir,
        &format!(
            "git init -q -b main . && {git} add -A -f && {git} commit -q --no-verify -m main \
             && git checkout -q -b other \
             && git ls-files | awk 'NR % 10 == 0' | while IFS= read -r f; do echo '// changed on other' >> \"$f\"; done \
             && git ls-files | awk 'NR % 97 == 0' | xargs -d '\\n' git rm -q -f -- \
             && mkdir -p added && for i in $(seq 100); do echo \"// added $i\" > added/f$i.rs; done \
             && {git} add -A -f && {git} commit -q --no-verify -m other && git checkout -q main"
        ),
    )
    .with_context(|| format!("building the git repository in {}", dir.display()))?;
    Ok(())
}

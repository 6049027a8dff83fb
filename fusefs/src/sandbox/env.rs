//! Secrets stay home: what a command in a branch inherits of shade's environment, and which
//! credential files of the user's home it may not read.
//!
//! Commands the agent runs (its shell tool, speculation, `shade mcp`, `--shadow`, checkers
//! and language servers) are [`EnvPolicy::Agent`]: their environment is the allowed part of
//! shade's ([`allowed`]: shells', locales', build tools') minus every variable that still
//! looks like a secret (see [`is_secret`]) and minus shade's own, and the
//! home's credential files ([`credential_paths`]) are hidden. What the user runs with
//! `shade run` is [`EnvPolicy::User`]: the environment as it is, the files visible unless
//! the config's `[sandbox] hide_credentials` says otherwise. `[sandbox] pass_env` names the
//! variables an agent's command gets all the same ([`configure`]).
//!
//! The sandbox clears bwrap's environment and hands it this filtered set (no per-variable
//! removal that a new variable would slip past), and hides the files with the last mounts
//! of the sandbox, after every bind, so that no bind re-exposes them.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// Whose command it is, which decides what of shade's environment and home it gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EnvPolicy {
    /// A command the agent (or shade on its behalf) runs: secrets filtered, credential
    /// files hidden. The default for library callers: forgetting to choose must not leak.
    #[default]
    Agent,
    /// A command the user typed (`shade run`): their environment as it is.
    User,
}

/// The config's `[sandbox]` settings about secrets, in force for the whole process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvConfig {
    /// Variables an agent's command gets although they look secret: exact names, or a
    /// prefix ending in `*` (`"NPM_CONFIG_*"`).
    pub pass_env: Vec<String>,
    /// Hide the home's credential files from `shade run` too.
    pub hide_credentials: bool,
}

static CONFIG: RwLock<Option<EnvConfig>> = RwLock::new(None);

/// Sets the `[sandbox]` settings for every later command of this process (the CLI calls it
/// once it has read the config file; library users that never do get the defaults).
pub fn configure(config: EnvConfig) {
    let mut slot = CONFIG.write().unwrap_or_else(|e| e.into_inner());
    *slot = Some(config);
}

/// The `[sandbox]` settings in force.
pub fn config() -> EnvConfig {
    CONFIG
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default()
}

/// Names every command keeps whatever they look like: what builds, shells and tools need to
/// find themselves and the user's locale.
const KEEP: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "PWD",
    "EDITOR",
    "CI",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "GOPATH",
    "GOROOT",
    "JAVA_HOME",
    "NVM_DIR",
    "PYENV_ROOT",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
];

/// The only variables an agent's command gets (besides `[sandbox] pass_env`), exact names:
/// the shell's and terminal's, the locale, temporary directories, compilers' and build
/// tools' settings, proxies and CA bundles (a proxy's password is caught by the second
/// layer, [`is_secret`]). Everything else of shade's environment stays out, whatever its
/// name: a secret's name cannot be guessed (`CODECOV_UPLOAD`, `BEARER`).
const ALLOW_NAMES: &[&str] = &[
    "HOSTNAME",
    "SHLVL",
    "VISUAL",
    "PAGER",
    "LESS",
    "MANPATH",
    "INFOPATH",
    "COLUMNS",
    "LINES",
    "FORCE_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION",
    "TERMINFO",
    "TERMINFO_DIRS",
    "TEMP",
    "TMP",
    "CC",
    "CXX",
    "CPP",
    "LD",
    "AR",
    "AS",
    "NM",
    "RANLIB",
    "STRIP",
    "OBJCOPY",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "LIBS",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "LD_LIBRARY_PATH",
    "MAKE",
    "MAKEFLAGS",
    "MAKELEVEL",
    "MFLAGS",
    "GNUMAKEFLAGS",
    "DEBIAN_FRONTEND",
    "SOURCE_DATE_EPOCH",
    "OMP_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "M2_HOME",
    "BUNDLE_PATH",
    "BUNDLE_GEMFILE",
    "GEM_HOME",
    "GEM_PATH",
    "PERL5LIB",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "ANDROID_HOME",
    "ANDROID_SDK_ROOT",
    "FLUTTER_ROOT",
    "PUB_CACHE",
    "_JAVA_OPTIONS",
    // Go's settings by name: a `GO` prefix would also let `GOOGLE_*` in.
    "GOPATH",
    "GOROOT",
    "GOBIN",
    "GOCACHE",
    "GOMODCACHE",
    "GOFLAGS",
    "GOOS",
    "GOARCH",
    "GOARM",
    "GOAMD64",
    "GOPROXY",
    "GOPRIVATE",
    "GONOPROXY",
    "GONOSUMDB",
    "GOSUMDB",
    "GOTOOLCHAIN",
    "GOEXPERIMENT",
    "GOWORK",
    "GOINSECURE",
    "GODEBUG",
    "GOENV",
    "GOTMPDIR",
    "GOMAXPROCS",
    "GOGC",
    "GOMEMLIMIT",
    "GO111MODULE",
    "GOTELEMETRY",
    "GOVCS",
];

/// Prefixes of the variables an agent's command gets: the locale's, and the settings of
/// toolchains and package managers (their secrets, `CARGO_REGISTRY_TOKEN`,
/// `NPM_CONFIG__AUTH`, are still caught by [`is_secret`]).
const ALLOW_PREFIXES: &[&str] = &[
    "LC_",
    "XDG_",
    "CARGO_",
    "RUSTUP_",
    "RUST_",
    "RUSTC",
    "RUSTFLAGS",
    "RUSTDOC",
    "CGO_",
    "PYTHON",
    "PIP_",
    "PYENV_",
    "POETRY_",
    "PDM_",
    "UV_",
    "CONDA_",
    "VIRTUAL_ENV",
    "NODE_",
    "NPM_CONFIG_",
    "npm_config_",
    "NVM_",
    "YARN_",
    "PNPM_",
    "BUN_",
    "DENO_",
    "JAVA_",
    "JDK_",
    "MAVEN_",
    "GRADLE_",
    "SDKMAN_",
    "CMAKE_",
    "PKG_CONFIG",
    "CCACHE_",
    "SCCACHE_",
    "DOTNET_",
    "RBENV_",
    "PERL_",
    "ZIG_",
    "NIX_",
    "JULIA_",
    "HOMEBREW_",
];

/// Whether an agent's command may get `name` at all (before [`is_secret`] looks).
pub fn allowed(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    KEEP.contains(&name.as_ref())
        || ALLOW_NAMES.contains(&name.as_ref())
        || ALLOW_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A `_`-separated word of a name that is, or ends in, one of these marks a secret
/// (`GITHUB_TOKEN`, `MY_APIKEY`, `DB_PASS`, `OAUTH_CLIENT`).
const SECRET_WORDS: &[&str] = &[
    "KEY",
    "KEYS",
    "SECRET",
    "SECRETS",
    "TOKEN",
    "TOKENS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASS",
    "PASSPHRASE",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "AUTH",
    "COOKIE",
    "COOKIES",
    "SESSION",
    "PRIVATE",
    "PAT",
    "JWT",
    "PWD",
    "BEARER",
    "WEBHOOK",
    "DSN",
];

/// Names that carry or reach a secret without saying so: agents' sockets, credential files.
const SECRET_NAMES: &[&str] = &[
    "SSH_AUTH_SOCK",
    "GPG_AGENT_INFO",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "XAUTHORITY",
    "KUBECONFIG",
    "NETRC",
    "PGPASSFILE",
    "DATABASE_URL",
];

/// Prefixes of shade's own variables and of model and cloud providers' ones (keys,
/// endpoints, accounts): none is a build's business.
const SECRET_PREFIXES: &[&str] = &[
    "SHADE_",
    "OPENAI_",
    "ANTHROPIC_",
    "CLAUDE_",
    "CODEX_",
    "GEMINI_",
    "MISTRAL_",
    "GROQ_",
    "COHERE_",
    "DEEPSEEK_",
    "OPENROUTER_",
    "XAI_",
    "TOGETHER_",
    "FIREWORKS_",
    "PERPLEXITY_",
    "HF_",
    "HUGGINGFACE_",
    "HUGGING_FACE_",
    "REPLICATE_",
    "AWS_",
    "AZURE_",
    "ARM_",
    "GOOGLE_",
    "GCLOUD_",
    "CLOUDSDK_",
    "VAULT_",
    "OP_",
    "DIGITALOCEAN_",
    "HEROKU_",
];

/// Whether a variable looks like a secret: its name (case-insensitive) has a secret word
/// ([`SECRET_WORDS`]) as a `_`-separated word or at a word's end, is one of
/// [`SECRET_NAMES`] or starts with a provider's or shade's prefix ([`SECRET_PREFIXES`]); or
/// its value carries a credential ([`value_has_credential`]: a URL with a login in it, a
/// `password=`-like setting, a token list).
pub fn is_secret(name: &OsStr, value: &OsStr) -> bool {
    let name = name.to_string_lossy().to_ascii_uppercase();
    if KEEP.contains(&name.as_str()) || name.starts_with("LC_") {
        return false;
    }
    SECRET_NAMES.contains(&name.as_str())
        || SECRET_PREFIXES.iter().any(|p| name.starts_with(p))
        || name
            .split('_')
            .filter(|w| !w.is_empty())
            .any(|w| SECRET_WORDS.iter().any(|s| w.ends_with(s)))
        || value_has_credential(value.as_bytes())
}

/// Settings in a value that carry a secret under an allowed name (red team round 2):
/// `JAVA_TOOL_OPTIONS=-Dx.trustStorePassword=…`, `NIX_CONFIG=access-tokens = …`,
/// `PIP_INDEX_URL=https://TOKEN@host/…`, conda's `https://host/t/TOKEN/…`.
const CREDENTIAL_SETTINGS: &[&str] = &[
    "password=",
    "passwd=",
    "pwd=",
    "token=",
    "secret=",
    "apikey=",
    "api_key=",
    "api-key=",
    "access-tokens",
    "authorization:",
    "bearer ",
];

/// Whether `value` carries a credential: a URL with a login (`scheme://user:pw@host`, or a
/// token as the user: `https://TOKEN@host`; ssh's `git@` is not one), a conda token path
/// (`…://host/t/TOKEN/`), or a setting from [`CREDENTIAL_SETTINGS`].
pub(crate) fn value_has_credential(value: &[u8]) -> bool {
    let lower = value.to_ascii_lowercase();
    let has = |needle: &[u8]| lower.windows(needle.len()).any(|w| w == needle);
    url_with_login(value)
        || (has(b"://") && has(b"/t/"))
        || CREDENTIAL_SETTINGS.iter().any(|s| has(s.as_bytes()))
}

/// `scheme://user[:password]@host…` anywhere in `value`, but for the user `git` alone.
pub(crate) fn url_with_login(value: &[u8]) -> bool {
    let mut rest = value;
    while let Some(at) = rest.windows(3).position(|w| w == b"://") {
        let after = &rest[at + 3..];
        let authority_end = after
            .iter()
            .position(|&b| matches!(b, b'/' | b'?' | b'#' | b' ' | b',' | b';'))
            .unwrap_or(after.len());
        let authority = &after[..authority_end];
        if let Some(userinfo_end) = authority.iter().rposition(|&b| b == b'@') {
            let userinfo = &authority[..userinfo_end];
            if !userinfo.is_empty() && userinfo != b"git" {
                return true;
            }
        }
        rest = after;
    }
    false
}

/// Whether `pass_env` names `name`.
fn passed(name: &OsStr, pass_env: &[String]) -> bool {
    let name = name.to_string_lossy();
    pass_env.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => *p == name,
    })
}

/// Whether an agent's command gets the variable: allowed ([`allowed`]) and not looking
/// secret ([`is_secret`]), or named by `pass_env`.
fn agent_gets(name: &OsStr, value: &OsStr, pass_env: &[String]) -> bool {
    (allowed(name) && !is_secret(name, value)) || passed(name, pass_env)
}

/// What of `vars` a command of `policy` gets: the user's everything; an agent's only the
/// allowed names that do not look secret, plus what `pass_env` passes.
pub fn filter(
    policy: EnvPolicy,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    pass_env: &[String],
) -> Vec<(OsString, OsString)> {
    vars.into_iter()
        .filter(|(k, v)| policy == EnvPolicy::User || agent_gets(k, v, pass_env))
        .collect()
}

/// The environment a command of `policy` starts with: this process's, filtered by the
/// configured policy ([`filter`], [`configure`]).
pub fn command_env(policy: EnvPolicy) -> Vec<(OsString, OsString)> {
    filter(policy, std::env::vars_os(), &config().pass_env)
}

/// The names of this process's variables that an agent's command does not get (for
/// `shade doctor`), sorted.
pub fn removed_names() -> Vec<String> {
    let pass = config().pass_env;
    let mut names: Vec<String> = std::env::vars_os()
        .filter(|(k, v)| !agent_gets(k, v, &pass))
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The credential files and directories of a home, relative to it: keys, cloud and
/// registry logins, tokens of agents and tools, browser profiles (cookies), shell and REPL
/// histories (commands typed with passwords in them), shade's own config (the model's
/// key). The one list: add here.
const HOME_CREDENTIALS: &[&str] = &[
    // Keys and agents.
    ".ssh",
    ".gnupg",
    ".password-store",
    ".local/share/keyrings",
    // Clouds and clusters.
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".oci",
    ".config/doctl",
    ".docker/config.json",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".s3cfg",
    ".boto",
    ".config/rclone/rclone.conf",
    // Network and database logins.
    ".netrc",
    ".wakatime.cfg",
    ".pgpass",
    ".my.cnf",
    // Forges and package registries.
    ".git-credentials",
    ".config/git/credentials",
    ".cache/git/credential",
    ".config/gh/hosts.yml",
    ".config/hub",
    ".npmrc",
    ".yarnrc.yml",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings-security.xml",
    ".nuget/NuGet/NuGet.Config",
    // Other agents' logins.
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".config/op",
    // Browser profiles and X cookies.
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".Xauthority",
    ".ICEauthority",
    // Histories.
    ".bash_history",
    ".zsh_history",
    ".local/share/fish/fish_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".sqlite_history",
    // shade's own config (the model's key).
    ".config/shade",
    // Red team round 4: password managers, mail and chat clients, deploy and data tools.
    ".config/Bitwarden CLI",
    ".config/Bitwarden_CLI",
    ".thunderbird",
    ".config/Signal",
    ".config/Slack",
    ".config/discord",
    ".local/share/TelegramDesktop",
    ".config/atuin",
    ".local/share/atuin",
    ".ansible/vault_pass",
    ".vault_pass.txt",
    ".msmtprc",
    ".fetchmailrc",
    ".muttrc",
    ".mutt",
    ".config/aerc",
    ".config/himalaya",
    ".irssi",
    ".weechat",
    ".config/hexchat",
    ".config/stripe",
    ".sentryclirc",
    ".circleci",
    ".travis",
    ".databrickscfg",
    ".snowsql",
    ".dbt",
    ".config/helm",
    ".local/share/com.vercel.cli",
    ".railway",
    ".config/netlify",
    ".tsh",
    ".bluemix",
    ".ibmcloud",
    ".expo",
    ".config/Code/User/globalStorage",
    ".cursor",
    ".aider.conf.yml",
    ".envrc",
    ".config/jira",
    ".config/ollama",
    ".ollama/id_ed25519",
    ".config/pulumi",
    ".aws/sso",
    // Container registries, more agents' and tools' logins, publishing and deploy keys.
    ".config/containers/auth.json",
    ".docker",
    ".gemini",
    ".qwen",
    ".claude.json",
    ".config/github-copilot",
    ".config/gh",
    ".config/glab-cli",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".ivy2/.credentials",
    ".sbt/.credentials",
    ".config/sops",
    ".sops",
    ".age",
    ".config/age",
    ".pulumi",
    ".config/composer/auth.json",
    ".composer/auth.json",
    ".cache/huggingface/token",
    ".cache/huggingface/stored_tokens",
    ".huggingface",
    ".terraformrc",
    ".wrangler",
    ".config/.wrangler",
    ".vercel",
    ".config/vercel",
    ".netlify",
    ".fly",
    ".config/heroku",
    ".config/hcloud",
    ".config/linode-cli",
    ".config/scw",
    ".supabase",
    ".config/configstore",
    ".cloudflared",
    ".config/ngrok",
    ".ngrok2",
    ".config/rclone",
    ".config/filezilla",
    ".pki",
    ".local/share/keyrings",
    // Red team round 5: logins in files of tools under ordinary names (configuration files
    // that tools need are sanitized instead: see masks.rs).
    ".local/share/gem/credentials",
    ".composer/config.json",
    ".config/composer/config.json",
    ".conan/.conan.db",
    ".conan2/.conan.db",
    ".conan/remotes.json",
    ".platformio/appstate.json",
    ".bundle/config",
    ".config/pypoetry/auth.toml",
    ".local/share/python_keyring",
    ".config/nuget/NuGet.Config",
    ".config/NuGet/NuGet.Config",
    ".dotnet/NuGet.Config",
    ".config/hatch/config.toml",
    ".config/deno",
    ".deno/credentials",
    ".pub-cache/credentials.json",
    ".config/dart/pub-credentials.json",
    ".config/rubygems",
    ".ivy2/credentials",
    ".sbt/credentials",
    ".config/coursier/credentials.properties",
    ".lein/credentials.clj.gpg",
    ".Renviron",
    ".julia/servers",
    ".config/gitlab-runner",
    ".config/tea",
    ".config/gitea",
    ".config/lab",
    ".config/glab",
    ".config/packer",
    ".config/jfrog",
    ".jfrog",
];

/// A file name that marks a credential wherever it is in a home (see [`home_pattern_paths`]):
/// tokens, credentials, secrets, OAuth and auth files, `.env` files, private keys and
/// keystores.
fn credential_name(name: &[u8]) -> bool {
    let n = String::from_utf8_lossy(name).to_ascii_lowercase();
    const WORDS: &[&str] = &[
        "token",
        "credential",
        "secret",
        "oauth",
        "apikey",
        "api_key",
        "api-key",
        "passwd",
        "password",
        "htpasswd",
    ];
    // A word in a source file's name (`token.rs`, `secrets_test.go`) marks code a sibling
    // project's build reads, not a secret: words count in data files only.
    let data_file = match n.rsplit_once('.') {
        None => true,
        Some(("", _)) => true,
        Some((_, ext)) => [
            "txt",
            "json",
            "yaml",
            "yml",
            "toml",
            "ini",
            "conf",
            "cfg",
            "env",
            "properties",
            "xml",
            "key",
            "dat",
            "db",
            "sqlite",
            "cache",
            "tok",
        ]
        .contains(&ext),
    };
    (data_file && WORDS.iter().any(|w| n.contains(w)))
        || n == ".env"
        || (n.starts_with(".env.") && !n.ends_with(".example") && !n.ends_with(".sample"))
        || n.starts_with("auth.json")
        || n.starts_with("auth.toml")
        || n.starts_with("id_rsa")
        || n.starts_with("id_ed25519")
        || n.starts_with("id_ecdsa")
        || n.starts_with("id_dsa")
        || [
            ".pem",
            ".key",
            ".p12",
            ".pfx",
            ".jks",
            ".keystore",
            ".kdbx",
            ".gpg",
            ".asc",
        ]
        .iter()
        .any(|e| n.ends_with(e))
}

/// Directories a home walk never enters: caches and dependency trees (large, and what
/// builds read), and what the list above hides already.
fn skip_dir(name: &[u8]) -> bool {
    matches!(
        name,
        b"node_modules"
            | b".cache"
            | b".cargo"
            | b".rustup"
            | b".npm"
            | b".git"
            | b"target"
            | b".venv"
            | b"venv"
            | b"__pycache__"
            | b".local"
            | b".m2"
            | b".gradle"
            | b"go"
            | b".pyenv"
            | b".nvm"
            | b".mozilla"
            | b"snap"
            | b"Trash"
            | b"flatpak"
            | b"containers"
            | b"Steam"
    )
}

/// How deep and how far the home walk goes (a bounded cost per command).
const WALK_DEPTH: usize = 5;
const WALK_ENTRIES: usize = 20_000;

/// Files of a home whose names look like credentials ([`credential_name`]): other
/// projects' `.env`, tokens and keys lying about, found by a walk bounded in depth and
/// entries that skips caches and dependency trees ([`skip_dir`]) and `project`.
///
/// `.config` and `.local/share` (where XDG tools keep their logins) are walked first, so
/// that a large home does not use up the walk's entries before them; the rest of `.local`
/// (installed programs and libraries) is not walked.
fn home_pattern_paths(home: &Path, project: Option<&Path>) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut seen = 0usize;
    let first = [home.join(".local/share"), home.join(".config")];
    let mut stack: Vec<(PathBuf, usize)> = vec![(home.to_path_buf(), 0)];
    stack.extend(first.iter().map(|d| (d.clone(), 1)));
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > WALK_ENTRIES {
                return found;
            }
            let name = e.file_name();
            let Ok(ft) = e.file_type() else {
                continue;
            };
            let path = e.path();
            if project.is_some_and(|p| path.starts_with(p) || p == path) {
                continue;
            }
            if ft.is_dir() {
                if depth + 1 < WALK_DEPTH
                    && !skip_dir(name.as_bytes())
                    && (depth > 0 || !first.contains(&path))
                {
                    stack.push((path, depth + 1));
                }
            } else if ft.is_file() && credential_name(name.as_bytes()) {
                found.push(path);
            }
        }
    }
    found
}

/// Files outside any home no command of shade's needs and that hold every user's secrets:
/// password hashes and the host's ssh keys (readable to a root command, whose root's view
/// shows root's files as its own).
const SYSTEM_CREDENTIALS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    "/etc/NetworkManager/system-connections",
    "/etc/wireguard",
    "/var/lib/sss",
    // Services' keys and logins root's view still showed (red team round 2): TLS keys of
    // certbot and others, database clients' and servers' logins, cloud-init's instance
    // data (user-data often carries secrets), Docker's daemon key and client logins, the
    // ssh daemon's and PAM's, IPsec's, Postfix's SASL maps.
    "/etc/letsencrypt",
    "/etc/pki/tls/private",
    "/etc/pki/CA/private",
    "/etc/mysql",
    "/etc/postgresql-common/pg_service.conf",
    "/var/lib/cloud",
    "/etc/docker/key.json",
    "/root/.docker",
    "/etc/ipsec.secrets",
    "/etc/ipsec.d/private",
    "/etc/postfix/sasl_passwd",
    "/etc/postfix/sasl_passwd.db",
    "/etc/openvpn",
    "/etc/ppp/chap-secrets",
    "/etc/ppp/pap-secrets",
    "/etc/cups/ssl",
    "/etc/ldap.secret",
    "/etc/pam_ldap.secret",
    "/etc/libvirt/secrets",
    "/var/lib/libvirt/secrets",
    "/etc/rancher",
    "/etc/kubernetes",
    "/var/lib/kubelet/pki",
    "/etc/ceph",
];

/// `/etc/ssh`'s private host keys (`ssh_host_*_key`).
fn ssh_host_keys() -> Vec<PathBuf> {
    std::fs::read_dir("/etc/ssh")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().is_some_and(|n| {
                        let n = n.as_bytes();
                        n.starts_with(b"ssh_host_") && n.ends_with(b"_key")
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Variables naming a credential file or socket outside the usual places.
const CREDENTIAL_VARS: &[&str] = &[
    "SSH_AUTH_SOCK",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AZURE_CONFIG_DIR",
    "CLOUDSDK_CONFIG",
    "PGPASSFILE",
    "NETRC",
    "SHADE_CONFIG",
    "XAUTHORITY",
];

/// Where credential agents keep their sockets, outside any home: ssh-agent's
/// `/tmp/ssh-XXXX/` directories (every user's: as root all are reachable) and, under each
/// `/run/user/UID/`, gpg-agent's, the GNOME keyring's and the ssh agents of the desktop.
/// A command that connects to one signs and decrypts with the user's keys.
fn agent_sockets() -> Vec<PathBuf> {
    let entries = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let mut found: Vec<PathBuf> = entries(Path::new("/tmp"))
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.as_bytes().starts_with(b"ssh-"))
        })
        .collect();
    for user in entries(Path::new("/run/user")) {
        for name in [
            "gnupg",
            "keyring",
            "gcr",
            "openssh_agent",
            "ssh-agent.socket",
            "ssh-agent",
        ] {
            found.push(user.join(name));
        }
    }
    found
}

/// The homes whose credentials are hidden: `$HOME`, the home of our user in the password
/// database, and as root the home of the user who used sudo.
pub fn homes() -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .collect();
    let uid = nix::unistd::geteuid();
    if let Ok(Some(user)) = nix::unistd::User::from_uid(uid) {
        homes.push(user.dir);
    }
    if uid.is_root() {
        let sudo = std::env::var("SUDO_USER").ok();
        if let Some(Ok(Some(user))) = sudo.map(|n| nix::unistd::User::from_name(&n)) {
            homes.push(user.dir);
        }
        // As root every user's home: the command's root could read any of them.
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        homes.extend(
            passwd
                .lines()
                .filter_map(|l| l.split(':').nth(5))
                .filter(|h| h.starts_with("/home/") || h.starts_with("/Users/"))
                .map(PathBuf::from),
        );
    }
    homes.retain(|h| h.is_absolute() && h != Path::new("/"));
    homes.sort();
    homes.dedup();
    homes
}

/// The credential paths of `homes` and of this process's environment that exist,
/// symlinks resolved, outermost only, none that holds `project` (hiding it would hide the
/// project).
pub fn credential_paths(homes: &[PathBuf], project: Option<&Path>) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for home in homes {
        candidates.extend(HOME_CREDENTIALS.iter().map(|rel| home.join(rel)));
        candidates.extend(home_pattern_paths(home, project));
    }
    if nix::unistd::geteuid().is_root() {
        candidates.extend(SYSTEM_CREDENTIALS.iter().map(PathBuf::from));
        candidates.extend(ssh_host_keys());
    }
    candidates.extend(environment_credentials());
    candidates.extend(agent_sockets());
    let mut real: Vec<PathBuf> = candidates
        .into_iter()
        .filter(|p| p.is_absolute())
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p != Path::new("/"))
        .filter(|p| {
            !project.is_some_and(|project| project.starts_with(p) || p.starts_with(project))
        })
        .collect();
    real.sort();
    real.dedup();
    let mut outermost: Vec<PathBuf> = Vec::new();
    for p in real {
        if !outermost.iter().any(|o| p.starts_with(o)) {
            outermost.push(p);
        }
    }
    outermost
}

/// The credential paths this process's environment names: shade's config under
/// `$XDG_CONFIG_HOME`, the files of [`CREDENTIAL_VARS`], `$KUBECONFIG`'s and
/// `$DOCKER_CONFIG`'s.
fn environment_credentials() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(xdg) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        out.push(PathBuf::from(xdg).join("shade"));
    }
    for var in CREDENTIAL_VARS {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            out.push(PathBuf::from(v));
        }
    }
    if let Some(kube) = std::env::var_os("KUBECONFIG") {
        out.extend(std::env::split_paths(&kube));
    }
    if let Some(docker) = std::env::var_os("DOCKER_CONFIG").filter(|v| !v.is_empty()) {
        out.push(PathBuf::from(docker).join("config.json"));
    }
    out
}

/// The credential paths of `homes` and of this process's environment that lie inside
/// `project` (canonical), resolved: the other half of [`credential_paths`], which leaves
/// them out because the sandbox's masks cannot hide inside the branch. A home inside the
/// project is walked for credential-looking files whole ([`home_pattern_paths`]); in a
/// project inside a home only the listed paths count (the walk never enters a project, so
/// the project's own `.env` stays as it is outside). The branch hides what this returns.
pub(crate) fn credential_paths_inside(homes: &[PathBuf], project: &Path) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for home in homes {
        let Ok(real) = std::fs::canonicalize(home) else {
            continue;
        };
        if real.starts_with(project) {
            candidates.extend(HOME_CREDENTIALS.iter().map(|rel| real.join(rel)));
            candidates.extend(home_pattern_paths(&real, None));
        } else if project.starts_with(&real) {
            candidates.extend(HOME_CREDENTIALS.iter().map(|rel| real.join(rel)));
        }
    }
    candidates.extend(environment_credentials());
    // Those that exist, as named and as resolved: a symlinked `~/.ssh` inside the project
    // is hidden by its own name too, or the command could put a directory of its own there.
    let mut real: Vec<PathBuf> = candidates
        .into_iter()
        .filter(|p| p.is_absolute() && std::fs::symlink_metadata(p).is_ok())
        .flat_map(|p| {
            let r = std::fs::canonicalize(&p).ok();
            [Some(p), r]
        })
        .flatten()
        .filter(|p| p.starts_with(project) && p != project)
        .collect();
    real.sort();
    real.dedup();
    let mut outermost: Vec<PathBuf> = Vec::new();
    for p in real {
        if !outermost.iter().any(|o| p.starts_with(o)) {
            outermost.push(p);
        }
    }
    outermost
}

/// The bwrap arguments that hide the credentials of `homes` from a command of `policy`
/// (nothing for [`EnvPolicy::User`] unless the config's `hide_credentials`): each directory
/// under an empty read-only tmpfs, each other file (sockets too) bound to /dev/null. They
/// must come after every other mount of the sandbox, so that no bind shows them again.
///
/// `masked` are left alone: the paths the outside layer hides already (see masks.rs), so
/// that the command may still write there, and those the caller hides itself.
pub fn hide_args(
    policy: EnvPolicy,
    homes: &[PathBuf],
    project: &Path,
    masked: &[PathBuf],
) -> Vec<OsString> {
    if policy == EnvPolicy::User && !config().hide_credentials {
        return Vec::new();
    }
    credential_paths(homes, Some(project))
        .into_iter()
        .filter(|p| !masked.contains(p))
        .flat_map(|p| hide_one(&p))
        .collect()
}

/// The bwrap arguments that hide `path`: a directory under an empty read-only tmpfs, any
/// other file (sockets too) bound to /dev/null; nothing for a path that is gone.
pub(crate) fn hide_one(path: &Path) -> Vec<OsString> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    if meta.is_dir() {
        vec![
            "--perms".into(),
            "0500".into(),
            "--tmpfs".into(),
            path.into(),
            "--remount-ro".into(),
            path.into(),
        ]
    } else {
        vec!["--ro-bind".into(), "/dev/null".into(), path.into()]
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn secret(name: &str) -> bool {
        is_secret(OsStr::new(name), OsStr::new("x"))
    }

    #[test]
    fn secret_names_by_word_suffix_and_prefix() {
        for name in [
            "GITHUB_TOKEN",
            "GH_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "MY_API_KEY",
            "MY_APIKEY",
            "stripe_secret",
            "DB_PASS",
            "PGPASSWORD",
            "MYSQL_PWD_PASSWD",
            "npm_config__authToken",
            "DOCKER_AUTH_CONFIG",
            "SSH_AUTH_SOCK",
            "GPG_AGENT_INFO",
            "SHADE_MCP_TOKEN",
            "SHADE_STATE_DIR",
            "OPENAI_BASE_URL",
            "ANTHROPIC_API_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "AZURE_CLIENT_ID",
            "CI_JOB_TOKEN",
            "SESSION_COOKIE",
            "GIT_ASKPASS",
            "PRIVATE_REGISTRY",
        ] {
            assert!(secret(name), "{name} should be filtered");
        }
        for name in [
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "TERM",
            "USER",
            "SHELL",
            "TMPDIR",
            "CARGO_HOME",
            "RUSTUP_HOME",
            "VIRTUAL_ENV",
            "RUST_BACKTRACE",
            "KEYRING_BACKEND",
            "TOKENIZERS_PARALLELISM",
            "PKG_CONFIG_PATH",
            "CC",
        ] {
            assert!(!secret(name), "{name} should be kept");
        }
    }

    #[test]
    fn agents_get_only_allowed_names() {
        let vars = [
            ("PATH", "/bin"),
            ("LC_ALL", "C"),
            ("CARGO_TARGET_DIR", "/t"),
            ("RUSTFLAGS", "-g"),
            ("NODE_OPTIONS", "--x"),
            ("GITHUB_PAT", "ghp_x"),
            ("CI_JOB_JWT", "j"),
            ("MYSQL_PWD", "p"),
            (
                "SLACK_WEBHOOK_URL",
                "https://hooks.slack.com/services/T/B/x",
            ),
            ("BEARER", "b"),
            ("CODECOV_UPLOAD", "c"),
            ("CARGO_REGISTRY_TOKEN", "t"),
            ("HTTPS_PROXY", "http://u:pw@proxy:3128"),
            ("SOMETHING_ELSE", "v"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let kept: Vec<String> = filter(EnvPolicy::Agent, vars.clone(), &[])
            .into_iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            kept,
            [
                "PATH",
                "LC_ALL",
                "CARGO_TARGET_DIR",
                "RUSTFLAGS",
                "NODE_OPTIONS"
            ]
        );
        let passed = filter(EnvPolicy::Agent, vars, &["SOMETHING_ELSE".into()]);
        assert!(passed.iter().any(|(k, _)| k == "SOMETHING_ELSE"));
    }

    #[test]
    fn home_patterns_find_tokens_and_env_files() {
        let home = tempfile::tempdir().unwrap();
        let h = std::fs::canonicalize(home.path()).unwrap();
        for f in [
            "code/other/.env",
            "code/other/.env.example",
            "notes/gh-token.txt",
            ".config/tool/oauth_creds.json",
            "node_modules/x/token.js",
            "project/.env",
            "code/other/src/main.rs",
            "code/lexer/src/token.rs",
        ] {
            std::fs::create_dir_all(h.join(f).parent().unwrap()).unwrap();
            std::fs::write(h.join(f), "x").unwrap();
        }
        let mut found = home_pattern_paths(&h, Some(&h.join("project")));
        found.sort();
        let rel: Vec<String> = found
            .iter()
            .map(|p| p.strip_prefix(&h).unwrap().display().to_string())
            .collect();
        assert_eq!(
            rel,
            [
                ".config/tool/oauth_creds.json",
                "code/other/.env",
                "notes/gh-token.txt"
            ]
        );
    }

    #[test]
    fn go_settings_by_name_not_by_prefix() {
        assert!(allowed(OsStr::new("GOPATH")));
        assert!(!allowed(OsStr::new("GOOGLE_APPLICATION_CREDENTIALS")));
        assert!(!allowed(OsStr::new("GONE_WITH_THE_WIND")));
    }

    #[test]
    fn urls_with_passwords_are_secret() {
        let v = |s: &str| is_secret(OsStr::new("SOME_URL"), OsStr::new(s));
        assert!(v("postgres://me:hunter2@db.example/x"));
        assert!(v("http://user:pw@proxy:3128"));
        assert!(!v("https://example.com/a@b"));
        assert!(v("https://me@example.com/"), "a token as the URL's user");
        assert!(!v("ssh://git@github.com/o/r.git"));
        assert!(!v("/usr/bin:/bin"));
        // Credentials under allowed names (red team round 2).
        assert!(v("-Djavax.net.ssl.trustStorePassword=changeit"));
        assert!(v("access-tokens = github.com=ghp_x"));
        assert!(v("https://conda.example/t/tok-123/channel"));
        assert!(!v("-Xmx2g -Dfile.encoding=UTF-8"));
    }

    #[test]
    fn filter_keeps_users_and_passes_chosen() {
        let vars = || {
            [
                ("PATH", "/bin"),
                ("GITHUB_TOKEN", "t"),
                ("NPM_CONFIG_TOKEN", "n"),
            ]
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        };
        let names = |v: Vec<(OsString, OsString)>| {
            v.into_iter()
                .map(|(k, _)| k.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(filter(EnvPolicy::Agent, vars(), &[])), ["PATH"]);
        assert_eq!(
            names(filter(EnvPolicy::Agent, vars(), &["GITHUB_TOKEN".into()])),
            ["PATH", "GITHUB_TOKEN"]
        );
        assert_eq!(
            names(filter(EnvPolicy::Agent, vars(), &["NPM_*".into()])),
            ["PATH", "NPM_CONFIG_TOKEN"]
        );
        assert_eq!(names(filter(EnvPolicy::User, vars(), &[])).len(), 3);
    }

    #[test]
    fn credential_paths_exist_resolve_and_nest() {
        let home = tempfile::tempdir().unwrap();
        let h = std::fs::canonicalize(home.path()).unwrap();
        std::fs::create_dir_all(h.join(".ssh")).unwrap();
        std::fs::write(h.join(".ssh/id_x"), "k").unwrap();
        std::fs::write(h.join(".netrc"), "n").unwrap();
        std::fs::create_dir_all(h.join("real-aws")).unwrap();
        std::os::unix::fs::symlink(h.join("real-aws"), h.join(".aws")).unwrap();
        let homes = vec![h.clone()];
        let paths = credential_paths(&homes, None);
        assert!(paths.contains(&h.join(".ssh")));
        assert!(paths.contains(&h.join(".netrc")));
        assert!(paths.contains(&h.join("real-aws")));
        assert!(!paths.contains(&h.join(".ssh/id_x")));
        assert!(!paths.contains(&h.join(".pgpass")));
        // Every ssh-agent directory in /tmp, whoever's.
        let agent = tempfile::Builder::new()
            .prefix("ssh-shadetest")
            .tempdir_in("/tmp")
            .unwrap();
        let agent_dir = std::fs::canonicalize(agent.path()).unwrap();
        assert!(credential_paths(&[], None).contains(&agent_dir));
        // A project inside a credential directory keeps it visible.
        let inside = credential_paths(&homes, Some(&h.join(".ssh/project")));
        assert!(!inside.contains(&h.join(".ssh")));
        let args = hide_args(EnvPolicy::Agent, &homes, Path::new("/nonexistent"), &[]);
        let text: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let ssh = h.join(".ssh").display().to_string();
        let netrc = h.join(".netrc").display().to_string();
        assert!(text.windows(2).any(|w| w == ["--tmpfs", ssh.as_str()]));
        assert!(text.windows(2).any(|w| w == ["--remount-ro", ssh.as_str()]));
        assert!(text
            .windows(3)
            .any(|w| w == ["--ro-bind", "/dev/null", netrc.as_str()]));
    }
}

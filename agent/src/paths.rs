//! Where shade keeps the user's own files (the global memory and instructions, the config
//! file): a path helper, not a config loader.

use std::path::PathBuf;

/// shade's directory under the XDG config dir (also home of the global memory file).
pub fn config_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("shade"))
}

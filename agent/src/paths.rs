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

/// Config files this process read besides the one in [`config_dir`] (`--config FILE`,
/// `$SHADE_CONFIG`): a live session holds an edit of them for the user as it holds
/// [`config_dir`]'s (they set the sandbox of later sessions).
static READ: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Record a config file read (see [`config_files`]).
pub fn note_config_file(path: &std::path::Path) {
    let mut read = READ.lock().unwrap_or_else(|e| e.into_inner());
    if !read.iter().any(|p| p == path) {
        read.push(path.to_path_buf());
    }
}

/// shade's own config files and directories: [`config_dir`], `$SHADE_CONFIG`, and every
/// file [`note_config_file`] recorded.
pub fn config_files() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = config_dir().into_iter().collect();
    out.extend(
        std::env::var_os("SHADE_CONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
    );
    out.extend(
        READ.lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned(),
    );
    out
}

//! The suggestion and speculation switches of the config file, with their defaults (all on:
//! the cost is one cheap, mostly cached, fast-model request per answer, shown in `/stats`).

use crate::llm::config::{load_file_config, FileConfig};
use crate::llm::{LlmError, Overrides};

/// Which parts of the follow-up machinery are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowupSettings {
    /// `enable_followup_suggestions`: suggest the next input after an answer.
    pub suggestions: bool,
    /// `enable_cache_sharing`: fork the cached prefix instead of a standalone request.
    pub cache_sharing: bool,
    /// `enable_speculation`: run a shown suggestion ahead in a branch.
    pub speculation: bool,
    /// `telemetry`: append outcomes to the state dir's `telemetry.jsonl`.
    pub telemetry: bool,
}

impl Default for FollowupSettings {
    fn default() -> Self {
        Self {
            suggestions: true,
            cache_sharing: true,
            speculation: true,
            telemetry: true,
        }
    }
}

impl FollowupSettings {
    /// The defaults overridden by what the file sets.
    pub fn from_file(file: &FileConfig) -> Self {
        let d = Self::default();
        Self {
            suggestions: file.enable_followup_suggestions.unwrap_or(d.suggestions),
            cache_sharing: file.enable_cache_sharing.unwrap_or(d.cache_sharing),
            speculation: file.enable_speculation.unwrap_or(d.speculation),
            telemetry: file.telemetry.unwrap_or(d.telemetry),
        }
    }

    /// Read the config file the same way [`crate::llm::LlmConfig::load`] does (`--config`,
    /// `$SHADE_CONFIG`, the XDG default).
    pub fn load(overrides: &Overrides) -> Result<Self, LlmError> {
        Ok(Self::from_file(&load_file_config(overrides)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_on_and_file_overrides() {
        let empty: FileConfig = toml::from_str("").expect("toml");
        assert_eq!(
            FollowupSettings::from_file(&empty),
            FollowupSettings::default()
        );
        let file: FileConfig = toml::from_str(
            "enable_followup_suggestions = false\nenable_cache_sharing = false\nenable_speculation = false\ntelemetry = false\nfast_model = \"small\"",
        )
        .expect("toml");
        let s = FollowupSettings::from_file(&file);
        assert_eq!(
            s,
            FollowupSettings {
                suggestions: false,
                cache_sharing: false,
                speculation: false,
                telemetry: false
            }
        );
        assert!(toml::from_str::<FileConfig>("enable_suggestions = true").is_err());
    }

    #[test]
    fn load_reads_the_named_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "telemetry = false\n").expect("write");
        let s = FollowupSettings::load(&Overrides {
            config_file: Some(path),
            ..Overrides::default()
        })
        .expect("load");
        assert!(!s.telemetry && s.suggestions);
        let missing = FollowupSettings::load(&Overrides {
            config_file: Some(dir.path().join("nope.toml")),
            ..Overrides::default()
        });
        assert!(missing.is_err());
    }
}

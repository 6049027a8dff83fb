//! The suggestion and speculation switches of the config file, with their defaults (all on:
//! the cost is one cheap, mostly cached, fast-model request per answer, shown in `/stats`).
//! The CLI reads them from the file and hands them down.

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

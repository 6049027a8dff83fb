//! Prompt suggestions (issue 9, the seed's "NES"): after an answer, the user's likely next
//! input is asked of the fast model and shown as ghost text that one key accepts.
//!
//! - [`guards`]: whether to ask at all; [`generate`]: the request (a cache-sharing fork of the
//!   conversation's [`cache`]d prefix, or standalone) and its [`filter`] ([`prompt`] holds the
//!   words);
//! - [`controller`]: the ghost text's state machine (delay, accept keys, debounce, hooks for
//!   the speculation engine); [`telemetry`]: one JSON line per outcome in the state dir;
//! - [`settings`]: the config-file switches.

pub mod cache;
pub mod controller;
pub mod filter;
pub mod generate;
pub mod guards;
pub mod prompt;
pub mod settings;
pub mod telemetry;

pub use cache::{new_session_id, CacheSafeParams, SessionPrefix, MAX_HISTORY_FOR_CACHE};
pub use controller::{
    AcceptMethod, FollowupController, FollowupHooks, ACCEPT_DEBOUNCE_MS, SUGGESTION_DELAY_MS,
};
pub use filter::filter_reason;
pub use generate::{generate_pipelined, generate_suggestion, SuggestionOutcome, SuggestionSource};
pub use guards::{count_model_turns, SuggestionGuards};
pub use prompt::{pipelined_prompt, SUGGESTION_PROMPT};
pub use settings::FollowupSettings;
pub use telemetry::{
    PromptSuggestionEvent, SpeculationEvent, SpeculationEventOutcome, SuggestionEventOutcome,
    Telemetry,
};

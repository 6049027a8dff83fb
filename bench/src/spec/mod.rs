//! Speculation benchmark: session scripts, cassette sessions, the turn engine, strategies,
//! measurements and reports.

pub mod cassettes;
pub mod check;
pub mod curve;
pub mod engine;
pub mod live;
pub mod meter;
pub mod peer;
pub mod project;
pub mod render;
pub mod report;
pub mod script;
pub mod spread;

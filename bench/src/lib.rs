//! The speculation benchmark's engine, shared by its two binaries: `spec-record` (a hand-written
//! session script → cassettes as `shade chat --record` writes them) and `speculation` (the
//! cassettes replayed, strategies side by side). The file-system benchmarks live in the
//! `shade-bench` binary (src/main.rs) and do not use this library.

pub mod spec;

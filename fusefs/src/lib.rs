//! shade-fusefs: a FUSE shadow of a project directory.
//!
//! A [`Branch`] shows the project ("lower") read-through and keeps every write in its own
//! override layer. [`Branch::changeset`] says what the branch changed, [`Branch::accept`]
//! applies it to the real directory (all or nothing, conflict-checked, journaled),
//! dropping the branch aborts it.

pub mod accept;
pub mod fingerprint;
pub mod plan;
pub mod state;

pub use fingerprint::{Base, Fingerprint};
pub use plan::{Perms, PlanOp, RelPath};
pub use state::StateDir;

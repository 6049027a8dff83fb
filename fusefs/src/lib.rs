//! shade-fusefs: a FUSE shadow of a project directory.
//!
//! A [`Branch`] shows the project ("lower") read-through and keeps every write in its own
//! override layer. [`Branch::changeset`] says what the branch changed, [`Branch::accept`]
//! applies it to the real directory (all or nothing, conflict-checked, journaled),
//! dropping the branch aborts it.

pub mod accept;
mod attach;
mod branch;
pub mod budget;
mod changeset;
mod content;
pub mod fingerprint;
mod fs;
mod fusermount;
pub mod idmap;
mod ignore_rules;
mod lower;
mod mntns;
mod node;
pub mod outside;
mod overlay;
mod passthrough;
pub mod plan;
mod pool;
mod priority;
mod privs;
pub mod quote;
mod reads;
mod reset;
pub mod rootdir;
pub mod sandbox;
mod select;
pub mod served;
pub mod state;
pub mod timing;
mod tree;
pub mod undo;
pub mod units;
mod warm;
mod watch;

pub use accept::{AcceptError, AcceptOptions, AcceptReport, Conflict, DeferSignals, NotApplied};
pub use branch::{
    cleanup_stale, live_mount_count, unmount_all_before_exit, AcceptFlags, Branch, BranchError,
    BranchOptions,
};
pub use budget::{BranchLimits, LimitHit};
pub use changeset::{lossy_path, non_utf8_bytes, Change, ChangeKind, Changeset, Owner};
pub use fingerprint::{Base, Fingerprint};
pub use idmap::IdShift;
pub use plan::{Perms, PlanOp, ReadBase, RelPath};
/// The pool of warm connections for new branches (issue 31, `pool.rs`).
pub use pool::{
    commands_left_it_reusable, drain as drain_branch_pool, pool_size, pooled_count, set_pool_idle,
    set_pool_size, POOLED_MARK,
};
pub use select::Selection;
pub use state::StateDir;

//! The per-project branch server (issue 31): one process per (project, state directory,
//! user, shade build) that owns the project's branches and keeps their FUSE connections
//! warm between the branches its clients ask for (the pool, `fusefs/src/pool.rs`). Each
//! `shade run` or `shade exec` is a new process, so an in-process pool never helps its
//! first branch; the server outlives them. Its clients (`shade run`, the agent's shadows)
//! use the client side in `shade_fusefs::served`, which starts this binary's hidden
//! subcommand on first use. The server exits when it has had no client for
//! `SHADE_BRANCH_SERVER_IDLE` seconds (60), emptying its pool. See `fusefs/DESIGN-warm.md`.

mod server;

pub use server::{main as server_main, ServerArgs};
pub use shade_fusefs::served::{cleanup_stale, RunBranch};

//! `shade recover`: finish accepts interrupted by a crash (from their journals) and
//! clean up branches and mounts left by dead shade processes. Every shade start does the
//! same; this command does only that.

use clap::Args;
use shade_fusefs::quote::quote_path;
use shade_fusefs::StateDir;

#[derive(Args)]
pub struct RecoverArgs {
    /// Drop the journal of accept ID without finishing it (for an accept that cannot be
    /// finished; its scratch directory, if any, stays in the project).
    #[arg(long, value_name = "ID")]
    pub drop: Option<String>,
}

pub fn main(args: RecoverArgs) -> i32 {
    let state = StateDir::from_env();
    if let Some(id) = &args.drop {
        return match shade_fusefs::accept::drop_journal(&state, id) {
            Ok(root) => {
                println!(
                    "dropped the journal of accept {id} (into {}) without finishing it",
                    root.display()
                );
                0
            }
            Err(e) => {
                eprintln!("shade: {e}");
                crate::exit::SHADE_ERROR
            }
        };
    }
    match shade_fusefs::accept::recover(&state) {
        Ok(r) => {
            for p in &r.rolled_forward {
                println!("finished interrupted accept in {}", quote_path(p));
            }
            for (p, a) in &r.not_applied {
                println!("  left out (changed since) in {}: {a}", p.display());
            }
            for p in &r.project_gone {
                println!(
                    "dropped the journal of an interrupted accept into {}, which no longer exists",
                    p.display()
                );
            }
            for p in &r.dropped {
                println!(
                    "dropped the journal of an accept into the dead branch {}",
                    quote_path(p)
                );
            }
            for p in &r.rolled_back {
                println!("rolled back interrupted accept in {}", quote_path(p));
            }
        }
        Err(e) => {
            eprintln!(
                "shade: recovering accept journals in {}: {e} (once the cause is fixed, \
                 `shade recover` finishes it; `shade recover --drop ID` gives up on it)",
                state.journals().display()
            );
            return crate::exit::SHADE_ERROR;
        }
    }
    for id in shade_fusefs::cleanup_stale(&state) {
        println!("removed stale branch {id}");
    }
    let n = crate::branch_server::cleanup_stale(state.root());
    if n > 0 {
        println!("removed {n} sockets of killed branch servers");
    }
    0
}

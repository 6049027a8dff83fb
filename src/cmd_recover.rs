//! `shade recover`: finish accepts interrupted by a crash (from their journals) and
//! clean up branches and mounts left by dead shade processes. Every shade start does the
//! same; this command does only that.

use clap::Args;
use shade_fusefs::quote::quote_path;
use shade_fusefs::StateDir;

#[derive(Args)]
pub struct RecoverArgs {}

pub fn main(_args: RecoverArgs) -> i32 {
    let state = StateDir::from_env();
    match shade_fusefs::accept::recover(&state) {
        Ok(r) => {
            for p in &r.rolled_forward {
                println!("finished interrupted accept in {}", quote_path(p));
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
                "shade: recovering accept journals in {}: {e}",
                state.journals().display()
            );
            return crate::exit::SHADE_ERROR;
        }
    }
    for id in shade_fusefs::cleanup_stale(&state) {
        println!("removed stale branch {id}");
    }
    0
}

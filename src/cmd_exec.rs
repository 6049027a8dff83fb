//! `shade exec`: one-shot agent run (being implemented).

use clap::Args;

#[derive(Args)]
pub struct ExecArgs {
    /// The prompt.
    pub prompt: String,
}

pub fn main(_args: ExecArgs) -> i32 {
    eprintln!("shade exec: not implemented yet");
    crate::exit::SHADE_ERROR
}

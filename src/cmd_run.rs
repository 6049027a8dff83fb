//! `shade run` (being implemented).

use clap::Args;

#[derive(Args)]
pub struct RunArgs {}

pub fn main(_args: RunArgs) -> i32 {
    0
}

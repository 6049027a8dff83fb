//! `shade recover` (being implemented).

use clap::Args;

#[derive(Args)]
pub struct RecoverArgs {}

pub fn main(_args: RecoverArgs) -> i32 {
    0
}

//! Mount a branch of a directory and keep it until stdin closes, then print what changed.
//! `cargo run -p shade-fusefs --example mount -- DIR` (for poking at the overlay by hand).

use shade_fusefs::{Branch, BranchOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: mount DIR")?;
    let opts = BranchOptions {
        allow_other: std::env::var_os("ALLOW_OTHER").is_some(),
        ..Default::default()
    };
    let branch = Branch::create(std::path::Path::new(&dir), &opts)?;
    println!("{}", branch.mountpoint().display());
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line)? > 0 {
        line.clear();
    }
    let cs = branch.changeset(false);
    for c in &cs.changes {
        eprintln!("{c}");
    }
    eprint!("{}", branch.diff(&cs));
    Ok(())
}

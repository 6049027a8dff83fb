//! Mount a branch of a directory and keep it until stdin closes, then print what changed.
//! `cargo run -p shade-fusefs --example mount -- DIR` (for poking at the overlay by hand;
//! `SHADE_WARM_UP=1` warms the branch first; `SHADE_ID_SHIFT=B` shows ids shifted by `B`
//! for commands in a user namespace mapped to `B..`, see the `nsroot` example).

use shade_fusefs::{Branch, BranchOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: mount DIR")?;
    let opts = BranchOptions {
        allow_other: std::env::var_os("ALLOW_OTHER").is_some(),
        id_shift: std::env::var("SHADE_ID_SHIFT")
            .ok()
            .and_then(|b| b.parse().ok())
            .map(|base| shade_fusefs::IdShift { base }),
        ..Default::default()
    };
    let branch = Branch::create(std::path::Path::new(&dir), &opts)?;
    // SHADE_WARM_UP=1: print the mount point only once `Branch::warm_up` has finished.
    if std::env::var_os("SHADE_WARM_UP").is_some_and(|v| v == "1") {
        branch.warm_up()?;
        while !branch.warmed() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
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

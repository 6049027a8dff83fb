//! Branches of one directory made one after another by one process, for measuring the pool
//! of warm connections (issue 31; `bench/fresh-pooled.sh`). Each stdin line drops the branch
//! made before (after writing one file in it, so every reset has something to undo) and
//! makes a new one: `pooled` from the pool, `fresh` with pooling off (a new mount). Prints
//! `MOUNTPOINT CREATE_MICROSECONDS REUSED DROP_MICROSECONDS` per line (the drop of the
//! branch of that kind made before: an unmount, or a reset into the pool). `cargo build --release -p shade-fusefs
//! --example pooled`; run as root.

use shade_fusefs::{Branch, BranchOptions};
use std::io::{BufRead, Write};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: pooled DIR")?;
    let dir = std::path::Path::new(&dir);
    let opts = BranchOptions::default();
    // The last branch of each kind: a pooled one's connection serves the next pooled one,
    // and lives on while fresh ones come and go.
    let mut last: [Option<Branch>; 2] = [None, None];
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line?;
        let pooled = match line.trim() {
            "pooled" => true,
            "fresh" => false,
            other => return Err(format!("unknown command {other:?}").into()),
        };
        shade_fusefs::set_pool_size(usize::from(pooled));
        let mut drop_us = 0;
        if let Some(b) = last[usize::from(pooled)].take() {
            std::fs::write(b.mountpoint().join(".pooled-bench-scratch"), "x\n")?;
            let t0 = Instant::now();
            drop(b);
            drop_us = t0.elapsed().as_micros();
        }
        let t0 = Instant::now();
        let b = Branch::create(dir, &opts)?;
        let us = t0.elapsed().as_micros();
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{} {us} {} {drop_us}",
            b.mountpoint().display(),
            u8::from(b.reused_connection())
        )?;
        out.flush()?;
        last[usize::from(pooled)] = Some(b);
    }
    shade_fusefs::set_pool_size(0);
    drop(last);
    shade_fusefs::drain_branch_pool();
    Ok(())
}

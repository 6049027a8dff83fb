//! Counts lines of its input with memchr; has one warning on purpose (`verbose`).

mod stats;

fn main() {
    let verbose = std::env::args().any(|a| a == "-v");
    let mut input = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut input);
    let lines = stats::count_lines(&input);
    println!("{lines} lines, longest {}", stats::longest_line(&input));
}

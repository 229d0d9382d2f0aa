//! The `podq` command.

fn main() {
    println!("podq {}", env!("CARGO_PKG_VERSION"));
}

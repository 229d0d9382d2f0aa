//! Why an item that sleeps or does I/O wraps the wait in `podq::blocking`: eight items
//! sleeping 100 ms each, without and with it, timed in alternating rounds.
//!
//! ```text
//! cargo run --release -p podq --example blocking
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use podq::Workqueue;

/// Times eight sleeping items with and without `podq::blocking`.
#[derive(Parser)]
#[command(
    name = "blocking",
    after_help = "Examples:\n  blocking\n  blocking --items 16 --rounds 4"
)]
struct Options {
    /// Items per run, each sleeping `--sleep-ms`.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    items: u64,
    /// How long each item sleeps, milliseconds.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    sleep_ms: u64,
    /// Runs of each kind, alternating.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    let wq = Workqueue::builder("blocking-demo").build()?;
    let nap = Duration::from_millis(options.sleep_ms);
    println!(
        "{} items sleeping {} ms on {} usable CPU(s)",
        options.items,
        options.sleep_ms,
        wq.topology().usable().len()
    );
    for _ in 0..options.rounds {
        for wrapped in [false, true] {
            let start = Instant::now();
            let handles: Vec<_> = (0..options.items)
                .map(|_| {
                    wq.spawn(move || {
                        if wrapped {
                            podq::blocking(|| std::thread::sleep(nap));
                        } else {
                            std::thread::sleep(nap);
                        }
                    })
                })
                .collect();
            for handle in handles {
                handle.join()?;
            }
            println!(
                "  {:<28} {:>8.1} ms",
                if wrapped {
                    "with podq::blocking"
                } else {
                    "without"
                },
                start.elapsed().as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}

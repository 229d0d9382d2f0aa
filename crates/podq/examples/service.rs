//! A long-running service that exposes its workqueues to `podq ctl` and `podq monitor`:
//! `ingest` takes requests on the pod of the CPU they arrive on, `persist` batches them
//! with at most `--max-active` writes at a time (each write waits inside
//! `podq::blocking`, as I/O must), and a `DelayedWork` prints a status line every
//! second. Change the queues while it runs:
//!
//! ```text
//! cargo run --release -p podq --example service -- --seconds 120 &
//! podq ctl --pid <pid> list
//! podq ctl --pid <pid> set persist max_active 1
//! podq ctl --pid <pid> set ingest affinity_scope system
//! podq monitor --pid <pid>
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use podq::{control, DelayedWork, Scope, Work, Workqueue};

/// A service whose workqueues are visible to and tunable by `podq ctl`.
#[derive(Parser)]
#[command(
    name = "service",
    after_help = "Examples:\n  service --seconds 120 &\n  podq ctl --pid <pid> set persist max_active 1\n  podq monitor --pid <pid> persist"
)]
struct Options {
    /// Run for this many seconds [default: until killed].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    seconds: Option<u64>,
    /// Requests per second.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    rate: u64,
    /// Writes `persist` runs at once (a workqueue attribute, changeable live).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=2048))]
    max_active: u64,
}

#[derive(Default)]
struct Counters {
    ingested: AtomicU64,
    written: AtomicU64,
}

/// Prints a line; a reader that went away does not stop the service.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    let ingest = Workqueue::builder("ingest").scope(Scope::Cpu).build()?;
    let persist = Workqueue::builder("persist")
        .max_active(options.max_active as usize)
        .build()?;
    ingest.expose()?;
    persist.expose()?;
    // The guard keeps the server running; dropping it stops the server.
    let server = control::start()?;
    say(&format!(
        "service: pid {} socket {}",
        std::process::id(),
        server.path().display()
    ));

    let counters = Arc::new(Counters::default());
    let batch: Arc<Mutex<Vec<u64>>> = Arc::default();
    // One Work drains the batch: queued while pending, it coalesces, so a burst of
    // requests becomes one write.
    let write = {
        let (batch, counters) = (Arc::clone(&batch), Arc::clone(&counters));
        Work::new(move || {
            let taken = std::mem::take(&mut *batch.lock().unwrap_or_else(|e| e.into_inner()));
            // Stands for a disk write: the worker waits, so other items may run.
            podq::blocking(|| thread::sleep(Duration::from_millis(2)));
            counters
                .written
                .fetch_add(taken.len() as u64, Ordering::Relaxed);
        })
    };
    // The status line re-arms itself: a DelayedWork is no longer pending once it has
    // started, so queueing it from its own run is accepted.
    let status_cell: Arc<OnceLock<DelayedWork>> = Arc::default();
    let status = {
        let (counters, ingest, persist) = (Arc::clone(&counters), ingest.clone(), persist.clone());
        let cell = Arc::clone(&status_cell);
        let started = Instant::now();
        DelayedWork::new(move || {
            say(&format!(
                "service: {:6.1} s  ingested {}  written {}  ingest scope {}  persist max_active {}",
                started.elapsed().as_secs_f64(),
                counters.ingested.load(Ordering::Relaxed),
                counters.written.load(Ordering::Relaxed),
                ingest.effective_scope(),
                persist.attrs().max_active,
            ));
            if let Some(me) = cell.get() {
                persist.queue_delayed(me, Duration::from_secs(1));
            }
        })
    };
    let _ = status_cell.set(status.clone());
    persist.queue_delayed(&status, Duration::from_secs(1));

    let period = Duration::from_secs_f64(1.0 / options.rate as f64);
    let deadline = options
        .seconds
        .map(|s| Instant::now() + Duration::from_secs(s));
    let mut next = Instant::now();
    let mut id = 0u64;
    while deadline.map_or(true, |d| Instant::now() < d) {
        id += 1;
        let (batch, counters, persist, write) = (
            Arc::clone(&batch),
            Arc::clone(&counters),
            persist.clone(),
            write.clone(),
        );
        drop(ingest.spawn(move || {
            batch.lock().unwrap_or_else(|e| e.into_inner()).push(id);
            counters.ingested.fetch_add(1, Ordering::Relaxed);
            persist.queue(&write);
        }));
        next += period;
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    status.cancel_sync();
    ingest.flush();
    // A request may have joined the batch after the last write started.
    persist.queue(&write);
    persist.flush();
    say(&format!(
        "service: ingested {}, written {}",
        counters.ingested.load(Ordering::Relaxed),
        counters.written.load(Ordering::Relaxed)
    ));
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("service: {e}");
            ExitCode::FAILURE
        }
    }
}

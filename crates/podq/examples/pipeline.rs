//! A completion-handler pipeline: each request goes through `parse` → `compute` →
//! `reply`, one workqueue per stage. A stage's item queues the next stage from the CPU
//! it ran on, so with a narrow scope a request stays in one pod from end to end; the
//! last stage calls the request's completion handler, which the submitter waits on.
//!
//! ```text
//! cargo run --release -p podq --example pipeline -- --requests 100000 --scope cpu
//! ```
//!
//! At the end it prints the throughput and, per stage, how many items ran where they
//! were queued, and exits 1 unless every request completed.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use clap::Parser;
use podq::{Scope, Workqueue};

/// Requests through three chained workqueues, each completion reported to a handler.
#[derive(Parser)]
#[command(
    name = "pipeline",
    after_help = "Examples:\n  pipeline --requests 100000 --scope cpu\n  pipeline --scope system --in-flight 64"
)]
struct Options {
    /// Requests to run.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    requests: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    in_flight: u64,
    /// Affinity scope of the three stages: cpu, smt, cache, cache_shard, numa, system
    /// or default.
    #[arg(long, default_value = "default")]
    scope: Scope,
}

/// Called once when a request has gone through every stage.
type Completion = Box<dyn FnOnce(u64) + Send>;

/// The three stages; cloning shares them.
#[derive(Clone)]
struct Pipeline {
    parse: Workqueue,
    compute: Workqueue,
    reply: Workqueue,
}

impl Pipeline {
    fn new(scope: Scope) -> Result<Pipeline, podq::Error> {
        let stage = |name: &str| Workqueue::builder(name).scope(scope).build();
        Ok(Pipeline {
            parse: stage("parse")?,
            compute: stage("compute")?,
            reply: stage("reply")?,
        })
    }

    /// Submits request `id`; `done` gets its result on a `reply` worker.
    fn submit(&self, id: u64, done: Completion) {
        let next = self.clone();
        // The handles are dropped: a detached item still runs, and each stage hands
        // its result on by queueing the next one.
        drop(self.parse.spawn(move || {
            let words = id.to_le_bytes();
            let after = next.clone();
            drop(next.compute.spawn(move || {
                let digest = words.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
                    (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
                });
                drop(after.reply.spawn(move || done(digest)));
            }));
        }));
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let options = Options::parse();
    let pipeline = Pipeline::new(options.scope)?;
    let completed = Arc::new(AtomicU64::new(0));
    // Each completion hands a slot back, so at most `in_flight` requests are queued.
    let (slots_back, slots) = mpsc::channel::<u64>();
    let start = Instant::now();
    let mut in_flight = 0;
    for id in 0..options.requests {
        if in_flight == options.in_flight {
            slots.recv()?;
            in_flight -= 1;
        }
        let (completed, slots_back) = (Arc::clone(&completed), slots_back.clone());
        pipeline.submit(
            id,
            Box::new(move |digest| {
                std::hint::black_box(digest);
                completed.fetch_add(1, Ordering::Relaxed);
                let _ = slots_back.send(id);
            }),
        );
        in_flight += 1;
    }
    for _ in 0..in_flight {
        slots.recv()?;
    }
    let elapsed = start.elapsed();
    let done = completed.load(Ordering::Relaxed);
    println!(
        "pipeline: {done} of {} requests in {:.3} s ({:.0} requests/s), scope {}",
        options.requests,
        elapsed.as_secs_f64(),
        done as f64 / elapsed.as_secs_f64(),
        pipeline.parse.effective_scope()
    );
    for stage in [&pipeline.parse, &pipeline.compute, &pipeline.reply] {
        // The last handler signals before its item is counted complete: flush first.
        stage.flush();
        let stats = stage.stats();
        let ran: u64 = stats.pools.iter().map(|p| p.totals.started).sum();
        let same_cpu: u64 = stats.pools.iter().map(|p| p.locality.same_cpu).sum();
        println!(
            "  {:8} {:>8} items on {} pool(s), {:5.1}% on the queueing CPU",
            stats.name,
            stats.totals.completed,
            stats.pools.len(),
            if ran == 0 {
                0.0
            } else {
                same_cpu as f64 * 100.0 / ran as f64
            }
        );
    }
    Ok(done == options.requests)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("pipeline: not every request completed");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}

//! A miniature of the NFS client's completion path, with the control server on.
//!
//! Each producer thread stands for a completion queue (CQ) pinned to a CPU. Every
//! completion queues an item on `rpciod` (the RPC reply), which checksums 4 KiB and
//! queues the follow-on item on `nfsiod` (the NFS completion), from the CPU it ran on —
//! so where `rpciod` runs decides which `nfsiod` pod gets the work. Both queues are
//! visible: change their scopes with `podq ctl` and watch with `podq monitor` while it
//! runs.
//!
//! ```text
//! cargo run --release -p podq --example nfs_chain -- --seconds 60 --topology 2s4c2t
//! podq monitor --pid <pid>
//! podq ctl --pid <pid> set rpciod affinity_scope cpu
//! ```
//!
//! `--help` lists the options. The first line printed is
//! `nfs_chain: pid <pid> socket <path>`; at the end it checks that every completion ran
//! once on each queue and exits 1 if not.

use std::hint::black_box;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use podq::{control, Topology, Workqueue};

/// A miniature of the NFS client's completion path (CQ producers -> rpciod -> nfsiod),
/// with the control server on so that `podq ctl` and `podq monitor` can reach it.
#[derive(Parser)]
#[command(
    name = "nfs_chain",
    after_help = "Examples:\n  nfs_chain --seconds 60 --topology 2s4c2t\n  podq monitor --pid <pid>\n  podq ctl --pid <pid> set rpciod affinity_scope cpu"
)]
struct Options {
    /// Run for this many seconds, then check the counts [default: until killed].
    #[arg(long, value_parser = positive)]
    seconds: Option<f64>,
    /// Producer threads (completion queues) [default: one per usable CPU, at most 4].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    producers: Option<u64>,
    /// Completions per second per producer.
    #[arg(long, default_value_t = 1000.0, value_parser = positive)]
    rate: f64,
    /// A synthetic machine such as 2s4c2t, mapped onto the real CPUs [default: this
    /// machine].
    #[arg(long, value_name = "SHAPE")]
    topology: Option<String>,
}

fn positive(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0 && *v <= 1e9)
        .ok_or_else(|| format!("`{text}` is not a number in (0, 1e9]"))
}

/// Prints a line and flushes it (the first line is read by scripts as it comes). A
/// reader that went away (`nfs_chain | head -1`) does not stop the run: the exit status
/// still says whether every completion ran once.
fn say(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// FNV-1a over the block: the "I/O" work of one item.
fn checksum(block: &[u8]) -> u64 {
    block.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Counts of the chain's stages.
#[derive(Default)]
struct Counts {
    submitted: AtomicU64,
    rpc_done: AtomicU64,
    nfs_done: AtomicU64,
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let options = Options::parse();
    let topology = match &options.topology {
        Some(shape) => Topology::synthetic(shape)?,
        None => Topology::live()?,
    };
    let rpciod = Workqueue::builder("rpciod")
        .topology(topology.clone())
        .build()?;
    let nfsiod = Workqueue::builder("nfsiod")
        .topology(topology.clone())
        .build()?;
    rpciod.expose()?;
    nfsiod.expose()?;
    let server = control::start()?;
    say(&format!(
        "nfs_chain: pid {} socket {}",
        std::process::id(),
        server.path().display()
    ))?;

    let usable: Vec<usize> = topology.usable().iter().collect();
    let producers = options
        .producers
        .map_or(usable.len().min(4), |n| n as usize);
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let period = Duration::from_secs_f64(1.0 / options.rate);
    let threads: Vec<_> = (0..producers)
        .map(|i| {
            let cpu = usable[i * usable.len() / producers];
            let (topology, rpciod, nfsiod) = (topology.clone(), rpciod.clone(), nfsiod.clone());
            let (counts, stop) = (Arc::clone(&counts), Arc::clone(&stop));
            thread::Builder::new().name(format!("cq{i}")).spawn(
                move || -> Result<(), podq::Error> {
                    podq::pin_thread_to(cpu, &topology)?;
                    let mut next = Instant::now();
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        seq += 1;
                        let block = vec![(seq % 251) as u8; 4096];
                        let (nfsiod, counts) = (nfsiod.clone(), Arc::clone(&counts));
                        counts.submitted.fetch_add(1, Ordering::Relaxed);
                        // A dropped JoinHandle detaches: the item still runs.
                        drop(rpciod.spawn(move || {
                            black_box(checksum(&block));
                            counts.rpc_done.fetch_add(1, Ordering::Relaxed);
                            drop(nfsiod.spawn(move || {
                                black_box(checksum(&block));
                                counts.nfs_done.fetch_add(1, Ordering::Relaxed);
                            }));
                        }));
                        next += period;
                        let now = Instant::now();
                        if next > now {
                            thread::sleep(next - now);
                        } else {
                            next = now;
                        }
                    }
                    Ok(())
                },
            )
        })
        .collect::<Result<_, _>>()?;

    match options.seconds {
        Some(seconds) => thread::sleep(Duration::from_secs_f64(seconds)),
        None => loop {
            thread::sleep(Duration::from_secs(3600));
        },
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().map_err(|_| "a producer panicked")??;
    }
    // rpciod items queue the nfsiod ones, so rpciod is flushed first.
    rpciod.flush();
    nfsiod.flush();
    let submitted = counts.submitted.load(Ordering::Relaxed);
    let rpc = counts.rpc_done.load(Ordering::Relaxed);
    let nfs = counts.nfs_done.load(Ordering::Relaxed);
    let rpc_stats = rpciod.stats().totals;
    let nfs_stats = nfsiod.stats().totals;
    say(&format!(
        "nfs_chain: submitted {submitted}, rpciod ran {rpc} (started {}), nfsiod ran {nfs} \
         (started {})",
        rpc_stats.started, nfs_stats.started
    ))?;
    let exact = submitted == rpc && rpc == nfs;
    if exact {
        say("nfs_chain: every completion ran once on each queue")?;
    } else {
        say("nfs_chain: LOST OR DUPLICATED ITEMS")?;
    }
    Ok(exact)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("nfs_chain: {e}");
            ExitCode::FAILURE
        }
    }
}

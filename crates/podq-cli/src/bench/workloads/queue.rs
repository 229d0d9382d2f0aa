//! `queue`: the shape of the kernel's `lib/test_workqueue.c`. One thread per CPU, all
//! released together; each queues its own item on one shared queue, waits for it to
//! run, and queues it again. Throughput is all items over the wall time; the latency
//! is that of the queue call itself. The producers' and workers' context switches are
//! counted too: every item is a round trip between two threads, and whether it costs
//! two switches (producer and worker taking turns on one CPU) or fewer (the item runs
//! on a CPU where nobody waits) sets the rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

use super::{empty_sample, RunLength, Sample};
use crate::bench::report::{new_histogram, record};
use crate::bench::system::placement::CpuMap;
use crate::bench::system::{Completion, Queue, QueueConfig, System};
use crate::procinfo::Switches;

/// Items each producer runs before the clock starts, so workers exist.
const WARMUP_ITEMS: u64 = 50;

/// Parameters of the `queue` test.
#[derive(Clone, Debug)]
pub struct QueueParams {
    /// Producer count; `None`: one per usable CPU of the topology.
    pub producers: Option<usize>,
    /// CPU time each item spends.
    pub work: Duration,
}

impl QueueParams {
    /// The virtual CPU of each producer: the usable CPUs in order, repeated if there
    /// are more producers than CPUs.
    pub fn producer_cpus(&self, map: &CpuMap) -> Vec<usize> {
        let vcpus = map.vcpus();
        let n = self.producers.unwrap_or(vcpus.len());
        vcpus.iter().copied().cycle().take(n).collect()
    }
}

/// Runs the test once.
pub fn run(
    system: &dyn System,
    config: QueueConfig,
    map: &CpuMap,
    params: &QueueParams,
    length: RunLength,
) -> Result<Sample> {
    let queue = system.new_queue("bench_wq", config)?;
    let cpus = params.producer_cpus(map);
    let barrier = Barrier::new(cpus.len() + 1);
    let stop = AtomicBool::new(false);
    let locks_before = queue.lock_counts();
    let (outcomes, seconds, switches) = std::thread::scope(|s| {
        let handles: Vec<_> = cpus
            .iter()
            .map(|&vcpu| {
                let (queue, barrier, stop) = (&*queue, &barrier, &stop);
                s.spawn(move || {
                    producer(
                        system,
                        queue,
                        map,
                        vcpu,
                        (barrier, stop),
                        length,
                        params.work,
                    )
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let switches_before = Switches::now();
        if let RunLength::Duration(d) = length {
            std::thread::sleep(d);
            stop.store(true, Ordering::Relaxed);
        }
        let outcomes: Vec<Result<(u64, Histogram<u64>)>> = handles
            .into_iter()
            .map(|h| h.join().expect("producer threads do not panic"))
            .collect();
        let seconds = start.elapsed().as_secs_f64();
        let switches = switches_before.and_then(|b| Switches::now().map(|a| a.since(b)));
        (outcomes, seconds, switches)
    });
    let mut sample = empty_sample();
    sample.seconds = seconds;
    sample.context_switches = Some(switches?);
    for outcome in outcomes {
        let (items, h) = outcome?;
        sample.items += items;
        // Same bounds on both sides.
        let _ = sample.latency.add(&h);
    }
    sample.record_queue(&*queue, locks_before);
    Ok(sample)
}

fn producer(
    system: &dyn System,
    queue: &dyn Queue,
    map: &CpuMap,
    vcpu: usize,
    (barrier, stop): (&Barrier, &AtomicBool),
    length: RunLength,
    work: Duration,
) -> Result<(u64, Histogram<u64>)> {
    let pinned = map.pin_current(vcpu);
    let done = Completion::for_current_thread();
    let signal = Arc::clone(&done);
    let item = queue.prepare(Arc::new(move || {
        crate::bench::define::spin(work);
        signal.complete()
    }));
    if pinned.is_ok() {
        system.enter_cpu(vcpu);
        for _ in 0..WARMUP_ITEMS {
            item.submit();
            done.wait();
        }
    }
    // Always reach the barrier, or the others would wait forever.
    barrier.wait();
    pinned?;
    let limit = match length {
        RunLength::Items(n) => n,
        RunLength::Duration(_) => u64::MAX,
    };
    let mut h = new_histogram();
    let mut items = 0;
    while items < limit && !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        item.submit();
        record(&mut h, start.elapsed().as_nanos() as u64);
        done.wait();
        items += 1;
    }
    Ok((items, h))
}

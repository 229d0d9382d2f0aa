//! `latency`: one submitter pinned to a CPU, depth 1, synchronous, with think time
//! between items (fio's `--thinktime`). Completion latency runs from just before the
//! submit call to the end of the item (stamped by the item itself); the submit call's
//! own duration is fio's slat.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::{empty_sample, RunLength, Sample};
use crate::bench::report::{new_histogram, record};
use crate::bench::system::placement::CpuMap;
use crate::bench::system::{Completion, QueueConfig, System};

/// Items run before measuring, so workers exist.
const WARMUP_ITEMS: u64 = 20;

/// Below this much remaining think time, spin instead of sleeping: a sleep overshoots
/// by tens of microseconds.
const SPIN_BELOW: Duration = Duration::from_micros(200);

/// Parameters of the `latency` test.
#[derive(Clone, Debug)]
pub struct LatencyParams {
    /// Virtual CPU of the submitter; `None`: the first usable CPU.
    pub cpu: Option<usize>,
    /// Pause between one item's completion and the next submit.
    pub think: Duration,
    /// CPU time each item spends.
    pub work: Duration,
}

/// Runs the test once.
pub fn run(
    system: &dyn System,
    config: QueueConfig,
    map: &CpuMap,
    params: &LatencyParams,
    length: RunLength,
) -> Result<Sample> {
    let vcpus = map.vcpus();
    let cpu = params.cpu.unwrap_or(vcpus[0]);
    if !vcpus.contains(&cpu) {
        bail!("latency CPU {cpu} is not a usable CPU of the topology");
    }
    let queue = system.new_queue("bench_latency", config)?;
    let locks_before = queue.lock_counts();
    let think = params.think;
    let mut sample = std::thread::scope(|s| {
        s.spawn(|| -> Result<Sample> {
            map.pin_current(cpu)?;
            system.enter_cpu(cpu);
            let base = Instant::now();
            let finished_at = Arc::new(AtomicU64::new(0));
            let done = Completion::for_current_thread();
            let item = {
                let (finished_at, done) = (Arc::clone(&finished_at), Arc::clone(&done));
                let work = params.work;
                queue.prepare(Arc::new(move || {
                    crate::bench::define::spin(work);
                    // Relaxed: `complete` publishes it with Release.
                    finished_at.store(base.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    done.complete();
                }))
            };
            for _ in 0..WARMUP_ITEMS {
                item.submit();
                done.wait();
                think_for(think);
            }
            let mut sample = empty_sample();
            let mut submit = new_histogram();
            let start = Instant::now();
            loop {
                let more = match length {
                    RunLength::Items(n) => sample.items < n,
                    RunLength::Duration(d) => start.elapsed() < d,
                };
                if !more {
                    break;
                }
                let t0 = base.elapsed().as_nanos() as u64;
                item.submit();
                let t1 = base.elapsed().as_nanos() as u64;
                done.wait();
                let end = finished_at.load(Ordering::Relaxed);
                record(&mut sample.latency, end.saturating_sub(t0));
                record(&mut submit, t1 - t0);
                sample.items += 1;
                think_for(think);
            }
            sample.seconds = start.elapsed().as_secs_f64();
            sample.submit = Some(submit);
            Ok(sample)
        })
        .join()
        .expect("the submitter does not panic")
    })?;
    sample.record_queue(&*queue, locks_before);
    Ok(sample)
}

/// Waits `d` accurately: sleeps most of it, spins the rest.
pub fn think_for(d: Duration) {
    let deadline = Instant::now() + d;
    if d > SPIN_BELOW {
        std::thread::sleep(d - SPIN_BELOW);
    }
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn think_time_is_never_short() {
        for us in [0, 50, 300, 1000] {
            let d = Duration::from_micros(us);
            let start = Instant::now();
            think_for(d);
            assert!(start.elapsed() >= d);
        }
    }
}

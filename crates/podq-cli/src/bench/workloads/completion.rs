//! `completion`: the NFS-over-RDMA client in miniature (reference/nfs-experiments.md §4).
//!
//! K completion producers ("CQs") are pinned by `--cq-placement`. Each keeps `depth`
//! I/Os in flight. Posting a completion allocates a request object on the producer's
//! CPU, writes a 4 KiB buffer there and queues an `rpciod` item. The `rpciod` item frees
//! the request (remote when it runs elsewhere), allocates a task object, reads the
//! buffer and queues an `nfsiod` item, which frees the task object and returns the slot
//! to its producer. `--toggle` changes `rpciod`'s scope live in equal time segments;
//! `--cq-move` moves the producers between placements the same way (each re-pins to
//! its CPU in the new placement), so that an `auto` scope has a moving load to follow.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use crossbeam_channel::{bounded, Receiver, Sender};
use hdrhistogram::Histogram;
use podq_topology::Scope;

use super::{empty_sample, RunLength, Sample};
use crate::bench::alloc_model::{AllocConfig, AllocCounts, AllocModel, Object};
use crate::bench::report::{
    new_histogram, record, Accounting, AutoTrace, CompletionDetail, TimelinePoint,
};
use crate::bench::system::placement::{self, CpuMap};
use crate::bench::system::{Item, PoolLockCounts, Queue, QueueConfig, System};

/// Bytes of "I/O" per completion.
pub const IO_BYTES: usize = 4096;
const IO_WORDS: usize = IO_BYTES / 8;

/// Parameters of the `completion` test.
#[derive(Clone, Debug)]
pub struct CompletionParams {
    /// Virtual CPU of each producer.
    pub producer_cpus: Vec<usize>,
    /// I/Os in flight per producer.
    pub depth: usize,
    /// The allocator model's knobs.
    pub alloc: AllocConfig,
    /// Scopes `rpciod` goes through in equal segments; empty: no toggling.
    pub toggle: Vec<Scope>,
    /// Placements the producers go through in equal segments (name, CPU of each
    /// producer); empty: they stay on `producer_cpus`.
    pub moves: Vec<(String, Vec<usize>)>,
    /// CPU time of the producer per I/O and of each stage's item.
    pub work: crate::bench::define::ItemWork,
}

/// One I/O slot of a producer.
struct Slot {
    /// The payload, written on the producer's CPU, read by `rpciod`.
    buffer: Box<[AtomicU64]>,
    /// Allocated by the producer, freed by `rpciod`.
    request: Mutex<Option<Object>>,
    /// Allocated by `rpciod`, freed by `nfsiod`.
    task: Mutex<Option<Object>>,
    /// When the completion was posted, ns since the run's base instant.
    posted_at: AtomicU64,
    /// When `nfsiod` finished, ns since the base.
    done_at: AtomicU64,
    /// Sum of the buffer as read by `rpciod`, kept so the read is not optimised out.
    checksum: AtomicU64,
}

/// What the items of one run share.
struct Shared {
    alloc: AllocModel,
    cpu_probe: fn() -> usize,
    base: Instant,
    /// I/Os finished (nfsiod items done).
    completed: AtomicU64,
    /// Worker CPU changes seen between items.
    migrations: AtomicU64,
    /// CPU time of the producer and each stage beyond their real work (read-only).
    work: crate::bench::define::ItemWork,
}

thread_local! {
    static LAST_CPU: Cell<Option<usize>> = const { Cell::new(None) };
}

impl Shared {
    /// The calling worker's virtual CPU; counts a migration when its real CPU changed
    /// since its previous item.
    fn worker_cpu(&self) -> usize {
        let real = placement::real_cpu();
        if LAST_CPU
            .with(|c| c.replace(Some(real)))
            .is_some_and(|prev| prev != real)
        {
            self.migrations.fetch_add(1, Ordering::Relaxed);
        }
        (self.cpu_probe)()
    }
}

/// Counters sampled at a segment boundary.
struct Snapshot {
    at: Instant,
    completed: u64,
    migrations: u64,
    alloc: AllocCounts,
    rpciod: Option<PoolLockCounts>,
    nfsiod: Option<PoolLockCounts>,
    auto: Option<podq::auto::AutoStats>,
    cpu_times: Vec<(usize, CpuTimes)>,
    context_switches: u64,
}

/// Counters read for the time series.
struct Tick {
    at: Instant,
    completed: u64,
    cpu_times: Vec<(usize, CpuTimes)>,
}

/// Sleeps `d`, reading a [`Tick`] every `every`.
fn sleep_sampling(d: Duration, every: Duration, completed: &AtomicU64, ticks: &mut Vec<Tick>) {
    let end = Instant::now() + d;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        std::thread::sleep(every.min(end - now));
        ticks.push(Tick {
            at: Instant::now(),
            completed: completed.load(Ordering::Relaxed),
            // A failed read leaves the interval without idle figures.
            cpu_times: read_cpu_times().unwrap_or_default(),
        });
    }
}

/// The intervals between consecutive ticks as time series points.
fn timeline_of(
    ticks: &[Tick],
    origin: Instant,
    idle_of: impl Fn(&[(usize, CpuTimes)], &[(usize, CpuTimes)]) -> Vec<f64>,
) -> Vec<(Instant, TimelinePoint)> {
    ticks
        .windows(2)
        .filter_map(|w| {
            let seconds = (w[1].at - w[0].at).as_secs_f64();
            (seconds > 0.0).then(|| {
                let mid = w[0].at + (w[1].at - w[0].at) / 2;
                (
                    mid,
                    TimelinePoint {
                        t: (w[1].at - origin).as_secs_f64(),
                        mb_per_sec: (w[1].completed - w[0].completed) as f64 * IO_BYTES as f64
                            / seconds
                            / 1e6,
                        idle: idle_of(&w[0].cpu_times, &w[1].cpu_times),
                    },
                )
            })
        })
        .collect()
}

/// Runs the test once; one sample per toggle segment.
pub fn run(
    system: &dyn System,
    config: QueueConfig,
    map: &CpuMap,
    params: &CompletionParams,
    length: RunLength,
) -> Result<Vec<Sample>> {
    let segments = params.toggle.len().max(params.moves.len()).max(1);
    let segment_length = match length {
        RunLength::Duration(d) => d / segments as u32,
        RunLength::Items(_) if !params.toggle.is_empty() || !params.moves.is_empty() => {
            bail!("--toggle and --cq-move need --duration, not --items")
        }
        RunLength::Items(_) => Duration::ZERO,
    };
    let rpciod_config = match params.toggle.first() {
        Some(&scope) => QueueConfig {
            scope: Some(scope),
            ..config
        },
        None => config,
    };
    let rpciod = system.new_queue("rpciod", rpciod_config)?;
    // nfsiod keeps the default scope, as it does in the experiments where only rpciod
    // was toggled.
    let nfsiod_config = QueueConfig {
        scope: config.scope.map(|_| Scope::Default),
        strict: config.strict.map(|_| false),
    };
    let nfsiod = system.new_queue("nfsiod", nfsiod_config)?;
    let topology = map.topology();
    let capacity = params.producer_cpus.len() * params.depth * 2
        + (topology.usable().len() + topology.nodes().len()) * params.alloc.cache_size
        + 64;
    let shared = Arc::new(Shared {
        alloc: AllocModel::new(topology, params.alloc, capacity)?,
        cpu_probe: system.cpu_probe(),
        base: Instant::now(),
        completed: AtomicU64::new(0),
        migrations: AtomicU64::new(0),
        work: params.work,
    });
    let barrier = Barrier::new(params.producer_cpus.len() + 1);
    let stop = AtomicBool::new(false);
    let segment = AtomicUsize::new(0);
    let limit = match length {
        RunLength::Items(n) => n,
        RunLength::Duration(_) => u64::MAX,
    };
    let snapshot = || -> Result<Snapshot> {
        Ok(Snapshot {
            at: Instant::now(),
            completed: shared.completed.load(Ordering::Relaxed),
            migrations: shared.migrations.load(Ordering::Relaxed),
            alloc: shared.alloc.counts(),
            rpciod: rpciod.lock_counts(),
            nfsiod: nfsiod.lock_counts(),
            auto: rpciod.auto(),
            cpu_times: read_cpu_times()?,
            context_switches: crate::procinfo::process_context_switches()?,
        })
    };
    let (segment_marks, histograms, ticks, accounting) = std::thread::scope(|s| -> Result<_> {
        let handles: Vec<_> = params
            .producer_cpus
            .iter()
            .enumerate()
            .map(|(index, &vcpu)| {
                let ctx = ProducerCtx {
                    system,
                    rpciod: &*rpciod,
                    nfsiod: &*nfsiod,
                    map,
                    shared: &shared,
                    barrier: &barrier,
                    stop: &stop,
                    segment: &segment,
                    segments,
                    depth: params.depth,
                    limit,
                    moves: &params.moves,
                };
                s.spawn(move || producer(&ctx, index, vcpu))
            })
            .collect();
        // Each segment is measured from its own start mark to its own end mark. The
        // first start is taken before the producers are released, so no completion
        // falls before it; at a toggle the old segment ends before the scope changes
        // and the new one starts after, so pools the change brings in are counted
        // from their state at the change, not with the history of their other users.
        let mut starts: Vec<Snapshot> = Vec::with_capacity(segments);
        let mut ends = Vec::with_capacity(segments);
        let mut outcome = snapshot().map(|snap| starts.push(snap));
        let mut ticks: Vec<Tick> = starts
            .iter()
            .map(|s| Tick {
                at: s.at,
                completed: s.completed,
                cpu_times: s.cpu_times.clone(),
            })
            .collect();
        // About a hundred points over the run, at least 20 ms apart.
        let every = (segment_length * segments as u32 / 100).max(Duration::from_millis(20));
        if outcome.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        barrier.wait();
        for (index, scope) in (0..segments).map(|i| (i, params.toggle.get(i))) {
            if outcome.is_err() {
                break;
            }
            if index > 0 {
                outcome = snapshot().map(|snap| ends.push(snap));
                if let Some(&scope) = scope {
                    outcome = outcome.and_then(|()| rpciod.set_scope(scope));
                }
                outcome = outcome.and_then(|()| snapshot().map(|snap| starts.push(snap)));
                if outcome.is_err() {
                    break;
                }
                segment.store(index, Ordering::Relaxed);
            }
            if !segment_length.is_zero() {
                sleep_sampling(segment_length, every, &shared.completed, &mut ticks);
            }
        }
        // In --items mode the end is when every producer has finished.
        if segment_length.is_zero() && outcome.is_ok() {
            while handles.iter().any(|h| !h.is_finished()) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let end = snapshot();
        stop.store(true, Ordering::Relaxed);
        let mut histograms = vec![new_histogram(); segments];
        let mut posted = 0;
        for handle in handles {
            let (produced, count) = handle.join().expect("producer threads do not panic")?;
            posted += count;
            for (total, h) in histograms.iter_mut().zip(produced) {
                // Same bounds on both sides.
                let _ = total.add(&h);
            }
        }
        outcome?;
        ends.push(end?);
        // Every producer waited for its I/Os: nothing is in flight any more.
        let counted = |q: &dyn Queue| q.totals().map_or([0; 2], |t| [t.queued, t.completed]);
        let accounting = Accounting {
            posted,
            done: shared.completed.load(Ordering::Relaxed),
            rpciod: counted(&*rpciod),
            nfsiod: counted(&*nfsiod),
        };
        Ok((
            starts.into_iter().zip(ends).collect::<Vec<_>>(),
            histograms,
            ticks,
            accounting,
        ))
    })?;
    let fake = map.is_fake();
    let mut accounting = Some(accounting);
    let last = segment_marks.len() - 1;
    let idle_of = |a: &[(usize, CpuTimes)], b: &[(usize, CpuTimes)]| {
        if fake {
            idle_shares(a, b)
        } else {
            per_node_idle(map, a, b)
        }
    };
    let origin = segment_marks
        .first()
        .map_or_else(Instant::now, |(a, _)| a.at);
    let mut timeline = timeline_of(&ticks, origin, idle_of);
    Ok(segment_marks
        .iter()
        .zip(histograms)
        .enumerate()
        .map(|(index, ((a, b), latency))| {
            let seconds = (b.at - a.at).as_secs_f64();
            let items = b.completed - a.completed;
            let idle_per_cpu = idle_shares(&a.cpu_times, &b.cpu_times);
            let idle_per_node = if fake {
                Vec::new()
            } else {
                per_node_idle(map, &a.cpu_times, &b.cpu_times)
            };
            let mut sample = empty_sample();
            sample.items = items;
            sample.seconds = seconds;
            sample.latency = latency;
            sample.pool_locks = b.rpciod.zip(a.rpciod).map(|(b, a)| b.since(&a));
            sample.segment_scope = params.toggle.get(index).copied();
            let auto = b
                .auto
                .as_ref()
                .map(|at_end| AutoTrace::between(a.auto.as_ref(), at_end));
            // The points whose interval centre falls in this segment.
            let split = timeline.partition_point(|(mid, _)| *mid < b.at);
            let rest = timeline.split_off(split);
            let points = std::mem::replace(&mut timeline, rest)
                .into_iter()
                .map(|(_, p)| p)
                .collect();
            sample.completion = Some(CompletionDetail {
                start_s: (a.at - origin).as_secs_f64(),
                timeline: points,
                mb_per_sec: items as f64 * IO_BYTES as f64 / seconds / 1e6,
                idle_per_cpu,
                idle_per_node,
                allocator: b.alloc.since(&a.alloc),
                nfsiod_pool_locks: b.nfsiod.zip(a.nfsiod).map(|(b, a)| b.since(&a)),
                context_switches: b.context_switches - a.context_switches,
                migrations: b.migrations - a.migrations,
                placement: params.moves.get(index).map(|(name, _)| name.clone()),
                auto,
                accounting: if index == last {
                    accounting.take()
                } else {
                    None
                },
            });
            sample
        })
        .collect())
}

struct ProducerCtx<'a> {
    system: &'a dyn System,
    rpciod: &'a dyn Queue,
    nfsiod: &'a dyn Queue,
    map: &'a CpuMap,
    shared: &'a Arc<Shared>,
    barrier: &'a Barrier,
    stop: &'a AtomicBool,
    segment: &'a AtomicUsize,
    segments: usize,
    depth: usize,
    limit: u64,
    moves: &'a [(String, Vec<usize>)],
}

/// Builds one slot's items: the nfsiod item first, since the rpciod item queues it.
fn build_slot(
    ctx: &ProducerCtx<'_>,
    index: usize,
    slot: &Arc<Slot>,
    free: &Sender<usize>,
) -> Box<dyn Item> {
    let nfsiod_item: Arc<dyn Item> = {
        let (slot, shared, free) = (Arc::clone(slot), Arc::clone(ctx.shared), free.clone());
        Arc::from(ctx.nfsiod.prepare(Arc::new(move || {
            crate::bench::define::spin(shared.work.nfsiod);
            let cpu = shared.worker_cpu();
            let task = slot.task.lock().expect("no item panics").take();
            if let Some(task) = task {
                shared.alloc.free(task, cpu);
            }
            slot.done_at
                .store(shared.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
            shared.completed.fetch_add(1, Ordering::Relaxed);
            // The producer holds the receiver until every slot came back.
            let _ = free.send(index);
        })))
    };
    let (slot, shared) = (Arc::clone(slot), Arc::clone(ctx.shared));
    ctx.rpciod.prepare(Arc::new(move || {
        let cpu = shared.worker_cpu();
        let request = slot.request.lock().expect("no item panics").take();
        if let Some(request) = request {
            shared.alloc.free(request, cpu);
        }
        *slot.task.lock().expect("no item panics") = Some(shared.alloc.alloc(cpu));
        let sum = slot
            .buffer
            .iter()
            .fold(0u64, |acc, w| acc.wrapping_add(w.load(Ordering::Relaxed)));
        slot.checksum.store(sum, Ordering::Relaxed);
        crate::bench::define::spin(shared.work.rpciod);
        nfsiod_item.submit();
    }))
}

/// Posts completions until told to stop, then waits for its I/Os to finish. Returns
/// the latency histogram of each segment and the completions it posted.
fn producer(
    ctx: &ProducerCtx<'_>,
    index: usize,
    mut vcpu: usize,
) -> Result<(Vec<Histogram<u64>>, u64)> {
    let pinned = ctx.map.pin_current(vcpu);
    if pinned.is_ok() {
        ctx.system.enter_cpu(vcpu);
    }
    let (free_tx, free_rx): (Sender<usize>, Receiver<usize>) = bounded(ctx.depth);
    let slots: Vec<Arc<Slot>> = (0..ctx.depth)
        .map(|_| {
            Arc::new(Slot {
                buffer: (0..IO_WORDS).map(|_| AtomicU64::new(0)).collect(),
                request: Mutex::new(None),
                task: Mutex::new(None),
                posted_at: AtomicU64::new(0),
                done_at: AtomicU64::new(0),
                checksum: AtomicU64::new(0),
            })
        })
        .collect();
    let items: Vec<Box<dyn Item>> = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| build_slot(ctx, i, slot, &free_tx))
        .collect();
    drop(free_tx);
    ctx.barrier.wait();
    pinned?;
    let mut histograms = vec![new_histogram(); ctx.segments];
    let shared = ctx.shared;
    let mut idle: Vec<usize> = (0..ctx.depth).collect();
    let mut in_flight = 0usize;
    let mut posted = 0u64;
    let record_done = |index: usize, histograms: &mut Vec<Histogram<u64>>| {
        let slot = &slots[index];
        let latency = slot.done_at.load(Ordering::Relaxed) - slot.posted_at.load(Ordering::Relaxed);
        let segment = ctx.segment.load(Ordering::Relaxed).min(ctx.segments - 1);
        record(&mut histograms[segment], latency);
    };
    let mut placed_for = 0;
    let mut moved = Ok(());
    while posted < ctx.limit && !ctx.stop.load(Ordering::Relaxed) {
        let segment = ctx.segment.load(Ordering::Relaxed);
        if segment != placed_for {
            placed_for = segment;
            if let Some((_, cpus)) = ctx.moves.get(segment) {
                vcpu = cpus[index];
                moved = ctx.map.pin_current(vcpu);
                if moved.is_err() {
                    break;
                }
                ctx.system.enter_cpu(vcpu);
            }
        }
        let index = match idle.pop() {
            Some(i) => i,
            None => {
                let i = free_rx.recv().expect("items hold senders");
                in_flight -= 1;
                record_done(i, &mut histograms);
                i
            }
        };
        let slot = &slots[index];
        *slot.request.lock().expect("no item panics") = Some(shared.alloc.alloc(vcpu));
        for (i, word) in slot.buffer.iter().enumerate() {
            word.store(posted ^ i as u64, Ordering::Relaxed);
        }
        crate::bench::define::spin(shared.work.cq);
        slot.posted_at
            .store(shared.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
        items[index].submit();
        in_flight += 1;
        posted += 1;
    }
    // Nothing is lost: wait for every I/O still in flight.
    while in_flight > 0 {
        let i = free_rx.recv().expect("items hold senders");
        in_flight -= 1;
        record_done(i, &mut histograms);
    }
    moved?;
    Ok((histograms, posted))
}

/// Jiffies of one CPU from `/proc/stat`.
#[derive(Clone, Copy, Debug, Default)]
struct CpuTimes {
    idle: u64,
    total: u64,
}

fn read_cpu_times() -> Result<Vec<(usize, CpuTimes)>> {
    Ok(cpu_times(&crate::procinfo::read_proc_stat()?))
}

/// Idle (idle + iowait) and total jiffies of each CPU.
fn cpu_times(stat: &crate::procinfo::ProcStat) -> Vec<(usize, CpuTimes)> {
    stat.cpus
        .iter()
        .map(|(&cpu, t)| {
            let idle = t.idle_all();
            (
                cpu,
                CpuTimes {
                    idle,
                    total: idle + t.busy(),
                },
            )
        })
        .collect()
}

fn idle_share(a: CpuTimes, b: CpuTimes) -> f64 {
    let total = b.total.saturating_sub(a.total);
    if total == 0 {
        return 0.0;
    }
    b.idle.saturating_sub(a.idle) as f64 / total as f64
}

/// Idle share of each CPU present in both samples, by CPU number.
fn idle_shares(a: &[(usize, CpuTimes)], b: &[(usize, CpuTimes)]) -> Vec<f64> {
    b.iter()
        .filter_map(|&(cpu, after)| {
            a.iter()
                .find(|(c, _)| *c == cpu)
                .map(|&(_, before)| idle_share(before, after))
        })
        .collect()
}

/// Idle share of each node of the live topology over its CPUs.
fn per_node_idle(map: &CpuMap, a: &[(usize, CpuTimes)], b: &[(usize, CpuTimes)]) -> Vec<f64> {
    let topology = map.topology();
    topology
        .nodes()
        .into_iter()
        .map(|node| {
            let cpus = topology.node_cpus(node);
            let sum = |samples: &[(usize, CpuTimes)]| {
                samples.iter().filter(|(c, _)| cpus.contains(*c)).fold(
                    CpuTimes::default(),
                    |acc, &(_, t)| CpuTimes {
                        idle: acc.idle + t.idle,
                        total: acc.total + t.total,
                    },
                )
            };
            idle_share(sum(a), sum(b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_idle_shares() {
        let parse = |text: &str| cpu_times(&crate::procinfo::parse_proc_stat(text).unwrap());
        let a =
            parse("cpu  1 2 3 4 5 6 7 8\ncpu0 10 0 10 70 10 0 0 0 5 0\ncpu1 0 0 0 100 0 0 0 0\n");
        let b =
            parse("cpu  1 2 3 4 5 6 7 8\ncpu0 20 0 20 110 20 0 0 0 5 0\ncpu1 50 0 0 150 0 0 0 0\n");
        assert_eq!(a.len(), 2);
        let shares = idle_shares(&a, &b);
        // cpu0: idle+iowait grew 50 of 70; cpu1: 50 of 100.
        assert!((shares[0] - 50.0 / 70.0).abs() < 1e-9);
        assert!((shares[1] - 0.5).abs() < 1e-9);
    }
}

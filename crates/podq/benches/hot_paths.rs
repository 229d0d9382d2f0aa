//! Hot paths: queue → execute of a re-queued `Work`, `spawn` + `join`, a worker
//! draining a backlog, the CPU and pod lookups a queue call makes, and a stats
//! snapshot.
//!
//! Stats recording is a cargo feature; its cost on these paths is the difference
//! between `cargo bench -p podq --bench hot_paths` and the same with
//! `--no-default-features`.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_main, Criterion, Throughput};
use podq::{policy, Scope, Topology, Work, Workqueue};

/// A work item that signals the thread that created it, and the wait for it.
struct PingPong {
    work: Work,
    done: Arc<AtomicBool>,
}

impl PingPong {
    fn new() -> PingPong {
        let done = Arc::new(AtomicBool::new(false));
        let me = std::thread::current();
        let flag = Arc::clone(&done);
        let work = Work::new(move || {
            flag.store(true, Ordering::Release);
            me.unpark();
        });
        PingPong { work, done }
    }

    fn round_trip(&self, wq: &Workqueue) {
        wq.queue(&self.work);
        while !self.done.swap(false, Ordering::Acquire) {
            std::thread::park();
        }
    }
}

fn queue_execute(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue_execute");
    for scope in [Scope::Cpu, Scope::System] {
        let wq = Workqueue::builder(format!("bench-{scope}"))
            .scope(scope)
            .build()
            .expect("workqueue");
        let item = PingPong::new();
        group.bench_function(format!("requeue/{scope}"), |b| {
            b.iter(|| item.round_trip(&wq))
        });
        group.bench_function(format!("spawn_join/{scope}"), |b| {
            b.iter(|| wq.spawn(|| black_box(1)).join().expect("no panic"))
        });
        wq.flush();
    }
    group.finish();
}

/// Items of one backlog in [`drain`]: as many as a flood leaves behind `max_active`
/// here, with their blocks and waiting entries well beyond the L2 cache.
const DRAIN_ITEMS: u64 = 100_000;

/// A worker draining a backlog: `DRAIN_ITEMS` tiny closures (capturing 8 bytes, as
/// `podq bench throughput`'s) queued on a frozen workqueue, then the time from its thaw
/// to the end of its flush. That is a flood's cost per item on the worker side — its
/// activation in turns, the run, the accounting and the free — without producers
/// taking turns on the same CPUs, which makes the open-loop figures swing.
fn drain(c: &mut Criterion) {
    let mut group = c.benchmark_group("drain");
    group.throughput(Throughput::Elements(DRAIN_ITEMS));
    group.sample_size(20);
    for scope in [Scope::Cpu, Scope::System] {
        let wq = Workqueue::builder(format!("bench-drain-{scope}"))
            .scope(scope)
            .build()
            .expect("workqueue");
        group.bench_function(format!("execute/{scope}"), |b| {
            b.iter_custom(|iters| {
                let mut draining = Duration::ZERO;
                for _ in 0..iters {
                    wq.freeze().expect("freeze");
                    for seq in 0..DRAIN_ITEMS {
                        wq.execute(move || {
                            black_box(seq);
                        });
                    }
                    let start = Instant::now();
                    wq.thaw();
                    wq.flush();
                    draining += start.elapsed();
                }
                draining
            })
        });
    }
    group.finish();
}

fn pod_lookup(c: &mut Criterion) {
    let topology = Topology::synthetic("2s24c2t").expect("shape");
    let usable = topology.usable().clone();
    let pods = topology.pods(Scope::CacheShard).expect("pods");
    let mut group = c.benchmark_group("pod_lookup");
    podq::set_thread_cpu(Some(37));
    group.bench_function("current_cpu/override", |b| {
        b.iter(|| black_box(podq::current_cpu()))
    });
    podq::set_thread_cpu(None);
    group.bench_function("current_cpu/sched_getcpu", |b| {
        b.iter(|| black_box(podq::current_cpu()))
    });
    group.bench_function("select_cpu/local", |b| {
        b.iter(|| black_box(policy::select_cpu(black_box(37), &usable, None)))
    });
    group.bench_function("pod_of/cache_shard", |b| {
        b.iter(|| black_box(pods.pod_of(black_box(37))))
    });
    group.finish();
}

fn stats(c: &mut Criterion) {
    let wq = Workqueue::builder("bench-stats")
        .scope(Scope::Cpu)
        .build()
        .expect("workqueue");
    let item = PingPong::new();
    for _ in 0..1000 {
        item.round_trip(&wq);
    }
    c.bench_function("stats/snapshot", |b| b.iter(|| black_box(wq.stats())));
}

/// Every benchmark of this file (written out: `criterion_group!` makes an undocumented
/// public function).
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    queue_execute(&mut c);
    drain(&mut c);
    pod_lookup(&mut c);
    stats(&mut c);
}

criterion_main!(benches);

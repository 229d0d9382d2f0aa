//! The executors podq is measured against, each used through its ordinary API.
//!
//! - `rayon`: `ThreadPool::spawn` of a closure, one thread per real CPU.
//! - `tokio-spawn-blocking`: `Handle::spawn_blocking`, the blocking pool tokio grows on
//!   demand.
//! - `crossbeam-channel`: one unbounded channel, one thread per real CPU receiving.
//! - `std-mpsc`: the textbook pool, `mpsc::Receiver` behind a `Mutex`.
//! - `pernode-threads`: sunrpc's `pool_mode=pernode` shape: one channel pool per NUMA
//!   node, its threads pinned to the node's CPUs; a submitter uses its own node's pool.
//!   On a fake topology each node gets one thread per real CPU its virtual CPUs map
//!   onto, and a worker counts as the first virtual CPU of its node on that real CPU.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{bail, Context, Result};
use crossbeam_channel::{unbounded, Sender};
use podq_topology::Scope;

use super::system::placement::{self, CpuMap};
use super::system::{Item, Queue, QueueConfig, System, Task};
use super::workloads::throughput::tiny;

/// What a channel pool's workers receive: a prepared item's shared body, or a one-shot
/// closure (`throughput`'s spawn mode), as a hand-written pool would box it.
enum Job {
    Shared(Task),
    Once(Box<dyn FnOnce() + Send>),
}

impl Job {
    fn run(self) {
        match self {
            Job::Shared(task) => task(),
            Job::Once(f) => f(),
        }
    }
}

/// The peer names, in the order tables show them.
pub const NAMES: [&str; 5] = [
    "rayon",
    "tokio-spawn-blocking",
    "crossbeam-channel",
    "std-mpsc",
    "pernode-threads",
];

/// Builds the peer called `name` for the CPUs of `map`.
pub fn build(name: &str, map: &CpuMap) -> Result<Arc<dyn System>> {
    let threads = map.real_cpus().len();
    Ok(match name {
        "rayon" => Arc::new(Rayon::new(threads)?),
        "tokio-spawn-blocking" => Arc::new(Tokio::new()?),
        "crossbeam-channel" => Arc::new(ChannelPool::new("crossbeam-channel", threads, None)?),
        "std-mpsc" => Arc::new(MpscPool::new(threads)?),
        "pernode-threads" => Arc::new(PerNode::new(map)?),
        other => bail!(
            "unknown system `{other}`: expected podq or one of {}",
            NAMES.join(", ")
        ),
    })
}

/// A system with one shared pool: every queue of it is the pool itself.
fn single_config() -> Vec<QueueConfig> {
    vec![QueueConfig::PLAIN]
}

struct Rayon {
    pool: Arc<rayon::ThreadPool>,
}

impl Rayon {
    fn new(threads: usize) -> Result<Rayon> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("bench-rayon-{i}"))
            .build()
            .context("building the rayon pool")?;
        Ok(Rayon {
            pool: Arc::new(pool),
        })
    }
}

impl System for Rayon {
    fn name(&self) -> &'static str {
        "rayon"
    }
    fn configs(&self, _: &[Scope], _: &[bool]) -> Vec<QueueConfig> {
        single_config()
    }
    fn new_queue(&self, _: &str, _: QueueConfig) -> Result<Arc<dyn Queue>> {
        Ok(Arc::new(RayonQueue(Arc::clone(&self.pool))))
    }
    fn workers(&self) -> Option<usize> {
        Some(self.pool.current_num_threads())
    }
}

struct RayonQueue(Arc<rayon::ThreadPool>);

impl Queue for RayonQueue {
    fn prepare(&self, task: Task) -> Box<dyn Item> {
        Box::new(RayonItem {
            pool: Arc::clone(&self.0),
            task,
        })
    }

    fn spawn_tiny(&self, seq: u64) {
        self.0.spawn(move || tiny(seq));
    }
}

struct RayonItem {
    pool: Arc<rayon::ThreadPool>,
    task: Task,
}

impl Item for RayonItem {
    fn submit(&self) -> bool {
        let task = Arc::clone(&self.task);
        self.pool.spawn(move || task());
        true
    }
}

struct Tokio {
    runtime: Arc<tokio::runtime::Runtime>,
}

impl Tokio {
    fn new() -> Result<Tokio> {
        // One async worker: the blocking pool is what is measured.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-tokio")
            .build()
            .context("building the tokio runtime")?;
        Ok(Tokio {
            runtime: Arc::new(runtime),
        })
    }
}

impl System for Tokio {
    fn name(&self) -> &'static str {
        "tokio-spawn-blocking"
    }
    fn configs(&self, _: &[Scope], _: &[bool]) -> Vec<QueueConfig> {
        single_config()
    }
    fn new_queue(&self, _: &str, _: QueueConfig) -> Result<Arc<dyn Queue>> {
        Ok(Arc::new(TokioQueue(self.runtime.handle().clone())))
    }
}

struct TokioQueue(tokio::runtime::Handle);

impl Queue for TokioQueue {
    fn prepare(&self, task: Task) -> Box<dyn Item> {
        Box::new(TokioItem {
            handle: self.0.clone(),
            task,
        })
    }

    fn spawn_tiny(&self, seq: u64) {
        drop(self.0.spawn_blocking(move || tiny(seq)));
    }
}

struct TokioItem {
    handle: tokio::runtime::Handle,
    task: Task,
}

impl Item for TokioItem {
    fn submit(&self) -> bool {
        let task = Arc::clone(&self.task);
        drop(self.handle.spawn_blocking(move || task()));
        true
    }
}

/// Threads receiving tasks from one crossbeam channel.
struct ChannelPool {
    name: &'static str,
    sender: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

/// Where the threads of a channel pool run: real CPUs to pin to and the virtual CPU
/// each thread counts as.
type PinPlan = Vec<(usize, usize)>;

impl ChannelPool {
    fn new(name: &'static str, threads: usize, pins: Option<PinPlan>) -> Result<ChannelPool> {
        let (sender, receiver) = unbounded::<Job>();
        // Each worker reports whether it could be pinned before serving.
        let (ready_tx, ready_rx) = unbounded::<Result<()>>();
        let mut pool = ChannelPool {
            name,
            sender: Some(sender),
            workers: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let receiver = receiver.clone();
            let ready = ready_tx.clone();
            let pin = pins.as_ref().map(|p| p[i]);
            let worker = std::thread::Builder::new()
                .name(format!("bench-{name}-{i}"))
                .spawn(move || {
                    let pinned = pin.map_or(Ok(()), |(real, vcpu)| {
                        placement::pin_to_real(&[real])
                            .map(|()| placement::set_current_vcpu(Some(vcpu)))
                    });
                    let failed = pinned.is_err();
                    // The pool waits for this report, so the receiver is alive.
                    let _ = ready.send(pinned);
                    if failed {
                        return;
                    }
                    for job in receiver {
                        job.run();
                    }
                })
                .with_context(|| format!("starting a {name} worker"))?;
            pool.workers.push(worker);
        }
        for _ in 0..threads {
            // Dropping `pool` on an error stops and joins the workers already started.
            ready_rx
                .recv()
                .context("a pool worker exited before reporting")?
                .with_context(|| format!("pinning a {name} worker"))?;
        }
        Ok(pool)
    }

    fn sender(&self) -> Sender<Job> {
        self.sender
            .clone()
            .expect("the sender lives until the pool is dropped")
    }
}

impl Drop for ChannelPool {
    fn drop(&mut self) {
        self.sender = None;
        for worker in self.workers.drain(..) {
            // A worker that panicked already printed its message; nothing to add.
            let _ = worker.join();
        }
    }
}

impl System for ChannelPool {
    fn name(&self) -> &'static str {
        self.name
    }
    fn workers(&self) -> Option<usize> {
        Some(self.workers.len())
    }
    fn configs(&self, _: &[Scope], _: &[bool]) -> Vec<QueueConfig> {
        single_config()
    }
    fn new_queue(&self, _: &str, _: QueueConfig) -> Result<Arc<dyn Queue>> {
        Ok(Arc::new(SenderQueue(self.sender())))
    }
}

/// A peer's queue: the sending end of its pool's channel (crossbeam's or std's).
struct SenderQueue<S>(S);

/// The send both channel pools' queues need.
trait JobSender: Clone + Send + Sync + 'static {
    fn send_job(&self, job: Job);
}

impl JobSender for Sender<Job> {
    fn send_job(&self, job: Job) {
        self.send(job)
            .expect("pool workers outlive the queues that feed them");
    }
}

impl JobSender for mpsc::Sender<Job> {
    fn send_job(&self, job: Job) {
        self.send(job)
            .expect("pool workers outlive the queues that feed them");
    }
}

impl<S: JobSender> Queue for SenderQueue<S> {
    fn prepare(&self, task: Task) -> Box<dyn Item> {
        Box::new(SenderItem {
            sender: self.0.clone(),
            task,
        })
    }

    fn spawn_tiny(&self, seq: u64) {
        self.0.send_job(Job::Once(Box::new(move || tiny(seq))));
    }
}

struct SenderItem<S> {
    sender: S,
    task: Task,
}

impl<S: JobSender> Item for SenderItem<S> {
    fn submit(&self) -> bool {
        self.sender.send_job(Job::Shared(Arc::clone(&self.task)));
        true
    }
}

/// The std-only pool: one `mpsc` channel whose receiver the workers share behind a
/// mutex.
struct MpscPool {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    workers: Vec<JoinHandle<()>>,
}

impl MpscPool {
    fn new(threads: usize) -> Result<MpscPool> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let receiver = Arc::clone(&receiver);
            let worker = std::thread::Builder::new()
                .name(format!("bench-std-mpsc-{i}"))
                .spawn(move || loop {
                    let next = receiver.lock().expect("no task panics").recv();
                    match next {
                        Ok(job) => job.run(),
                        Err(_) => break,
                    }
                })
                .context("starting a std-mpsc worker")?;
            workers.push(worker);
        }
        Ok(MpscPool {
            sender: Mutex::new(Some(sender)),
            workers,
        })
    }
}

impl Drop for MpscPool {
    fn drop(&mut self) {
        self.sender.lock().expect("no task panics").take();
        for worker in self.workers.drain(..) {
            // See ChannelPool::drop.
            let _ = worker.join();
        }
    }
}

impl System for MpscPool {
    fn name(&self) -> &'static str {
        "std-mpsc"
    }
    fn workers(&self) -> Option<usize> {
        Some(self.workers.len())
    }
    fn configs(&self, _: &[Scope], _: &[bool]) -> Vec<QueueConfig> {
        single_config()
    }
    fn new_queue(&self, _: &str, _: QueueConfig) -> Result<Arc<dyn Queue>> {
        let sender = self
            .sender
            .lock()
            .expect("no task panics")
            .clone()
            .context("the std-mpsc pool is shut down")?;
        Ok(Arc::new(SenderQueue(sender)))
    }
}

/// One channel pool per NUMA node.
struct PerNode {
    pools: Vec<ChannelPool>,
    /// Index into `pools` for each virtual CPU number.
    pool_of_vcpu: Arc<Vec<usize>>,
}

impl PerNode {
    fn new(map: &CpuMap) -> Result<PerNode> {
        let topology = map.topology();
        let nodes = topology.nodes();
        let size = topology.usable().last().map_or(0, |c| c + 1);
        let mut pool_of_vcpu = vec![0; size];
        let mut pools = Vec::with_capacity(nodes.len());
        for (index, &node) in nodes.iter().enumerate() {
            let mut plan: PinPlan = Vec::new();
            for vcpu in topology.node_cpus(node).iter() {
                pool_of_vcpu[vcpu] = index;
                let real = map.real_of(vcpu);
                if !plan.iter().any(|&(r, _)| r == real) {
                    plan.push((real, vcpu));
                }
            }
            pools.push(ChannelPool::new("pernode-threads", plan.len(), Some(plan))?);
        }
        Ok(PerNode {
            pools,
            pool_of_vcpu: Arc::new(pool_of_vcpu),
        })
    }
}

impl System for PerNode {
    fn name(&self) -> &'static str {
        "pernode-threads"
    }
    fn configs(&self, _: &[Scope], _: &[bool]) -> Vec<QueueConfig> {
        single_config()
    }
    fn new_queue(&self, _: &str, _: QueueConfig) -> Result<Arc<dyn Queue>> {
        Ok(Arc::new(PerNodeQueue {
            senders: self.pools.iter().map(ChannelPool::sender).collect(),
            pool_of_vcpu: Arc::clone(&self.pool_of_vcpu),
        }))
    }
}

struct PerNodeQueue {
    senders: Vec<Sender<Job>>,
    pool_of_vcpu: Arc<Vec<usize>>,
}

impl Queue for PerNodeQueue {
    fn prepare(&self, task: Task) -> Box<dyn Item> {
        Box::new(PerNodeItem {
            senders: self.senders.clone(),
            pool_of_vcpu: Arc::clone(&self.pool_of_vcpu),
            task,
        })
    }

    fn spawn_tiny(&self, seq: u64) {
        let pool = self
            .pool_of_vcpu
            .get(placement::current_vcpu())
            .copied()
            .unwrap_or(0);
        self.senders[pool]
            .send(Job::Once(Box::new(move || tiny(seq))))
            .expect("pool workers outlive the queues that feed them");
    }
}

struct PerNodeItem {
    senders: Vec<Sender<Job>>,
    pool_of_vcpu: Arc<Vec<usize>>,
    task: Task,
}

impl Item for PerNodeItem {
    fn submit(&self) -> bool {
        let vcpu = placement::current_vcpu();
        let pool = self.pool_of_vcpu.get(vcpu).copied().unwrap_or(0);
        self.senders[pool]
            .send(Job::Shared(Arc::clone(&self.task)))
            .expect("pool workers outlive the queues that feed them");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::system::Completion;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every peer runs every submitted item exactly once, from several producers.
    #[test]
    fn every_peer_runs_each_submission_once() {
        let map = CpuMap::new(podq_topology::Topology::synthetic("2s2c1t").unwrap()).unwrap();
        for name in NAMES {
            let system = build(name, &map).unwrap();
            assert_eq!(system.name(), name);
            let queue = system.new_queue("t", QueueConfig::PLAIN).unwrap();
            let runs = Arc::new(AtomicUsize::new(0));
            std::thread::scope(|s| {
                for vcpu in 0..4 {
                    let queue = &queue;
                    let runs = &runs;
                    let map = &map;
                    s.spawn(move || {
                        map.pin_current(vcpu).unwrap();
                        let done = Completion::for_current_thread();
                        let signal = Arc::clone(&done);
                        let runs = Arc::clone(runs);
                        let item = queue.prepare(Arc::new(move || {
                            runs.fetch_add(1, Ordering::Relaxed);
                            signal.complete();
                        }));
                        for _ in 0..200 {
                            item.submit();
                            done.wait();
                        }
                    });
                }
            });
            assert_eq!(runs.load(Ordering::Relaxed), 800, "{name}");
        }
        assert!(build("nope", &map).is_err());
    }
}

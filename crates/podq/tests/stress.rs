//! Nothing lost, nothing run twice: a million items (`PODQ_STRESS_ITEMS`; 200 000 in
//! debug builds) queued from several threads onto a fake 16-CPU, 2-node topology while
//! another thread changes scope, strictness, cpumask, max_active and the process default
//! scope every millisecond, and 1% of the items panic.
//!
//! Checks: every item ran exactly once (counted per item); re-queueable items ran once
//! per accepted queue call; the ordered queue kept its order; each `flush()` returned
//! only after everything its caller queued before it had finished; totals add up.
//!
//! Full size: `cargo test -p podq --release --test stress`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use podq::testing::fake_topology;
use podq::{CpuSet, Work, Workqueue};

mod common;
use common::{changer_masks, changer_scopes};

const PRODUCERS: usize = 4;
const WORKS_PER_PRODUCER: usize = 64;

fn items() -> usize {
    let default = if cfg!(debug_assertions) {
        200_000
    } else {
        1_000_000
    };
    match std::env::var("PODQ_STRESS_ITEMS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("PODQ_STRESS_ITEMS must be a number, got `{v}`")),
        Err(_) => default,
    }
}

fn quiet_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.to_string().contains("stress-panic") {
            default(info);
        }
    }));
}

#[test]
fn million_items_through_live_attribute_changes() {
    quiet_panics();
    let n = items();
    let topo = fake_topology(2, 2, 2, 2);
    let all = topo.usable().clone();
    let wq = Workqueue::builder("stress")
        .topology(topo.clone())
        .max_active(64)
        .build()
        .unwrap();
    let ordered = Workqueue::builder("stress-ordered")
        .topology(topo.clone())
        .ordered(true)
        .build()
        .unwrap();
    let counts: Arc<Vec<AtomicU8>> = Arc::new((0..n).map(|_| AtomicU8::new(0)).collect());
    let panics_expected = AtomicUsize::new(0);
    let stop = Arc::new(AtomicBool::new(false));
    let order_next = Arc::new(AtomicU64::new(0));
    let order_errors = Arc::new(AtomicUsize::new(0));
    let hook_calls = Arc::new(AtomicUsize::new(0));
    {
        let h = hook_calls.clone();
        podq::set_panic_hook(move |r| {
            if r.message.contains("stress-panic") {
                h.fetch_add(1, SeqCst);
            }
        });
    }

    let changer = {
        let (wq, ordered, stop) = (wq.clone(), ordered.clone(), stop.clone());
        let halves = changer_masks(&all);
        std::thread::spawn(move || {
            let scopes = changer_scopes();
            let mut changes = 0usize;
            let mut i = 0usize;
            while !stop.load(SeqCst) {
                i += 1;
                match i % 6 {
                    0 => wq.set_scope(scopes[i / 6 % scopes.len()]).unwrap(),
                    1 => wq.set_strict(i % 4 == 1).unwrap(),
                    2 => wq
                        .set_cpumask(halves[i / 6 % halves.len()].clone())
                        .unwrap(),
                    3 => ordered
                        .set_cpumask(halves[i / 6 % halves.len()].clone())
                        .unwrap(),
                    4 => wq.set_max_active(1 + i % 97).unwrap(),
                    _ => podq::set_default_scope(scopes[i / 6 % 6]).unwrap(),
                }
                assert!(
                    wq.set_cpumask(CpuSet::new()).is_err(),
                    "refused, changes nothing"
                );
                changes += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            changes
        })
    };

    let per = n / PRODUCERS;
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (wq, ordered, counts) = (wq.clone(), ordered.clone(), counts.clone());
            let (order_next, order_errors) = (order_next.clone(), order_errors.clone());
            let start = p * per;
            let end = if p == PRODUCERS - 1 { n } else { start + per };
            std::thread::spawn(move || {
                // Re-queueable items: count accepted queue calls and runs.
                let runs: Arc<Vec<AtomicUsize>> = Arc::new(
                    (0..WORKS_PER_PRODUCER)
                        .map(|_| AtomicUsize::new(0))
                        .collect(),
                );
                let works: Vec<Work> = (0..WORKS_PER_PRODUCER)
                    .map(|k| {
                        let runs = runs.clone();
                        Work::new(move || {
                            runs[k].fetch_add(1, SeqCst);
                        })
                    })
                    .collect();
                let mut accepted = vec![0usize; WORKS_PER_PRODUCER];
                let mut panics = 0usize;
                let mut checked = start;
                let mut ordered_seq = 0u64;
                for id in start..end {
                    podq::set_thread_cpu(Some(id % 16));
                    let counts2 = counts.clone();
                    let panic = id % 100 == 0;
                    panics += usize::from(panic);
                    wq.spawn(move || {
                        counts2[id].fetch_add(1, SeqCst);
                        if panic {
                            panic!("stress-panic {id}");
                        }
                    });
                    let k = id % WORKS_PER_PRODUCER;
                    if id % 7 == 0 && wq.queue(&works[k]) {
                        accepted[k] += 1;
                    }
                    if p == 0 && id % 3 == 0 {
                        let expect = ordered_seq;
                        ordered_seq += 1;
                        let (next, errors) = (order_next.clone(), order_errors.clone());
                        ordered.spawn(move || {
                            if next.swap(expect + 1, SeqCst) != expect {
                                errors.fetch_add(1, SeqCst);
                            }
                        });
                    }
                    if (id - start) % 20_000 == 19_999 {
                        wq.flush();
                        for c in checked..=id {
                            assert_eq!(counts[c].load(SeqCst), 1, "item {c} after flush");
                        }
                        checked = id + 1;
                    }
                }
                wq.flush();
                for w in &works {
                    w.flush();
                }
                for k in 0..WORKS_PER_PRODUCER {
                    assert_eq!(
                        runs[k].load(SeqCst),
                        accepted[k],
                        "work {k} of producer {p}"
                    );
                }
                podq::set_thread_cpu(None);
                panics
            })
        })
        .collect();
    for p in producers {
        panics_expected.fetch_add(p.join().unwrap(), SeqCst);
    }
    stop.store(true, SeqCst);
    let changes = changer.join().unwrap();
    wq.flush();
    ordered.flush();
    podq::clear_panic_hook();

    let wrong: Vec<usize> = (0..n)
        .filter(|&i| counts[i].load(SeqCst) != 1)
        .take(10)
        .collect();
    assert!(wrong.is_empty(), "items not run exactly once: {wrong:?}");
    assert_eq!(order_errors.load(SeqCst), 0, "ordered queue out of order");
    let stats = wq.stats();
    let t = &stats.totals;
    assert!(hook_calls.load(SeqCst) >= panics_expected.load(SeqCst));
    if cfg!(feature = "stats") {
        assert_eq!(t.panicked as usize, panics_expected.load(SeqCst));
        assert_eq!(t.queued, t.started + t.cancelled, "{t:?}");
        assert_eq!(t.started, t.completed, "{t:?}");
    }
    assert!(changes > 10, "the changer ran ({changes} changes)");
    eprintln!("stress: {n} items, {changes} attribute changes, totals {t:?}");
}

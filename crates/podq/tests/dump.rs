//! `Workqueue::dump`: pwqs, running items and pools, as values and as text.

use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use podq::Workqueue;

#[test]
fn dump_shows_waiting_and_running_items_and_the_pool() {
    let wq = Workqueue::builder("dump-wq")
        .ordered(true)
        .stall_threshold(Duration::from_secs(600))
        .long_item_threshold(Duration::from_millis(20))
        .build()
        .unwrap();
    let empty = wq.dump();
    assert_eq!((empty.in_flight, empty.running.len()), (0, 0));
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let (started_tx, started) = mpsc::channel::<()>();
    let blocker = wq.spawn_named("dump_blocker", move || {
        started_tx.send(()).unwrap();
        gate.lock().unwrap().recv().unwrap();
    });
    started.recv().unwrap();
    let behind: Vec<_> = (0..2).map(|i| wq.spawn(move || i)).collect();

    // The watchdog looks every 5 ms here (a quarter of 20 ms): the running time shows.
    let deadline = Instant::now() + Duration::from_secs(60);
    let dump = loop {
        let dump = wq.dump();
        if dump
            .running
            .first()
            .is_some_and(|r| r.running_for.is_some())
        {
            break dump;
        }
        assert!(Instant::now() < deadline, "no running time: {dump:?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(dump.name, "dump-wq");
    assert!(dump.ordered);
    assert_eq!((dump.max_active, dump.min_active), (1, 1));
    assert_eq!(dump.in_flight, 3);
    assert_eq!(dump.pwqs.len(), 1);
    let pwq = &dump.pwqs[0];
    assert!(pwq.current && !pwq.plugged);
    assert_eq!(
        (pwq.in_flight, pwq.inactive),
        (3, 2),
        "two wait behind the blocker"
    );
    assert_eq!(dump.running.len(), 1);
    let running = &dump.running[0];
    assert_eq!(running.label.as_deref(), Some("dump_blocker"));
    assert!(running
        .thread
        .starts_with(&format!("podq/u{}:", running.pool)));
    assert_eq!(dump.pools.len(), 1);
    assert_eq!(dump.pools[0].id, pwq.pool);
    assert!(dump.pools[0].workers >= 1);

    let text = dump.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "workqueue dump-wq: ordered, max_active 1 min_active 1, 3 in flight"
    );
    assert!(
        lines[1].starts_with(&format!(
            "  pwq on pool {}: 3 in flight, 2 inactive, refs ",
            pwq.pool
        )),
        "{text}"
    );
    assert!(
        lines[2].starts_with("  running `dump_blocker` on pool ") && lines[2].contains(" for "),
        "{text}"
    );
    let has = |want: &dyn Fn(&str) -> bool| lines.iter().any(|l| want(l));
    assert!(
        has(&|l| l.starts_with("  cpus ") && l.ends_with(&format!(" -> pool {}", pwq.pool))),
        "{text}"
    );
    assert!(
        has(&|l| l == format!("  default pool {}", pwq.pool)),
        "{text}"
    );
    assert!(
        has(&|l| l.starts_with(&format!("  pool {} (cpus ", pwq.pool))),
        "{text}"
    );
    // Ordered: one active item, on the blocker's node.
    let active: usize = dump.nodes.iter().map(|n| n.nr).sum();
    assert_eq!(active, 1, "{:?}", dump.nodes);
    assert!(has(&|l| l.ends_with(": 1/1 active")), "{text}");
    assert_eq!(dump.cpu_pools.len(), wq.topology().usable().len());
    assert!(dump.cpu_pools.iter().all(|c| c.pool == pwq.pool));
    assert_eq!(dump.default_pool, Some(pwq.pool));

    release.send(()).unwrap();
    blocker.join().unwrap();
    let results: Vec<i32> = behind.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results, [0, 1]);
    wq.flush();
    let after = wq.dump();
    assert_eq!((after.in_flight, after.running.len()), (0, 0));
    assert_eq!(after.pwqs[0].inactive, 0);
}

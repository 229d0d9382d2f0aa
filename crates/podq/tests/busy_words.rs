//! The watchdog tells a worker's back-to-back short items apart: each run has a word of
//! its own in its beat (`busy.rs`), so a worker that is always busy with short items is
//! not a long item.

use std::time::Duration;

use podq::{Topology, Workqueue};

#[test]
fn back_to_back_short_items_are_not_one_long_item() {
    let threshold = Duration::from_millis(200);
    // One pod of one CPU: one worker takes the flood in batches and runs the items
    // back to back, so the watchdog's looks (every 50 ms) nearly always find it
    // running one.
    let wq = Workqueue::builder("busy-words")
        .topology(Topology::synthetic("1s1c1t").unwrap())
        .long_item_threshold(threshold)
        .build()
        .unwrap();
    let handles: Vec<_> = (0..800)
        .map(|_| wq.spawn(|| std::thread::sleep(Duration::from_millis(1))))
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let watch = wq.stats().watchdog;
    assert_eq!(watch.long_items, 0, "{watch:?}");
    assert_eq!(watch.stalls, 0, "{watch:?}");
}

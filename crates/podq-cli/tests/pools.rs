//! `podq ctl pools` and `podq topo --socket`: the worker pools and limits of real
//! workqueues in this test process, read through its control server.

use std::process::Command;

use podq::control::{ControlServer, PoolsView};
use podq::{Scope, Topology, Work, Workqueue};

fn ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn pools_show_every_pool_and_each_visible_workqueues_map_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let server = ControlServer::builder()
        .path(dir.path().join("pools.sock"))
        .build()
        .unwrap();
    let sock = server.path().to_str().unwrap();
    let wq = Workqueue::builder("pools_rt")
        .topology(Topology::synthetic("1s2c2t").unwrap())
        .scope(Scope::Smt)
        .strict(true)
        .max_active(6)
        .min_active(2)
        .build()
        .unwrap();
    wq.expose().unwrap();
    // Not visible: its pools are listed (pools are the process's), its limits are not.
    let hidden = Workqueue::builder("pools_hidden")
        .scope(Scope::System)
        .nice(3)
        .build()
        .unwrap();
    let work = Work::new(|| {});
    wq.queue(&work);
    hidden.queue(&work);
    wq.flush();
    hidden.flush();

    let dump = wq.dump();
    let json = ok(&["ctl", "--socket", sock, "pools", "--json"]);
    let view: PoolsView = serde_json::from_str(&json).unwrap();
    for pool in &dump.pools {
        let listed = view.pools.iter().find(|p| p.id == pool.id).unwrap();
        assert_eq!(listed.pod_cpus, pool.pod_cpus);
        assert!(listed.strict);
        assert_eq!(
            listed.cpus, listed.pod_cpus,
            "strict: workers stay in the pod"
        );
        assert!(listed.refs >= 1);
    }
    let hidden_pool = hidden.dump().default_pool.unwrap();
    let listed = view.pools.iter().find(|p| p.id == hidden_pool).unwrap();
    assert_eq!(listed.nice, 3);
    assert!(!listed.strict);
    assert!(view.workqueues.iter().all(|w| w.name != "pools_hidden"));
    let mine = view
        .workqueues
        .iter()
        .find(|w| w.name == "pools_rt")
        .unwrap();
    assert_eq!((mine.max_active, mine.min_active), (6, 2));
    assert_eq!(mine.cpu_pools, dump.cpu_pools);
    assert_eq!(mine.default_pool, dump.default_pool);
    assert_eq!(mine.nodes.len(), dump.nodes.len());
    assert!(mine.nodes.iter().all(|n| n.nr == 0));

    let text = ok(&["ctl", "--socket", sock, "pools"]);
    assert!(
        text.starts_with("Worker pools\nID  REFS  NICE  IDLE/WORKERS  CPUS  POD_CPUS  STRICT\n"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("pools_rt") && l.contains(':'))
        .unwrap_or_else(|| panic!("no CPU -> pool row:\n{text}"));
    for c in &dump.cpu_pools {
        assert!(row.contains(&format!(":{}", c.pool)), "{row}");
    }
    assert!(
        text.contains("\nWorkqueue -> nr_active/max_active per node\nWORKQUEUE  MIN  MAX  NODE0"),
        "{text}"
    );

    // `podq topo --socket` prints the same (worker counts may move in between).
    let again: PoolsView =
        serde_json::from_str(&ok(&["topo", "--socket", sock, "--json"])).unwrap();
    let shape = |v: &PoolsView| -> Vec<(u64, String, String, bool)> {
        v.pools
            .iter()
            .map(|p| (p.id, p.cpus.clone(), p.pod_cpus.clone(), p.strict))
            .collect()
    };
    assert_eq!(shape(&again), shape(&view));
    assert_eq!(again.workqueues, view.workqueues);
    let text_again = ok(&["topo", "--socket", sock]);
    assert!(text_again.starts_with("Worker pools\n"), "{text_again}");
}

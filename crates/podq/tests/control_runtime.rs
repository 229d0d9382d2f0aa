//! The control plane over real workqueues: visibility, live attribute changes through
//! the protocol, the runtime's refusals, the default scope, and stats.

use std::sync::atomic::Ordering;

use podq::control::{Client, Reply, Request};
use podq::{CpuSet, Scope, Topology, Workqueue};

mod common;
use common::{control, counter, counting_work, request};

/// Sends a request written as its protocol line; error replies come back as replies.
fn call(client: &mut Client, line: &str) -> Reply {
    client.request(&request(line)).unwrap()
}

#[test]
fn control_drives_real_workqueues() {
    let mut ctl = control();
    // Four possible virtual CPUs (two cores of two threads), of which 0-2 are usable,
    // mapped onto the real ones.
    let topology = Topology::synthetic("1s2c2t")
        .unwrap()
        .restrict(&CpuSet::parse_list("0-2").unwrap())
        .unwrap();
    let rpciod = Workqueue::builder("rt_rpciod")
        .topology(topology.clone())
        .build()
        .unwrap();
    let nfsiod = Workqueue::builder("rt_nfsiod")
        .topology(topology)
        .scope(Scope::Cache)
        .build()
        .unwrap();
    let hidden = Workqueue::builder("rt_hidden").build().unwrap();
    rpciod.expose().unwrap();
    nfsiod.expose().unwrap();
    let err = rpciod.clone().expose().unwrap_err().to_string();
    assert!(err.contains("`rt_rpciod` already exists"), "{err}");

    let list = ctl.client.call(&Request::List).unwrap().queues.unwrap();
    let names: Vec<&str> = list.iter().map(|q| q.name.as_str()).collect();
    assert!(
        names.contains(&"rt_rpciod") && names.contains(&"rt_nfsiod"),
        "{names:?}"
    );
    assert!(
        !names.contains(&hidden.name()),
        "only exposed queues are visible"
    );
    let rpc = list.iter().find(|q| q.name == "rt_rpciod").unwrap();
    assert_eq!(rpc.cpumask, "7", "usable CPUs, four bits wide");
    assert_eq!(rpc.max_active, "1024");
    assert_eq!(
        rpc.affinity_scope,
        format!("default ({})", podq::default_scope())
    );

    // Live changes land in the runtime, and work keeps running across them.
    let ran = counter();
    let work = counting_work(&ran);
    for (attr, value, read_back) in [
        ("affinity_scope", "cpu", "cpu"),
        ("affinity_strict", "1", "1"),
        ("cpumask", "5", "5"),
        ("max_active", "3000", "2048"),
        ("nice", "0", "0"),
    ] {
        let line =
            format!(r#"{{"cmd":"set","queue":"rt_rpciod","attr":"{attr}","value":"{value}"}}"#);
        assert_eq!(
            call(&mut ctl.client, &line),
            Reply::value(read_back.into()),
            "{attr}"
        );
        assert!(rpciod.queue(&work));
        rpciod.flush();
    }
    assert_eq!(ran.load(Ordering::SeqCst), 5);
    let attrs = rpciod.attrs();
    assert_eq!(attrs.scope, Scope::Cpu);
    assert!(attrs.strict);
    assert_eq!(attrs.cpumask.to_list(), "0,2");
    let reply = call(
        &mut ctl.client,
        r#"{"cmd":"set","queue":"rt_rpciod","attr":"cpumask","value":"8"}"#,
    );
    let err = reply.error_text().unwrap();
    assert!(
        err.starts_with("cannot set cpumask of rt_rpciod: cpumask 3 has no CPU usable"),
        "{err}"
    );
    assert_eq!(rpciod.attrs().cpumask.to_list(), "0,2", "unchanged");
    assert_eq!(attrs.max_active, 2048);

    // The runtime's own refusals come back with its reason (above); the parser's
    // before the runtime is asked.
    let reply = call(
        &mut ctl.client,
        r#"{"cmd":"set","queue":"rt_rpciod","attr":"cpumask","value":"10"}"#,
    );
    let err = reply.error_text().unwrap();
    assert!(err.contains("CPU 4 does not exist"), "{err}");

    // Stats carry the queue's own totals.
    let reply = call(&mut ctl.client, r#"{"cmd":"stats","queue":"rt_rpciod"}"#);
    let stats = &reply.stats.unwrap()[0];
    assert_eq!(stats.name, "rt_rpciod");
    if cfg!(feature = "stats") {
        assert_eq!(stats.totals.completed, 5);
    }

    // Hidden, then visible again.
    rpciod.hide();
    let visible = |client: &mut Client, name: &str| {
        let list = client.call(&Request::List).unwrap().queues.unwrap();
        list.iter().any(|q| q.name == name)
    };
    assert!(!visible(&mut ctl.client, "rt_rpciod"));
    rpciod.expose().unwrap();
    assert!(visible(&mut ctl.client, "rt_rpciod"));

    // A dropped queue disappears.
    drop(nfsiod);
    let list = ctl.client.call(&Request::List).unwrap().queues.unwrap();
    assert!(list.iter().all(|q| q.name != "rt_nfsiod"));
    drop(ctl.server);
}

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
    assert_eq!(attrs.min_active, 8, "the default floor, min(max_active, 8)");

    // The runtime's own refusals come back with its reason (above); the parser's
    // before the runtime is asked.
    let reply = call(
        &mut ctl.client,
        r#"{"cmd":"set","queue":"rt_rpciod","attr":"cpumask","value":"10"}"#,
    );
    let err = reply.error_text().unwrap();
    assert!(err.contains("CPU 4 does not exist"), "{err}");

    // min_active: live, checked by the parser (range) and by the runtime (against
    // max_active), and lowered with max_active.
    let set = |client: &mut Client, attr: &str, value: &str| {
        let line =
            format!(r#"{{"cmd":"set","queue":"rt_rpciod","attr":"{attr}","value":"{value}"}}"#);
        call(client, &line)
    };
    assert_eq!(
        set(&mut ctl.client, "min_active", "12"),
        Reply::value("12".into())
    );
    assert_eq!(rpciod.attrs().min_active, 12);
    let reply = set(&mut ctl.client, "min_active", "3000");
    let err = reply.error_text().unwrap();
    assert!(err.contains("invalid value `3000` for min_active"), "{err}");
    assert_eq!(
        set(&mut ctl.client, "max_active", "4"),
        Reply::value("4".into())
    );
    let list = ctl.client.call(&Request::List).unwrap().queues.unwrap();
    let rpc = list.iter().find(|q| q.name == "rt_rpciod").unwrap();
    assert_eq!(
        (rpc.max_active.as_str(), rpc.min_active.as_str()),
        ("4", "4")
    );
    let reply = set(&mut ctl.client, "min_active", "5");
    assert_eq!(
        reply.error_text().unwrap(),
        "cannot set min_active of rt_rpciod: invalid min_active 5: must be in 0..=4 (the max_active)"
    );
    assert_eq!(rpciod.attrs().min_active, 4, "unchanged");

    // Stats carry the queue's own totals.
    let reply = call(&mut ctl.client, r#"{"cmd":"stats","queue":"rt_rpciod"}"#);
    let stats = &reply.stats.unwrap()[0];
    assert_eq!(stats.name, "rt_rpciod");
    if cfg!(feature = "stats") {
        assert_eq!(stats.totals.completed, 5);
    }

    // State dumps, of one queue or of all visible ones.
    let reply = call(&mut ctl.client, r#"{"cmd":"dump","queue":"rt_rpciod"}"#);
    let dumps = reply.dump.unwrap();
    assert_eq!(dumps.len(), 1);
    assert_eq!(dumps[0].name, "rt_rpciod");
    assert_eq!((dumps[0].max_active, dumps[0].min_active), (4, 4));
    assert!(!dumps[0].pools.is_empty());
    let reply = call(&mut ctl.client, r#"{"cmd":"dump"}"#);
    let names: Vec<String> = reply.dump.unwrap().into_iter().map(|d| d.name).collect();
    assert!(names.contains(&"rt_nfsiod".to_owned()), "{names:?}");
    let reply = call(&mut ctl.client, r#"{"cmd":"dump","queue":"nope"}"#);
    assert!(
        reply
            .error_text()
            .unwrap()
            .contains("unknown workqueue `nope`"),
        "{reply:?}"
    );

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

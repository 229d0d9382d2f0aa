//! The process default scope through the control plane: queues on `default` follow it
//! live. (A test binary of its own: it changes process-wide state.)

use std::time::Duration;

use podq::control::{Client, ControlServer, Request};
use podq::{Scope, Workqueue};

#[test]
fn default_scope_changes_follow_live() {
    let dir = tempfile::tempdir().unwrap();
    let server = ControlServer::builder()
        .path(dir.path().join("ctl.sock"))
        .build()
        .unwrap();
    let mut client = Client::connect(server.path(), Duration::from_secs(10)).unwrap();
    let follower = Workqueue::builder("follower").build().unwrap();
    let fixed = Workqueue::builder("fixed")
        .scope(Scope::Numa)
        .build()
        .unwrap();
    follower.expose().unwrap();
    fixed.expose().unwrap();
    let get = |client: &mut Client, queue: &str| {
        let request = Request::Get {
            queue: queue.into(),
            attr: "affinity_scope".into(),
        };
        client.call(&request).unwrap().value.unwrap()
    };
    for scope in ["smt", "system", "cache_shard"] {
        let set = Request::SetDefaultScope {
            value: scope.into(),
        };
        assert_eq!(client.call(&set).unwrap().value.unwrap(), scope);
        assert_eq!(podq::default_scope().name(), scope);
        assert_eq!(get(&mut client, "follower"), format!("default ({scope})"));
        assert_eq!(follower.effective_scope().name(), scope);
        assert_eq!(get(&mut client, "fixed"), "numa");
    }
    let refused = Request::SetDefaultScope {
        value: "default".into(),
    };
    let err = client.call(&refused).unwrap_err().to_string();
    assert!(
        err.contains("`default` cannot be the default scope"),
        "{err}"
    );
    assert_eq!(
        client
            .call(&Request::GetDefaultScope)
            .unwrap()
            .value
            .unwrap(),
        "cache_shard"
    );
}

//! The process default scope through the control plane: queues on `default` follow it
//! live. (A test binary of its own: it changes process-wide state.)

use podq::control::{Client, Request};
use podq::{Scope, Workqueue};

mod common;
use common::{control, get_attr};

#[test]
fn default_scope_changes_follow_live() {
    let mut ctl = control();
    let client = &mut ctl.client;
    let follower = Workqueue::builder("follower").build().unwrap();
    let fixed = Workqueue::builder("fixed")
        .scope(Scope::Numa)
        .build()
        .unwrap();
    follower.expose().unwrap();
    fixed.expose().unwrap();
    let get = |client: &mut Client, queue: &str| {
        let request = get_attr(queue, "affinity_scope");
        client.call(&request).unwrap().value.unwrap()
    };
    for scope in ["smt", "system", "cache_shard"] {
        let set = Request::SetDefaultScope {
            value: scope.into(),
        };
        assert_eq!(client.call(&set).unwrap().value.unwrap(), scope);
        assert_eq!(podq::default_scope().name(), scope);
        assert_eq!(get(client, "follower"), format!("default ({scope})"));
        assert_eq!(follower.effective_scope().name(), scope);
        assert_eq!(get(client, "fixed"), "numa");
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

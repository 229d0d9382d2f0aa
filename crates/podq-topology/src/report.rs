//! `PodsReport`: every scope's pods in one serialisable value, the shape of the shared
//! fixtures' `.pods.json` plus a few fields for people.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, Scope, Topology};

/// The pods of all six concrete scopes of a topology.
///
/// Serialises as `{"cpus": [..], "scopes": {"cpu": [[..]], ..}, ..}`: every pod is a
/// sorted CPU list and pods are ordered by their first CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodsReport {
    /// The usable CPUs, ascending.
    pub cpus: Vec<usize>,
    /// The possible CPUs, ascending.
    pub possible: Vec<usize>,
    /// Pods of each concrete scope.
    pub scopes: BTreeMap<Scope, Vec<Vec<usize>>>,
    /// NUMA node of each pod, per scope, in pod order (`null` for the `system` pod,
    /// as the kernel's -1).
    pub pod_nodes: BTreeMap<Scope, Vec<Option<usize>>>,
    /// The `cache_shard` target size in cores.
    pub shard_size: usize,
    /// The scope `default` resolves to.
    pub default_scope: Scope,
    /// Doubtful input noticed while reading.
    pub warnings: Vec<String>,
}

impl PodsReport {
    /// Computes every scope's pods. `default_scope` is what `default` resolves to
    /// (see [`Scope::process_default`]); it must be concrete.
    pub fn new(topology: &Topology, default_scope: Scope) -> Result<PodsReport, Error> {
        if default_scope == Scope::Default {
            return Err(Error::Invalid {
                what: "default scope",
                reason: "`default` cannot be the default scope".to_owned(),
            });
        }
        let mut scopes = BTreeMap::new();
        let mut pod_nodes = BTreeMap::new();
        for scope in Scope::CONCRETE {
            let layout = topology.pods(scope)?;
            scopes.insert(scope, layout.as_lists());
            pod_nodes.insert(scope, layout.pod_node);
        }
        Ok(PodsReport {
            cpus: topology.usable().iter().collect(),
            possible: topology.possible().iter().collect(),
            scopes,
            pod_nodes,
            shard_size: topology.shard_size(),
            default_scope,
            warnings: topology.warnings().to_vec(),
        })
    }
}

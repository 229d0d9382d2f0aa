//! Every shared sysfs capture gives exactly the pods in its `.pods.json`, read straight
//! from the tarball.

use std::path::PathBuf;

use podq_topology::{PodsReport, Scope, Topology};
use serde_json::Value;

#[path = "support/fixtures_dir.rs"]
mod fixtures_dir;
use fixtures_dir::fixtures_dir;

fn fixtures() -> Vec<(String, PathBuf, PathBuf)> {
    let dir = fixtures_dir();
    let mut found: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let name = path
                .file_name()?
                .to_str()?
                .strip_suffix(".tar.gz")?
                .to_owned();
            let expected = dir.join(format!("{name}.pods.json"));
            Some((name, path, expected))
        })
        .collect();
    found.sort();
    found
}

fn shape_of(report: &PodsReport) -> Value {
    let full = serde_json::to_value(report).unwrap();
    serde_json::json!({"cpus": full["cpus"], "scopes": full["scopes"]})
}

#[test]
fn every_fixture_gives_its_expected_pods() {
    let all = fixtures();
    assert_eq!(
        all.len(),
        24,
        "expected the 24 shared captures, found {}",
        all.len()
    );
    let mut failures = Vec::new();
    for (name, tarball, expected_path) in &all {
        let text = std::fs::read_to_string(expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let expected: Value = serde_json::from_str(&text).unwrap();
        let expected = serde_json::json!({"cpus": expected["cpus"], "scopes": expected["scopes"]});
        let topo = match Topology::from_sysfs(tarball) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let got = shape_of(&PodsReport::new(&topo, Scope::CacheShard).unwrap());
        if got != expected {
            let mut diff = format!("{name}:");
            for key in ["cpu", "smt", "cache", "cache_shard", "numa", "system"] {
                if got["scopes"][key] != expected["scopes"][key] {
                    diff += &format!(
                        "\n  {key}: got {} want {}",
                        got["scopes"][key], expected["scopes"][key]
                    );
                }
            }
            if got["cpus"] != expected["cpus"] {
                diff += &format!("\n  cpus: got {} want {}", got["cpus"], expected["cpus"]);
            }
            failures.push(diff);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

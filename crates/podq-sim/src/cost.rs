//! The cost model: every duration the simulator charges, as a named parameter with its
//! source, and the machine profiles that give them values.
//!
//! Sources are the hardware measurements collected in the project's cost-model
//! reference (`reference/cost-model.md`, cited here by section), and for the CPU time
//! of podq's own path per queue call and per run (`queue_call`, `item_dispatch`),
//! profiles of podq's runtime. None is taken from a published workqueue or NFS result:
//! those are what the simulator predicts.
//! "(estimate)" marks a value with no measurement behind it; sweep those first.

use std::fmt::Write as _;

use serde::Serialize;

/// One parameter's description.
#[derive(Clone, Copy, Debug)]
pub struct ParamInfo {
    /// The name used in `--cost` files and `--print-cost`.
    pub name: &'static str,
    /// Unit of the value.
    pub unit: &'static str,
    /// What it is and where its value comes from.
    pub doc: &'static str,
}

macro_rules! cost_params {
    ($( #[doc = $doc:literal] $name:ident : $unit:literal, )*) => {
        /// The parameters in force for one run. Every field's doc gives its source.
        #[derive(Clone, Debug, PartialEq, Serialize)]
        pub struct CostParams {
            $( #[doc = $doc] pub $name: f64, )*
        }

        /// Every parameter, in declaration order.
        pub const PARAMS: &[ParamInfo] = &[
            $( ParamInfo { name: stringify!($name), unit: $unit, doc: $doc }, )*
        ];

        impl CostParams {
            /// The value of the parameter `name`.
            pub fn get(&self, name: &str) -> Option<f64> {
                match name {
                    $( stringify!($name) => Some(self.$name), )*
                    _ => None,
                }
            }

            /// Sets the parameter `name`; false if there is none of that name.
            pub fn set(&mut self, name: &str, value: f64) -> bool {
                match name {
                    $( stringify!($name) => { self.$name = value; true } )*
                    _ => false,
                }
            }
        }
    };
}

cost_params! {
    /// Cache-line hand-off between SMT siblings (§1.1: 6336Y 8 ns, W-2150B 7 ns; §1.2 Zen4 10 ns).
    c2c_smt: "ns",
    /// Cache-line hand-off between cores sharing an LLC (§1.1 same-socket medians; §1.2 same CCX; §1.3 Grace/Graviton 4).
    c2c_llc: "ns",
    /// Cache-line hand-off between LLCs of one socket (§1.2 cross-CCX medians; equal to `c2c_llc` where a socket has one LLC).
    c2c_cross_llc: "ns",
    /// Cache-line hand-off across sockets (§1.1 cross-socket medians; §1.2).
    c2c_cross_socket: "ns",
    /// Extra per transfer when the line's home node is remote to both CPUs (§1.2, issue #97: cross-socket minus cross-LLC).
    remote_home: "ns",
    /// Lock hand-off beyond two line transfers: hand-off = 2 x c2c(d) + this (§2, derived).
    lock_handoff_extra: "ns",
    /// Extra hand-off time per further spinning waiter, as a multiple of c2c(d) (§2, estimate: 0.9-3.6 us at ~60 spinners).
    lock_spinner_factor: "x c2c",
    /// Futex wake to wakee running, target CPU in a shallow idle state (§3, gVisor futex probe ~2 us).
    wake: "ns",
    /// The waker's own cost of a futex wake system call (estimate, a fraction of `wake`).
    wake_call: "ns",
    /// Extra wake-up latency when the target CPU sat idle long enough for its deepest C-state (§3 intel_idle exit latencies).
    cstate_exit: "ns",
    /// Idle time after which a CPU is in its deepest C-state (§3 intel_idle target residency).
    cstate_after: "ns",
    /// Context switch between threads on one CPU (§3, pipe ping-pong ~1.07 us).
    context_switch: "ns",
    /// How long a woken thread waits behind a running one before it preempts: one base slice (§3 fair.c, 0.75 ms x 4).
    slice: "ns",
    /// Fixed part of a migration: remote enqueue and IPI (§3, estimate ~ one wake-up).
    migration_fixed: "ns",
    /// A waiting thread that gave up its CPU less than this long ago is cache-hot: an idle CPU's newidle balance does not pull it, unless from its SMT sibling (the kernel's `task_hot()`, kernel/sched/fair.c, whose threshold `sysctl_sched_migration_cost` is 0.5 ms: §3 "Migration"). 0, the rule off, in every profile: the model has the rest of the kernel's balancer only in outline, and with the rule alone it reproduces fewer of the measured results (README, "What it predicts").
    cache_hot: "ns",
    /// Cache lines of a thread's hot set refilled after a migration (estimate: one 4 KiB stack page).
    hot_lines: "lines",
    /// Outstanding misses a core overlaps when refilling lines (§4, estimate 6-20).
    mlp: "misses",
    /// Reading a 4 KiB buffer last written by the same CPU or its SMT sibling (§4, derived).
    buf4k_local: "ns",
    /// Reading a 4 KiB buffer last written by another core of the LLC (§4, derived from HITM and MLP).
    buf4k_llc: "ns",
    /// Reading a 4 KiB buffer last written in another LLC of the socket (§4 AMD cross-CCX, derived).
    buf4k_cross_llc: "ns",
    /// Reading a 4 KiB buffer last written on the other socket (§4, derived).
    buf4k_cross_socket: "ns",
    /// DRAM idle latency, local node: charged per object line when a CPU cache refills from its node's list (§4 MLC).
    dram_local: "ns",
    /// DRAM idle latency, remote node (§4 MLC).
    dram_remote: "ns",
    /// Slab fast-path alloc or free into the CPU cache (§5, Brouer: 47 cycles = 11.9 ns).
    slab_fast: "ns",
    /// A remote free's extra beyond one line transfer c2c(d): the locked cmpxchg on the slab (§5, derived).
    slab_remote_extra: "ns",
    /// Hold time of a node's slab list lock (§5, estimate 50-300 ns).
    slab_lock_hold: "ns",
    /// One remote free in this many changes a slab's list and takes the node lock (§5, estimate; objects per slab).
    slab_lock_every: "frees",
    /// Speed of each SMT sibling while both run, relative to running alone (§7, typical 0.6-0.7, not sourced).
    smt_speed: "x",
    /// Creating a worker thread (clone, stack, first schedule; estimate).
    thread_create: "ns",
    /// A wake-up's scan of an LLC for an idle CPU covers llc_cpus × (1 − (u × this / 100)²) of them, u the LLC's busy share over the last `balance_interval`: none from u ≈ 0.85 with 117 (the kernel's `SIS_UTIL`, default on since Linux 6.0, `update_idle_cpu_scan()` in kernel/sched/fair.c with the LLC domain's `imbalance_pct` of 117; a scheduler setting, not a hardware cost; the kernel's utilization is PELT's decaying average, the model's the last interval's). 0, the whole LLC scanned, in every profile (README, "What it predicts").
    idle_scan_pct: "%",
    /// Interval of the periodic load balance between LLCs and nodes (estimate; the kernel's scales with domain size).
    balance_interval: "ns",
    /// Work under a pool lock besides line transfers: list operation and the kick decision (estimate).
    pool_hold: "ns",
    /// A queue call's work outside the lock or claim: pending bit, pwq choice, in-flight count, accounting (measured on podq's runtime, 2-CPU EPYC guest: `podq bench throughput --scopes cpu` with re-queued items runs 270 ns of CPU per run unprofiled; in 7 perf runs a producer's samples outside its ring claim and its yields are 85-103 ns of it, median 96, with one coalesced call beside each accepted one: 90 ns).
    queue_call: "ns",
    /// A worker's own work per item besides the item and its claims: the start and finish of its state, its accounting, its completion (measured on podq's runtime as `queue_call`: a worker's samples outside its claims and yields, 93-110 ns of the 270, median 95).
    item_dispatch: "ns",
    /// Relative spread of every computed duration, uniform in +/- this share (estimate; breaks lock-step).
    jitter: "share",
    /// `completion`'s transport: data rate of the client's RDMA port, which every I/O's payload crosses in turn: one 200 Gb/s HDR/200GbE port, 25 GB/s (datasheet, not in the reference: NVIDIA ConnectX-6 VPI adapter manual, up to 200 Gb/s per port in a PCIe Gen4 x16 slot).
    nic_rate: "GB/s",
    /// `completion`'s transport: one-way adapter latency, charged on the request and on the reply of each I/O; the server answers at once (datasheet, not in the reference: ConnectX-6 manual, sub-600 ns).
    nic_latency: "ns",
}

/// A named machine: a topology shape and its cost parameters.
#[derive(Clone, Debug)]
pub struct Machine {
    /// `--machine` name.
    pub name: &'static str,
    /// What it stands for.
    pub description: &'static str,
    /// Its synthetic topology shape.
    pub shape: &'static str,
    /// Its parameters.
    pub params: CostParams,
}

/// The machine names `--machine` accepts.
pub const MACHINES: [&str; 4] = ["xeon-2s24c", "grace-72c", "xeon-12c", "epyc-2s32c"];

/// Profile A of the reference: 2 x Xeon Gold 6336Y-class Ice Lake, 24 cores, SMT2.
fn xeon_2s24c() -> CostParams {
    CostParams {
        c2c_smt: 8.0,
        c2c_llc: 48.0,
        c2c_cross_llc: 48.0,
        c2c_cross_socket: 106.0,
        remote_home: 58.0,
        lock_handoff_extra: 20.0,
        lock_spinner_factor: 0.0,
        wake: 2_000.0,
        wake_call: 500.0,
        cstate_exit: 170_000.0,
        cstate_after: 600_000.0,
        context_switch: 1_100.0,
        slice: 3_000_000.0,
        migration_fixed: 2_000.0,
        cache_hot: 0.0,
        hot_lines: 64.0,
        mlp: 10.0,
        buf4k_local: 70.0,
        buf4k_llc: 450.0,
        buf4k_cross_llc: 450.0,
        buf4k_cross_socket: 900.0,
        dram_local: 89.0,
        dram_remote: 143.0,
        slab_fast: 12.0,
        slab_remote_extra: 20.0,
        slab_lock_hold: 100.0,
        slab_lock_every: 16.0,
        smt_speed: 0.65,
        thread_create: 25_000.0,
        balance_interval: 4_000_000.0,
        idle_scan_pct: 0.0,
        pool_hold: 40.0,
        queue_call: 90.0,
        item_dispatch: 100.0,
        jitter: 0.05,
        // The client's NIC, not its CPU: every profile carries the same one.
        nic_rate: 25.0,
        nic_latency: 600.0,
    }
}

/// The machine profiles.
pub fn machine(name: &str) -> Option<Machine> {
    let a = xeon_2s24c();
    Some(match name {
        "xeon-2s24c" => Machine {
            name: "xeon-2s24c",
            description:
                "2-socket Intel Xeon (Ice Lake-SP), 24 cores x SMT2 per socket, one LLC per socket",
            shape: "2s24c2t",
            params: a,
        },
        // Profile B: Grace, 72 Neoverse V2 cores on one mesh with one L3.
        "grace-72c" => Machine {
            name: "grace-72c",
            description: "single-socket 72-core Arm (Neoverse V2 class), one LLC, no SMT",
            shape: "1s72c1t",
            params: CostParams {
                c2c_llc: 45.0,
                c2c_cross_llc: 45.0,
                c2c_cross_socket: 139.0,
                remote_home: 0.0,
                wake: 5_000.0,
                cstate_exit: 10_000.0,
                context_switch: 1_500.0,
                migration_fixed: 4_000.0,
                buf4k_local: 50.0,
                buf4k_llc: 200.0,
                buf4k_cross_llc: 200.0,
                dram_local: 130.0,
                dram_remote: 200.0,
                slab_fast: 15.0,
                ..a
            },
        },
        // Profile C: a 12-core single-L3 mesh Xeon (Skylake/Cascade Lake-W class).
        "xeon-12c" => Machine {
            name: "xeon-12c",
            description: "single-socket 12-core Intel Xeon, SMT2, one L3",
            shape: "1s12c2t",
            params: CostParams {
                c2c_smt: 7.0,
                c2c_llc: 43.0,
                c2c_cross_llc: 43.0,
                remote_home: 0.0,
                cstate_exit: 133_000.0,
                buf4k_llc: 400.0,
                buf4k_cross_llc: 400.0,
                dram_local: 85.0,
                ..a
            },
        },
        // Zen4 EPYC, 8-core CCXs (§1.2: 9454/9654 figures; memory from the 9224 notes).
        "epyc-2s32c" => Machine {
            name: "epyc-2s32c",
            description: "2-socket AMD EPYC (Zen4), 4 CCXs x 8 cores x SMT2 per socket",
            shape: "2s4l8c2t",
            params: CostParams {
                c2c_smt: 10.0,
                c2c_llc: 26.0,
                c2c_cross_llc: 103.0,
                c2c_cross_socket: 192.0,
                remote_home: 89.0,
                cstate_exit: 10_000.0,
                buf4k_llc: 190.0,
                buf4k_cross_llc: 700.0,
                buf4k_cross_socket: 1_400.0,
                dram_local: 107.0,
                dram_remote: 200.0,
                ..a
            },
        },
        _ => return None,
    })
}

/// The largest value a parameter of `unit` may take, and the error's words: beyond
/// them a run would only wait or overflow its clock.
fn ceiling(unit: &str) -> Option<(f64, &'static str)> {
    Some(match unit {
        "ns" => (
            crate::MAX_VIRTUAL_NS as f64,
            "must be at most 10 s, the longest simulated run",
        ),
        "lines" | "misses" | "frees" => (1e6, "must be at most a million"),
        "x c2c" | "%" => (1e3, "must be at most 1000"),
        "GB/s" => (1e6, "must be at most 10^6 GB/s"),
        _ => return None,
    })
}

/// A value as written in a cost file, in exponent form when it is huge or tiny.
fn shown(value: f64) -> String {
    if value != 0.0 && !(1e-6..1e12).contains(&value.abs()) {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

/// The name-value pairs of a JSON object, in the order written, repeats kept.
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry()? {
                    pairs.push(pair);
                }
                Ok(Entries(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

/// A bad `--cost` file.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    /// Not a JSON object of numbers.
    #[error("cost file is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The top level is not an object.
    #[error("cost file must be a JSON object of parameter names to numbers")]
    NotObject,
    /// A parameter given twice.
    #[error("cost file: parameter `{0}` is given twice")]
    Twice(String),
    /// A name that is no parameter.
    #[error("cost file: unknown parameter `{0}` (see `podq sim --print-cost`)")]
    Unknown(String),
    /// A value that is not a number.
    #[error("cost file: parameter `{name}` is not a number: {value}")]
    NotNumber {
        /// The parameter.
        name: String,
        /// What was there.
        value: String,
    },
    /// A negative or non-finite value, or one out of its range.
    #[error("cost file: parameter `{name}` = {} is out of range: {reason}", shown(*.value))]
    OutOfRange {
        /// The parameter.
        name: String,
        /// Its value.
        value: f64,
        /// Why.
        reason: &'static str,
    },
    /// A file that sets nothing and was meant to.
    #[error("cost file: parameter `{0}` is missing (a full parameter set was asked for)")]
    Missing(String),
}

impl CostParams {
    /// Applies the overrides of a `--cost` JSON object: a subset of parameters, or with
    /// `complete` every one of them (a missing one is then an error).
    pub fn apply_json(&mut self, text: &str, complete: bool) -> Result<(), CostError> {
        // Read as pairs, as written: a JSON object would keep the last of repeated names.
        // Valid JSON of another type than an object is a data error.
        let Entries(entries) = serde_json::from_str(text).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => CostError::NotObject,
            _ => CostError::Json(e),
        })?;
        let mut seen: Vec<&str> = Vec::new();
        for (name, v) in &entries {
            if seen.contains(&name.as_str()) {
                return Err(CostError::Twice(name.clone()));
            }
            seen.push(name);
            if self.get(name).is_none() {
                return Err(CostError::Unknown(name.clone()));
            }
            let number = v.as_f64().ok_or_else(|| CostError::NotNumber {
                name: name.clone(),
                value: v.to_string(),
            })?;
            self.set(name, number);
        }
        if complete {
            if let Some(p) = PARAMS.iter().find(|p| !seen.contains(&p.name)) {
                return Err(CostError::Missing(p.name.to_owned()));
            }
        }
        self.validate()
    }

    /// Checks every value: finite, not negative; shares and speeds within their range.
    pub fn validate(&self) -> Result<(), CostError> {
        for p in PARAMS {
            let value = self.get(p.name).unwrap_or(f64::NAN);
            let bad = |reason| CostError::OutOfRange {
                name: p.name.to_owned(),
                value,
                reason,
            };
            if !value.is_finite() {
                return Err(bad("not a finite number"));
            }
            if value < 0.0 {
                return Err(bad("negative"));
            }
            if let Some((most, reason)) = ceiling(p.unit) {
                if value > most {
                    return Err(bad(reason));
                }
            }
            match p.name {
                "smt_speed" if value == 0.0 || value > 1.0 => return Err(bad("must be in (0, 1]")),
                "jitter" if value >= 1.0 => return Err(bad("must be below 1")),
                "idle_scan_pct" if value > 0.0 && value < 100.0 => {
                    return Err(bad("must be 0 (the whole LLC) or at least 100"))
                }
                "nic_rate" if value < 1e-3 => return Err(bad("must be at least 0.001 GB/s")),
                "mlp" | "slab_lock_every" | "balance_interval" | "slice" if value < 1.0 => {
                    return Err(bad("must be at least 1"))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The parameters as a table: name, value, unit, source.
    pub fn table(&self) -> String {
        let width = PARAMS.iter().map(|p| p.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for p in PARAMS {
            let value = self.get(p.name).unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "{:width$}  {:>12}  {:6}  {}",
                p.name,
                format_value(value),
                p.unit,
                p.doc
            );
        }
        out
    }
}

fn format_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_machine_is_valid_and_named() {
        for name in MACHINES {
            let m = machine(name).expect(name);
            assert_eq!(m.name, name);
            m.params.validate().unwrap();
            podq_topology::Topology::synthetic(m.shape).unwrap();
        }
        assert!(machine("pdp-11").is_none());
    }

    #[test]
    fn every_parameter_documents_its_unit_and_source() {
        assert_eq!(PARAMS.len(), 37);
        for p in PARAMS {
            assert!(!p.unit.is_empty() && p.doc.len() > 20, "{}", p.name);
        }
    }

    #[test]
    fn overrides_and_their_errors() {
        let mut p = xeon_2s24c();
        p.apply_json(r#"{"wake": 3000, "smt_speed": 0.5}"#, false)
            .unwrap();
        assert_eq!(p.wake, 3000.0);
        assert_eq!(p.smt_speed, 0.5);
        let err = |text: &str, complete| {
            xeon_2s24c()
                .apply_json(text, complete)
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"wake": -1}"#, false).contains("`wake` = -1 is out of range: negative"));
        assert!(err(r#"{"wake": "fast"}"#, false).contains("`wake` is not a number"));
        assert!(err(r#"{"wakeup": 1}"#, false).contains("unknown parameter `wakeup`"));
        assert!(err(r#"[1]"#, false).contains("JSON object"));
        assert!(err(r#"{"smt_speed": 1.5}"#, false).contains("(0, 1]"));
        assert!(err(r#"{"nic_rate": 0}"#, false).contains("at least 0.001 GB/s"));
        assert!(err(r#"{"wake": 1}"#, true).contains("`c2c_smt` is missing"));
        assert!(err("{", false).contains("not valid JSON"));
        assert!(err(r#"{"wake": 1, "wake": 2}"#, false).contains("`wake` is given twice"));
        assert!(err(r#"{"wake": 1e308}"#, false)
            .contains("`wake` = 1e308 is out of range: must be at most 10 s"));
        assert!(err(r#"{"hot_lines": 1e12}"#, false).contains("at most a million"));
    }

    #[test]
    fn the_table_lists_every_parameter() {
        let t = xeon_2s24c().table();
        assert_eq!(t.lines().count(), PARAMS.len());
        assert!(t.contains("c2c_cross_socket"));
        assert!(t
            .lines()
            .any(|l| l.starts_with("wake ") && l.contains(" 2000 ")));
    }
}

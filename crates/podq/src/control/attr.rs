//! Attribute names and value strings, exactly as the kernel's per-workqueue sysfs files
//! (`/sys/bus/workqueue/devices/<wq>/`) read and write them. Pure: no I/O, no globals.
//!
//! | attribute | read | write |
//! |---|---|---|
//! | `affinity_scope` | scope name; `default (<effective>)` for `default`, `auto (<chosen>)` for `auto` | one scope name (or `auto`), exact, case-sensitive |
//! | `affinity_strict` | `0` / `1` | an integer (`kstrtoint` rules); non-zero means 1 |
//! | `cpumask` | hex bitmap, 32-bit groups, most significant first, as `%*pb` | the same form |
//! | `max_active` | the requested value | a decimal integer > 0, clamped to [1, 2048]; enforced per NUMA node (see below) |
//! | `min_active` | the requested value | a decimal integer in [0, `max_active`]; podq's own (the kernel has no such file, only `workqueue_set_min_active`) |
//! | `nice` | the value | a decimal integer in [-20, 19] |
//!
//! Read values are the file's content without its trailing newline; written values may
//! end with one newline, as `echo` leaves it. Departures from the kernel, each so that a
//! typo is an error rather than a silently different value: `max_active` and `nice` are
//! parsed as whole decimal integers (the kernel's `sscanf("%d")` ignores trailing text),
//! and a `cpumask` that selects no CPU is refused (the kernel silently widens it to the
//! whole unbound cpumask).
//!
//! `max_active` is the kernel's: each NUMA node of the workqueue's cpumask may run a
//! share proportional to its CPUs, rounded up and never below `min(max_active, 8)`
//! (`WQ_DFL_MIN_ACTIVE`), so the shares can add up to more than the value written:
//! `max_active` 3 on a 2-node topology lets up to 6 items run, 3 on each node.

use std::fmt;
use std::str::FromStr;

use crate::topology::{CpuSet, Scope};

use super::ControlError as Error;

/// The kernel's `WQ_MAX_ACTIVE`: the largest `max_active`; larger writes are clamped.
pub const MAX_ACTIVE_LIMIT: usize = 2048;
/// The lowest nice value (`MIN_NICE`).
pub const MIN_NICE: i32 = -20;
/// The highest nice value (`MAX_NICE`).
pub const MAX_NICE: i32 = 19;

/// A workqueue attribute that can be read and written through the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attr {
    /// `affinity_scope`: how big the pods are.
    AffinityScope,
    /// `affinity_strict`: whether workers are pinned to their pod.
    AffinityStrict,
    /// `cpumask`: the CPUs the workqueue may use.
    Cpumask,
    /// `max_active`: the most items of the workqueue running at once on each NUMA
    /// node's share (see the module docs: 3 on 2 nodes lets up to 6 run).
    MaxActive,
    /// `min_active`: the per-node floor under the node shares of `max_active`.
    MinActive,
    /// `nice`: the workers' nice value.
    Nice,
}

impl Attr {
    /// Every attribute, in the order `list` shows them.
    pub const ALL: [Attr; 6] = [
        Attr::AffinityScope,
        Attr::AffinityStrict,
        Attr::Cpumask,
        Attr::MaxActive,
        Attr::MinActive,
        Attr::Nice,
    ];

    /// The sysfs file name.
    pub const fn name(self) -> &'static str {
        match self {
            Attr::AffinityScope => "affinity_scope",
            Attr::AffinityStrict => "affinity_strict",
            Attr::Cpumask => "cpumask",
            Attr::MaxActive => "max_active",
            Attr::MinActive => "min_active",
            Attr::Nice => "nice",
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Attr {
    type Err = Error;

    /// Exact match of the sysfs file name.
    fn from_str(text: &str) -> Result<Attr, Error> {
        Attr::ALL
            .into_iter()
            .find(|a| a.name() == text)
            .ok_or_else(|| Error::UnknownAttr {
                name: text.to_owned(),
            })
    }
}

/// A parsed attribute value, ready to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrValue {
    /// A new `affinity_scope`.
    AffinityScope(Scope),
    /// A new `affinity_strict`.
    AffinityStrict(bool),
    /// A new `cpumask` (never empty).
    Cpumask(CpuSet),
    /// A new `max_active`, already clamped to [1, 2048].
    MaxActive(usize),
    /// A new `min_active`, at most 2048 (the workqueue checks it against its
    /// `max_active`).
    MinActive(usize),
    /// A new `nice`, in [-20, 19].
    Nice(i32),
}

impl AttrValue {
    /// Which attribute this value is for.
    pub fn attr(&self) -> Attr {
        match self {
            AttrValue::AffinityScope(_) => Attr::AffinityScope,
            AttrValue::AffinityStrict(_) => Attr::AffinityStrict,
            AttrValue::Cpumask(_) => Attr::Cpumask,
            AttrValue::MaxActive(_) => Attr::MaxActive,
            AttrValue::MinActive(_) => Attr::MinActive,
            AttrValue::Nice(_) => Attr::Nice,
        }
    }
}

/// A workqueue's requested attributes, as the control plane shows them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueAttrs {
    /// The requested scope (may be `Default`).
    pub scope: Scope,
    /// The scope in force: `scope` with `Default` resolved to the process default.
    pub effective_scope: Scope,
    /// Whether workers are pinned to their pod.
    pub strict: bool,
    /// The requested cpumask.
    pub cpumask: CpuSet,
    /// The workers' nice value.
    pub nice: i32,
    /// The requested `max_active`.
    pub max_active: usize,
    /// The requested `min_active`.
    pub min_active: usize,
    /// Whether the workqueue is ordered (its `max_active` and `min_active` are then
    /// read-only).
    pub ordered: bool,
}

/// Parses a value written to `attr`, with the kernel's rules (see the module docs).
/// `nr_cpu_ids` (the highest possible CPU plus one) bounds the cpumask, as
/// `cpumask_parse` does.
pub fn parse_value(attr: Attr, text: &str, nr_cpu_ids: usize) -> Result<AttrValue, Error> {
    let invalid = |reason: String| Error::InvalidValue {
        attr: attr.name(),
        value: text.to_owned(),
        reason,
    };
    let body = text.strip_suffix('\n').unwrap_or(text);
    match attr {
        Attr::AffinityScope => text
            .parse::<Scope>()
            .map(AttrValue::AffinityScope)
            .map_err(|_| {
                invalid(
                    "expected one of default, cpu, smt, cache, cache_shard, numa, system, auto"
                        .into(),
                )
            }),
        Attr::AffinityStrict => parse_kstrtoint(body)
            .map(|v| AttrValue::AffinityStrict(v != 0))
            .ok_or_else(|| invalid("expected an integer (0 or 1)".into())),
        Attr::Cpumask => parse_cpumask(body, nr_cpu_ids)
            .map(AttrValue::Cpumask)
            .map_err(invalid),
        Attr::MaxActive => match body.parse::<i64>() {
            Ok(v) if v > 0 => Ok(AttrValue::MaxActive(
                usize::try_from(v).map_or(MAX_ACTIVE_LIMIT, |v| v.min(MAX_ACTIVE_LIMIT)),
            )),
            Ok(_) => Err(invalid("must be greater than 0".into())),
            Err(_) => Err(invalid("expected a decimal integer greater than 0".into())),
        },
        Attr::MinActive => {
            if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid(format!(
                    "expected a decimal integer in [0, {MAX_ACTIVE_LIMIT}]"
                )));
            }
            match body.parse::<usize>() {
                Ok(v) if v <= MAX_ACTIVE_LIMIT => Ok(AttrValue::MinActive(v)),
                _ => Err(invalid(format!(
                    "must be at most {MAX_ACTIVE_LIMIT} (and at most the workqueue's max_active)"
                ))),
            }
        }
        Attr::Nice => match body.parse::<i32>() {
            Ok(v) if (MIN_NICE..=MAX_NICE).contains(&v) => Ok(AttrValue::Nice(v)),
            _ => Err(invalid(format!(
                "expected a decimal integer in [{MIN_NICE}, {MAX_NICE}]"
            ))),
        },
    }
}

/// Parses a value for the process-wide default scope: a concrete scope name (one
/// trailing newline accepted); `default` is refused, as the kernel refuses it for
/// `workqueue.default_affinity_scope`.
pub fn parse_default_scope(text: &str) -> Result<Scope, Error> {
    Scope::parse_default(text).map_err(|e| Error::InvalidValue {
        attr: "default_affinity_scope",
        value: text.to_owned(),
        reason: match e {
            crate::topology::Error::Scope { reason, .. } => reason,
            other => other.to_string(),
        },
    })
}

/// The string the kernel's sysfs file for `attr` reads (without the trailing newline).
pub fn format_value(attr: Attr, attrs: &QueueAttrs, nr_cpu_ids: usize) -> String {
    match attr {
        Attr::AffinityScope => match attrs.scope {
            Scope::Default => format!("default ({})", attrs.effective_scope),
            Scope::Auto => format!("auto ({})", attrs.effective_scope),
            scope => scope.name().to_owned(),
        },
        Attr::AffinityStrict => u8::from(attrs.strict).to_string(),
        Attr::Cpumask => format_cpumask(&attrs.cpumask, nr_cpu_ids),
        Attr::MaxActive => attrs.max_active.to_string(),
        Attr::MinActive => attrs.min_active.to_string(),
        Attr::Nice => attrs.nice.to_string(),
    }
}

/// Formats a cpumask as the kernel's `%*pb` with `nr_cpu_ids` bits: 32-bit groups of
/// hex, most significant first, the first group only as wide as its bits need
/// (`3` for two CPUs, `ffff` for 16, `ff,ffffffff` for 40).
pub fn format_cpumask(mask: &CpuSet, nr_cpu_ids: usize) -> String {
    let nbits = nr_cpu_ids.max(mask.last().map_or(1, |c| c + 1));
    let groups = nbits.div_ceil(32);
    let mut out = String::with_capacity(groups * 9);
    for g in (0..groups).rev() {
        let width = if g == groups - 1 {
            (nbits - g * 32).div_ceil(4)
        } else {
            8
        };
        let word = (0..32)
            .filter(|bit| mask.contains(g * 32 + bit))
            .fold(0u32, |w, bit| w | 1 << bit);
        if g != groups - 1 {
            out.push(',');
        }
        out.push_str(&format!("{word:0width$x}"));
    }
    out
}

/// Parses a cpumask as `cpumask_parse` does: comma-separated groups of at most 8 hex
/// digits, most significant first; no bit at or above `nr_cpu_ids`. An empty result is
/// refused (see the module docs).
pub fn parse_cpumask(text: &str, nr_cpu_ids: usize) -> Result<CpuSet, String> {
    if text.is_empty() {
        return Err("expected a hex bitmap such as `3` or `ffffffff,ffffffff`".into());
    }
    let mut mask = CpuSet::new();
    let groups: Vec<&str> = text.split(',').collect();
    for (index_from_low, group) in groups.iter().rev().enumerate() {
        if group.is_empty() || group.len() > 8 {
            return Err(format!(
                "group `{group}` must have 1 to 8 hex digits (32 bits)"
            ));
        }
        let word = u32::from_str_radix(group, 16)
            .ok()
            .filter(|_| group.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| format!("`{group}` is not hexadecimal"))?;
        for bit in 0..32 {
            if word & (1 << bit) != 0 {
                let cpu = index_from_low * 32 + bit;
                if cpu >= nr_cpu_ids {
                    return Err(format!(
                        "CPU {cpu} does not exist (the last possible CPU is {})",
                        nr_cpu_ids.saturating_sub(1)
                    ));
                }
                mask.insert(cpu);
            }
        }
    }
    if mask.is_empty() {
        return Err("the mask selects no CPU".into());
    }
    Ok(mask)
}

/// The kernel's `kstrtoint(s, 0, ..)`: optional sign, then `0x` hex, `0` octal or
/// decimal; the whole text must be consumed and fit an `i32`.
fn parse_kstrtoint(text: &str) -> Option<i32> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, digits) = if let Some(hex) = unsigned
        .strip_prefix("0x")
        .or_else(|| unsigned.strip_prefix("0X"))
        .filter(|h| h.bytes().next().is_some_and(|b| b.is_ascii_hexdigit()))
    {
        (16, hex)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') {
        (8, &unsigned[1..])
    } else {
        (10, unsigned)
    };
    if digits.is_empty() || !digits.bytes().all(|b| (b as char).is_digit(radix)) {
        return None;
    }
    let magnitude = i64::from_str_radix(digits, radix).ok()?;
    i32::try_from(if negative { -magnitude } else { magnitude }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attrs() -> QueueAttrs {
        QueueAttrs {
            scope: Scope::Default,
            effective_scope: Scope::CacheShard,
            strict: false,
            cpumask: CpuSet::first_n(2),
            nice: 0,
            max_active: 256,
            min_active: 8,
            ordered: false,
        }
    }

    #[test]
    fn reads_match_sysfs() {
        let mut a = attrs();
        assert_eq!(
            format_value(Attr::AffinityScope, &a, 2),
            "default (cache_shard)"
        );
        assert_eq!(format_value(Attr::AffinityStrict, &a, 2), "0");
        assert_eq!(format_value(Attr::Cpumask, &a, 2), "3");
        assert_eq!(format_value(Attr::MaxActive, &a, 2), "256");
        assert_eq!(format_value(Attr::Nice, &a, 2), "0");
        a.scope = Scope::Numa;
        a.strict = true;
        a.nice = -5;
        assert_eq!(format_value(Attr::AffinityScope, &a, 2), "numa");
        a.scope = Scope::Auto;
        a.effective_scope = Scope::Smt;
        assert_eq!(format_value(Attr::AffinityScope, &a, 2), "auto (smt)");
        assert_eq!(format_value(Attr::AffinityStrict, &a, 2), "1");
        assert_eq!(format_value(Attr::Nice, &a, 2), "-5");
    }

    #[test]
    fn cpumask_format_is_kernel_pb() {
        assert_eq!(format_cpumask(&CpuSet::first_n(2), 2), "3");
        assert_eq!(format_cpumask(&CpuSet::single(0), 2), "1");
        assert_eq!(format_cpumask(&CpuSet::first_n(16), 16), "ffff");
        assert_eq!(format_cpumask(&CpuSet::first_n(4), 16), "000f");
        assert_eq!(format_cpumask(&CpuSet::first_n(32), 32), "ffffffff");
        assert_eq!(format_cpumask(&CpuSet::first_n(40), 40), "ff,ffffffff");
        assert_eq!(format_cpumask(&CpuSet::single(0), 64), "00000000,00000001");
        assert_eq!(format_cpumask(&CpuSet::single(63), 64), "80000000,00000000");
    }

    #[test]
    fn cpumask_parse_rules() {
        assert_eq!(parse_cpumask("3", 2).unwrap(), CpuSet::first_n(2));
        assert_eq!(parse_cpumask("0003", 2).unwrap(), CpuSet::first_n(2));
        assert_eq!(parse_cpumask("1,00000000", 64).unwrap(), CpuSet::single(32));
        assert_eq!(parse_cpumask("FF", 8).unwrap(), CpuSet::first_n(8));
        for (bad, needle) in [
            ("", "hex bitmap"),
            ("4", "CPU 2 does not exist"),
            ("0", "selects no CPU"),
            ("00000000,0", "selects no CPU"),
            ("xyz", "not hexadecimal"),
            ("+3", "not hexadecimal"),
            ("0x3", "not hexadecimal"),
            ("3,", "1 to 8 hex digits"),
            ("123456789", "1 to 8 hex digits"),
            (" 3", "not hexadecimal"),
        ] {
            let err = parse_cpumask(bad, 2).unwrap_err();
            assert!(err.contains(needle), "{bad:?}: {err}");
        }
    }

    #[test]
    fn writes_follow_kernel_rules() {
        let p = |attr, text: &str| parse_value(attr, text, 2);
        assert_eq!(
            p(Attr::AffinityScope, "numa\n").unwrap(),
            AttrValue::AffinityScope(Scope::Numa)
        );
        assert_eq!(
            p(Attr::AffinityScope, "default").unwrap(),
            AttrValue::AffinityScope(Scope::Default)
        );
        assert_eq!(
            p(Attr::AffinityScope, "auto\n").unwrap(),
            AttrValue::AffinityScope(Scope::Auto)
        );
        for bad in [
            "cache_shard\n\n",
            "Cache",
            "cach",
            "",
            "default (numa)",
            "auto (smt)",
        ] {
            let err = p(Attr::AffinityScope, bad).unwrap_err().to_string();
            assert!(
                err.contains("affinity_scope") && err.contains("cache_shard"),
                "{err}"
            );
        }
        for (text, want) in [
            ("0", false),
            ("1", true),
            ("7", true),
            ("-1", true),
            ("0x0", false),
            ("0x10", true),
            ("010", true),
            ("00", false),
            ("+0\n", false),
        ] {
            assert_eq!(
                p(Attr::AffinityStrict, text).unwrap(),
                AttrValue::AffinityStrict(want),
                "{text:?}"
            );
        }
        for bad in ["", "yes", "1.0", "08", "0x", "1 ", "99999999999", "-"] {
            assert!(p(Attr::AffinityStrict, bad).is_err(), "{bad:?}");
        }
        assert_eq!(p(Attr::MaxActive, "1").unwrap(), AttrValue::MaxActive(1));
        assert_eq!(
            p(Attr::MaxActive, "2048\n").unwrap(),
            AttrValue::MaxActive(2048)
        );
        assert_eq!(
            p(Attr::MaxActive, "5000").unwrap(),
            AttrValue::MaxActive(MAX_ACTIVE_LIMIT)
        );
        for bad in ["0", "-3", "", "ten", "12abc", "99999999999999999999999"] {
            let err = p(Attr::MaxActive, bad).unwrap_err().to_string();
            assert!(
                err.contains("max_active") && err.contains(&format!("`{bad}`")),
                "{err}"
            );
        }
        assert_eq!(p(Attr::MinActive, "0").unwrap(), AttrValue::MinActive(0));
        assert_eq!(
            p(Attr::MinActive, "2048\n").unwrap(),
            AttrValue::MinActive(2048)
        );
        for bad in ["2049", "99999999999999999999999"] {
            let err = p(Attr::MinActive, bad).unwrap_err().to_string();
            assert!(
                err.contains("min_active") && err.contains("at most 2048"),
                "{err}"
            );
        }
        for bad in ["-1", "", "eight", "8 ", "+8", "0x8"] {
            let err = p(Attr::MinActive, bad).unwrap_err().to_string();
            assert!(
                err.contains("min_active") && err.contains("[0, 2048]"),
                "{bad:?}: {err}"
            );
        }
        assert_eq!(p(Attr::Nice, "-20").unwrap(), AttrValue::Nice(-20));
        assert_eq!(p(Attr::Nice, "19\n").unwrap(), AttrValue::Nice(19));
        for bad in ["-21", "20", "", "x", "1\n\n"] {
            let err = p(Attr::Nice, bad).unwrap_err().to_string();
            assert!(err.contains("[-20, 19]"), "{err}");
        }
        assert_eq!(
            p(Attr::Cpumask, "1\n").unwrap(),
            AttrValue::Cpumask(CpuSet::single(0))
        );
    }

    #[test]
    fn attr_names() {
        for attr in Attr::ALL {
            assert_eq!(attr.name().parse::<Attr>().unwrap(), attr);
        }
        let err = "cpu_mask".parse::<Attr>().unwrap_err().to_string();
        assert!(
            err.contains("`cpu_mask`") && err.contains("affinity_scope"),
            "{err}"
        );
    }

    #[test]
    fn default_scope_refuses_default() {
        assert_eq!(parse_default_scope("smt\n").unwrap(), Scope::Smt);
        let err = parse_default_scope("default").unwrap_err().to_string();
        assert!(err.contains("`default`"), "{err}");
        assert!(parse_default_scope("bogus").is_err());
    }

    proptest! {
        #[test]
        fn cpumask_round_trips(cpus in proptest::collection::btree_set(0usize..200, 1..40),
                               extra in 0usize..100) {
            let mask: CpuSet = cpus.iter().copied().collect();
            let nr = mask.last().unwrap() + 1 + extra;
            let text = format_cpumask(&mask, nr);
            prop_assert_eq!(parse_cpumask(&text, nr).unwrap(), mask);
        }

        #[test]
        fn formatted_values_parse_back(strict: bool, nice in MIN_NICE..=MAX_NICE,
                                       max_active in 1usize..=MAX_ACTIVE_LIMIT,
                                       min_share in 0usize..=100,
                                       scope_ix in 0usize..6) {
            let min_active = max_active * min_share / 100;
            let a = QueueAttrs { scope: Scope::CONCRETE[scope_ix], strict, nice, max_active,
                                 min_active, ..attrs() };
            for attr in Attr::ALL {
                let text = format_value(attr, &a, 2);
                let value = parse_value(attr, &text, 2).unwrap();
                let back = match value {
                    AttrValue::AffinityScope(s) => QueueAttrs { scope: s, ..a.clone() },
                    AttrValue::AffinityStrict(s) => QueueAttrs { strict: s, ..a.clone() },
                    AttrValue::Cpumask(m) => QueueAttrs { cpumask: m, ..a.clone() },
                    AttrValue::MaxActive(m) => QueueAttrs { max_active: m, ..a.clone() },
                    AttrValue::MinActive(m) => QueueAttrs { min_active: m, ..a.clone() },
                    AttrValue::Nice(n) => QueueAttrs { nice: n, ..a.clone() },
                };
                prop_assert_eq!(&back, &a);
            }
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,40}", nr in 1usize..300) {
            for attr in Attr::ALL {
                if let Err(e) = parse_value(attr, &text, nr) {
                    prop_assert!(e.to_string().contains(attr.name()));
                }
            }
        }
    }
}

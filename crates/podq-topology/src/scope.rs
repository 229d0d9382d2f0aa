//! Affinity scopes and their names, exactly as the kernel's sysfs spells them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The environment variable naming the process-wide default scope.
pub const DEFAULT_SCOPE_ENV: &str = "PODQ_DEFAULT_AFFINITY_SCOPE";

/// How big the pods of a workqueue are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Follow the process-wide default scope (resolved each time pods are computed).
    Default,
    /// One pod per CPU.
    Cpu,
    /// One pod per SMT sibling group (physical core).
    Smt,
    /// One pod per last-level cache.
    Cache,
    /// Sub-LLC shards of about `shard_size` cores.
    CacheShard,
    /// One pod per NUMA node.
    Numa,
    /// One pod covering every CPU.
    System,
    /// Chosen by the workqueue itself from what it measures (`podq::policy::auto`): one
    /// of the concrete scopes at any time, switched live. Not a kernel scope.
    Auto,
}

impl Scope {
    /// The concrete scopes, smallest pods first, in the kernel's enum order.
    pub const CONCRETE: [Scope; 6] = [
        Scope::Cpu,
        Scope::Smt,
        Scope::Cache,
        Scope::CacheShard,
        Scope::Numa,
        Scope::System,
    ];

    /// The scope used when neither the caller nor the environment names one.
    pub const BUILTIN_DEFAULT: Scope = Scope::CacheShard;

    /// The sysfs name (`cache_shard`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Scope::Default => "default",
            Scope::Cpu => "cpu",
            Scope::Smt => "smt",
            Scope::Cache => "cache",
            Scope::CacheShard => "cache_shard",
            Scope::Numa => "numa",
            Scope::System => "system",
            Scope::Auto => "auto",
        }
    }

    /// Whether this is one of [`Scope::CONCRETE`] (not `default` or `auto`).
    pub fn is_concrete(self) -> bool {
        !matches!(self, Scope::Default | Scope::Auto)
    }

    /// Resolves `Default` to `default` (which may be `auto`); every other scope, `auto`
    /// included, resolves to itself: which concrete scope `auto` uses is its controller's
    /// choice, not a name's.
    pub fn resolve(self, default: Scope) -> Scope {
        match self {
            Scope::Default => default,
            concrete => concrete,
        }
    }

    /// Parses a value for the process-wide default: like [`FromStr`], but `default`
    /// itself is refused, as the kernel's `default_affinity_scope` parameter does.
    /// `auto` is accepted: workqueues on `default` then choose their scope themselves.
    pub fn parse_default(text: &str) -> Result<Scope, Error> {
        match text.parse()? {
            Scope::Default => Err(Error::Scope {
                text: text.to_owned(),
                reason: "`default` cannot be the default scope".to_owned(),
            }),
            scope => Ok(scope),
        }
    }

    /// The process-wide default scope: [`DEFAULT_SCOPE_ENV`] when set, else
    /// `cache_shard`. A bad value is an error naming the variable, not a silent default.
    pub fn process_default() -> Result<Scope, Error> {
        match std::env::var(DEFAULT_SCOPE_ENV) {
            Ok(value) => Scope::default_from_env_value(Some(&value)),
            Err(std::env::VarError::NotPresent) => Scope::default_from_env_value(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Env {
                var: DEFAULT_SCOPE_ENV,
                reason: "value is not valid Unicode".to_owned(),
            }),
        }
    }

    /// The process default from the value of [`DEFAULT_SCOPE_ENV`] (`None` when unset):
    /// `cache_shard` when unset, an error naming the variable when the value is bad.
    pub fn default_from_env_value(value: Option<&str>) -> Result<Scope, Error> {
        match value {
            None => Ok(Scope::BUILTIN_DEFAULT),
            Some(text) => Scope::parse_default(text).map_err(|e| Error::Env {
                var: DEFAULT_SCOPE_ENV,
                reason: e.to_string(),
            }),
        }
    }
}

impl FromStr for Scope {
    type Err = Error;

    /// Exact, case-sensitive match; one trailing newline is accepted (as sysfs writes
    /// have). No prefix matching: `cache_shard` never parses as `cache`.
    fn from_str(text: &str) -> Result<Scope, Error> {
        let name = text.strip_suffix('\n').unwrap_or(text);
        [Scope::Default]
            .into_iter()
            .chain(Scope::CONCRETE)
            .chain([Scope::Auto])
            .find(|s| s.name() == name)
            .ok_or_else(|| Error::Scope {
                text: text.to_owned(),
                reason: "expected one of default, cpu, smt, cache, cache_shard, numa, system, auto"
                    .to_owned(),
            })
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_exactly() {
        for scope in Scope::CONCRETE {
            assert_eq!(scope.name().parse::<Scope>().unwrap(), scope);
            assert_eq!(format!("{scope}\n").parse::<Scope>().unwrap(), scope);
        }
        assert_eq!("default".parse::<Scope>().unwrap(), Scope::Default);
        assert_eq!("auto\n".parse::<Scope>().unwrap(), Scope::Auto);
        assert_eq!(Scope::Auto.to_string(), "auto");
        assert!(!Scope::Auto.is_concrete() && !Scope::Default.is_concrete());
        assert!(Scope::CONCRETE.iter().all(|s| s.is_concrete()));
        for bad in [
            "Auto",
            "automatic",
            "cach",
            "cache_",
            "Cache",
            "cache_shard\n\n",
            " smt",
            "",
            "cache_sharded",
        ] {
            let err = bad.parse::<Scope>().unwrap_err().to_string();
            // Control characters are quoted escaped.
            assert!(
                err.contains(&format!("`{}`", bad.escape_default())),
                "{err}"
            );
        }
    }

    #[test]
    fn default_scope_rules() {
        assert_eq!(
            Scope::default_from_env_value(None).unwrap(),
            Scope::CacheShard
        );
        assert_eq!(
            Scope::default_from_env_value(Some("numa")).unwrap(),
            Scope::Numa
        );
        let err = Scope::default_from_env_value(Some("default"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(DEFAULT_SCOPE_ENV), "{err}");
        assert!(Scope::default_from_env_value(Some("bogus")).is_err());
        assert_eq!(
            Scope::default_from_env_value(Some("auto")).unwrap(),
            Scope::Auto
        );
        assert_eq!(Scope::Default.resolve(Scope::Auto), Scope::Auto);
        assert_eq!(Scope::Auto.resolve(Scope::Smt), Scope::Auto);
        assert_eq!(Scope::Default.resolve(Scope::Smt), Scope::Smt);
        assert_eq!(Scope::Cpu.resolve(Scope::Smt), Scope::Cpu);
    }
}

//! The process-wide parameters, named and written as the kernel's workqueue module
//! parameters (`/sys/module/workqueue/parameters/`). Pure: no I/O, no globals.
//!
//! | parameter | read | write |
//! |---|---|---|
//! | `cpu_intensive_thresh_us` | the CPU-intensive threshold in µs; `0` while the rule is off | a decimal integer: `0` turns the rule off, else at least 1000 (1 ms) |
//! | `watchdog_thresh` | the stall threshold in seconds (a decimal fraction if set in-process to one); `0` while off | a decimal integer: `0` turns stall detection off, as in the kernel |
//!
//! Both accept at most a day, and one trailing newline; `0` turns the check off, as in
//! the kernel. Departure: the kernel's `cpu_intensive_thresh_us` has no floor (its
//! scheduler tick checks); podq's watchdog thread looks every half threshold, so it
//! refuses less than a millisecond.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::ControlError as Error;

/// The longest threshold a parameter accepts: longer is a typo, not a setting.
pub const MAX_PARAM: Duration = Duration::from_secs(24 * 3600);

/// A process-wide parameter that can be read and written through the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    /// `cpu_intensive_thresh_us`: [`crate::watchdog::set_cpu_intensive_threshold`].
    CpuIntensiveThreshUs,
    /// `watchdog_thresh`: [`crate::watchdog::set_stall_threshold`].
    WatchdogThresh,
}

impl Param {
    /// Every parameter.
    pub const ALL: [Param; 2] = [Param::CpuIntensiveThreshUs, Param::WatchdogThresh];

    /// The module parameter's file name.
    pub const fn name(self) -> &'static str {
        match self {
            Param::CpuIntensiveThreshUs => "cpu_intensive_thresh_us",
            Param::WatchdogThresh => "watchdog_thresh",
        }
    }

    /// The unit of its value.
    const fn unit(self) -> Duration {
        match self {
            Param::CpuIntensiveThreshUs => Duration::from_micros(1),
            Param::WatchdogThresh => Duration::from_secs(1),
        }
    }

    /// The shortest threshold it accepts besides `0` (off).
    const fn floor(self) -> Duration {
        match self {
            Param::CpuIntensiveThreshUs => crate::watchdog::MIN_THRESHOLD,
            Param::WatchdogThresh => Duration::from_secs(1),
        }
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Param {
    type Err = Error;

    /// Exact match of the file name.
    fn from_str(text: &str) -> Result<Param, Error> {
        Param::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| Error::UnknownParam {
                name: text.to_owned(),
            })
    }
}

/// Parses a value written to `param`: `None` turns its check off.
pub fn parse_param(param: Param, text: &str) -> Result<Option<Duration>, Error> {
    let unit = param.unit();
    let (floor, most) = (param.floor(), MAX_PARAM.as_nanos() / unit.as_nanos());
    let invalid = |reason: String| Error::InvalidValue {
        attr: param.name(),
        value: text.to_owned(),
        reason,
    };
    let range = || {
        format!(
            "expected 0 (off) or a decimal integer in [{}, {most}]",
            floor.as_nanos() / unit.as_nanos()
        )
    };
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() || !body.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(range()));
    }
    let count = body.parse::<u128>().map_err(|_| invalid(range()))?;
    if count == 0 {
        return Ok(None);
    }
    if count > most {
        return Err(invalid(range()));
    }
    // At most a day's nanoseconds: fits a u64.
    let threshold = Duration::from_nanos((count * unit.as_nanos()) as u64);
    if threshold < floor {
        return Err(invalid(range()));
    }
    Ok(Some(threshold))
}

/// The string the parameter's file reads: its value in its unit, `0` when off.
pub fn format_param(param: Param, value: Option<Duration>) -> String {
    let Some(value) = value else {
        return "0".to_owned();
    };
    let (nanos, unit) = (value.as_nanos(), param.unit().as_nanos());
    if nanos % unit == 0 {
        return (nanos / unit).to_string();
    }
    let text = format!("{:.9}", nanos as f64 / unit as f64);
    text.trim_end_matches('0').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_named() {
        for p in Param::ALL {
            assert_eq!(p.name().parse::<Param>().unwrap(), p);
        }
        let err = "cpu_intensive_thresh".parse::<Param>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown parameter `cpu_intensive_thresh` (expected one of \
             cpu_intensive_thresh_us, watchdog_thresh)"
        );
    }

    #[test]
    fn values_are_whole_numbers_in_the_unit_zero_is_off() {
        use Param::*;
        let ms = Duration::from_millis;
        assert_eq!(
            parse_param(CpuIntensiveThreshUs, "10000\n").unwrap(),
            Some(ms(10))
        );
        assert_eq!(
            parse_param(CpuIntensiveThreshUs, "1000").unwrap(),
            Some(ms(1))
        );
        assert_eq!(parse_param(CpuIntensiveThreshUs, "0").unwrap(), None);
        assert_eq!(parse_param(WatchdogThresh, "30").unwrap(), Some(ms(30_000)));
        assert_eq!(parse_param(WatchdogThresh, "0\n").unwrap(), None);
        assert_eq!(
            parse_param(WatchdogThresh, "86400").unwrap(),
            Some(MAX_PARAM)
        );
        for bad in [
            "", "\n", "999", "-5", "+5", "1e4", "10 ", " 10", "0x10", "10ms", "1.5",
        ] {
            let err = parse_param(CpuIntensiveThreshUs, bad)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("expected 0 (off) or a decimal integer in [1000, 86400000000]"),
                "{bad:?}: {err}"
            );
        }
        for bad in ["86401", "99999999999999999999999999999999999999999999"] {
            let err = parse_param(WatchdogThresh, bad).unwrap_err().to_string();
            assert!(err.contains("in [1, 86400]"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn reads_give_the_unit_and_a_fraction_only_when_there_is_one() {
        use Param::*;
        let ms = Duration::from_millis;
        assert_eq!(format_param(CpuIntensiveThreshUs, Some(ms(10))), "10000");
        assert_eq!(format_param(CpuIntensiveThreshUs, None), "0");
        assert_eq!(format_param(WatchdogThresh, Some(ms(30_000))), "30");
        assert_eq!(format_param(WatchdogThresh, Some(ms(1_500))), "1.5");
        assert_eq!(format_param(WatchdogThresh, Some(ms(5))), "0.005");
        for p in Param::ALL {
            for text in ["0", "2000", "3600"] {
                let value = parse_param(p, text).unwrap();
                assert_eq!(format_param(p, value), text, "{p}");
            }
        }
    }
}

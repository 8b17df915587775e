//! Slurm's durations: what `sbatch --time` takes, `squeue %L` and `scontrol`'s `TimeLimit=`
//! print (`minutes`, `minutes:seconds`, `hours:minutes:seconds`, `days-hours`,
//! `days-hours:minutes`, `days-hours:minutes:seconds`, `UNLIMITED`).

use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// A time limit or time left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlurmTime {
    Limited(Duration),
    Unlimited,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    #[error("empty time")]
    Empty,
    #[error("`{text}` is not a Slurm time")]
    Syntax { text: String },
    #[error("`{text}` is a time limit of zero, which Slurm reads as no limit at all")]
    Zero { text: String },
}

impl TimeError {
    /// What to write instead, for a message next to the field.
    pub const HINT: &'static str = "write minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS \
                                    (e.g. \"2-00:00:00\" for two days), or UNLIMITED";
}

/// Reads a time as Slurm writes and accepts it. `INFINITE` and `UNLIMITED` are no limit.
pub fn parse_time(text: &str) -> Result<SlurmTime, TimeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(TimeError::Empty);
    }
    if t.eq_ignore_ascii_case("UNLIMITED") || t.eq_ignore_ascii_case("INFINITE") {
        return Ok(SlurmTime::Unlimited);
    }
    let bad = || TimeError::Syntax {
        text: text.to_string(),
    };
    let number = |s: &str| -> Result<u64, TimeError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (days, clock) = match t.split_once('-') {
        Some((d, rest)) => (Some(number(d)?), rest),
        None => (None, t),
    };
    let parts = clock
        .split(':')
        .map(number)
        .collect::<Result<Vec<_>, _>>()?;
    // Without days the fields run from minutes; after `D-` they run from hours.
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86_400 + h * 3600,
        (Some(d), [h, m]) => d * 86_400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86_400 + h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    Ok(SlurmTime::Limited(Duration::from_secs(secs)))
}

/// A time limit for `sbatch --time`: [`parse_time`], refusing zero (Slurm's "no limit", which
/// a user who wrote `0:00` did not mean).
pub fn parse_limit(text: &str) -> Result<SlurmTime, TimeError> {
    match parse_time(text)? {
        SlurmTime::Limited(d) if d.is_zero() => Err(TimeError::Zero {
            text: text.to_string(),
        }),
        t => Ok(t),
    }
}

impl SlurmTime {
    pub fn duration(&self) -> Option<Duration> {
        match self {
            SlurmTime::Limited(d) => Some(*d),
            SlurmTime::Unlimited => None,
        }
    }
}

/// `D-HH:MM:SS` (Slurm's own long form, which every version reads back), or `UNLIMITED`.
impl fmt::Display for SlurmTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlurmTime::Unlimited => f.write_str("UNLIMITED"),
            SlurmTime::Limited(d) => {
                let s = d.as_secs();
                write!(
                    f,
                    "{}-{:02}:{:02}:{:02}",
                    s / 86_400,
                    s % 86_400 / 3600,
                    s % 3600 / 60,
                    s % 60
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(t: &str) -> u64 {
        parse_time(t).unwrap().duration().unwrap().as_secs()
    }

    #[test]
    fn every_form_sbatch_documents() {
        assert_eq!(secs("5"), 300);
        assert_eq!(secs("9:30"), 570);
        assert_eq!(secs("1:00:00"), 3600);
        assert_eq!(secs("2-00"), 2 * 86_400);
        assert_eq!(secs("2-03:04"), 2 * 86_400 + 3 * 3600 + 4 * 60);
        assert_eq!(secs("2-00:00:00"), 2 * 86_400);
        assert_eq!(secs("0:00"), 0);
        // squeue prints 90 minutes as 1:30:00, but 90 is also valid input.
        assert_eq!(secs("90"), 5400);
        assert_eq!(parse_time("UNLIMITED").unwrap(), SlurmTime::Unlimited);
        assert_eq!(parse_time("infinite").unwrap(), SlurmTime::Unlimited);
    }

    #[test]
    fn malformed_times_are_refused() {
        for t in [
            "",
            "1h",
            "1:2:3:4",
            "-5",
            "1-",
            "1-2:3:4:5",
            "a:00",
            " : ",
            "1.5",
        ] {
            assert!(parse_time(t).is_err(), "{t:?}");
        }
        assert_eq!(parse_time("  "), Err(TimeError::Empty));
    }

    #[test]
    fn a_zero_limit_is_refused_as_a_limit() {
        assert!(matches!(parse_limit("0"), Err(TimeError::Zero { .. })));
        assert!(parse_limit("1").is_ok());
        assert!(parse_limit("UNLIMITED").is_ok());
    }

    #[test]
    fn display_reads_back() {
        for t in ["2-00:00:00", "90", "9:30", "1-2:3:4", "UNLIMITED"] {
            let parsed = parse_time(t).unwrap();
            assert_eq!(parse_time(&parsed.to_string()).unwrap(), parsed, "{t}");
        }
        assert_eq!(parse_time("90").unwrap().to_string(), "0-01:30:00");
    }
}

//! Ranges in `--set`: an axis is a list of values or a numeric range (`LO..HI`, `LO..HI:log`),
//! keyed by a profile key or by `flag.NAME` for any flag of the host's SGLang; each dimension
//! maps the unit interval onto its values, a flag axis becomes server arguments, and flag axes
//! are checked against the host's `--help` before anything starts. Pure.

use serde::{Deserialize, Serialize};

use crate::sglang::help::HelpSpec;
use crate::sweep::space::{self, Axis, RangeProblem, SpaceError};

/// The key prefix of an axis over any SGLang flag, written without its dashes.
pub const FLAG_PREFIX: &str = "flag.";

/// One dimension of a search: a key and the values it may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dim {
    pub key: String,
    pub domain: Domain,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Domain {
    /// The values as typed, in order (the mamba strategies, `true,false`).
    List { values: Vec<String> },
    /// Every number from `lo` to `hi`; integers when both ends are, sampled on a log scale
    /// with `log`.
    Range {
        lo: f64,
        hi: f64,
        int: bool,
        log: bool,
    },
}

/// A range `LO..HI[:log]`; `None` when `text` is no range (a value list).
fn parse_range(text: &str) -> Option<Result<Domain, RangeProblem>> {
    let text = text.trim();
    let (body, suffix) = match text.split_once(':') {
        Some((b, s)) => (b, Some(s.trim())),
        None => (text, None),
    };
    let (lo, hi) = body.split_once("..")?;
    Some((|| {
        let log = match suffix {
            None => false,
            Some("log") => true,
            Some(_) => return Err(RangeProblem::Suffix),
        };
        let (lo, hi) = (lo.trim(), hi.trim());
        let num = |s: &str| s.parse::<f64>().ok().filter(|x| x.is_finite());
        let (Some(l), Some(h)) = (num(lo), num(hi)) else {
            return Err(RangeProblem::NotANumber);
        };
        if l >= h {
            return Err(RangeProblem::Empty);
        }
        if log && l <= 0.0 {
            return Err(RangeProblem::LogNotPositive);
        }
        let int = lo.parse::<i64>().is_ok() && hi.parse::<i64>().is_ok();
        Ok(Domain::Range {
            lo: l,
            hi: h,
            int,
            log,
        })
    })())
}

/// Whether any `--set` is a range: the adaptive search is then the default.
pub fn has_range(sets: &[String]) -> bool {
    sets.iter()
        .filter_map(|s| s.split_once('=').map(|(_, v)| v))
        .any(|v| parse_range(v).is_some())
}

/// The dimensions of the command line: `--strategies` first, then each `--set` in order; value
/// lists are checked as the grid checks them (duplicates, quoting).
pub fn dims(strategies: &[String], sets: &[String]) -> Result<Vec<Dim>, SpaceError> {
    let mut lists = Vec::new();
    let mut ranges: Vec<(usize, Dim)> = Vec::new();
    for raw in sets {
        let (key, values) = raw
            .split_once('=')
            .ok_or_else(|| SpaceError::Syntax(raw.clone()))?;
        match parse_range(values) {
            None => lists.push(raw.clone()),
            Some(Err(why)) => {
                return Err(SpaceError::Range {
                    raw: raw.clone(),
                    why,
                });
            }
            Some(Ok(domain)) => ranges.push((
                lists.len(),
                Dim {
                    key: key.trim().to_string(),
                    domain,
                },
            )),
        }
    }
    let axes: Vec<Axis> = space::axes(strategies, &lists)?;
    let offset = usize::from(!strategies.is_empty());
    let mut dims: Vec<Dim> = axes
        .into_iter()
        .map(|a| Dim {
            key: a.key,
            domain: Domain::List { values: a.values },
        })
        .collect();
    // Each range goes where it stood among the `--set`s.
    for (n, (at, dim)) in ranges.into_iter().enumerate() {
        if dims.iter().any(|d| d.key == dim.key) {
            return Err(SpaceError::Duplicate { key: dim.key });
        }
        dims.insert(offset + at + n, dim);
    }
    Ok(dims)
}

impl Dim {
    /// The value at `u` in [0, 1]: a list's value by position, a range's number (integers
    /// rounded; decimals to a hundredth of the range's width, so ids stay short and stable).
    pub fn value(&self, u: f64) -> String {
        let u = u.clamp(0.0, 1.0);
        match &self.domain {
            Domain::List { values } => {
                let i = ((u * values.len() as f64) as usize).min(values.len() - 1);
                values[i].clone()
            }
            &Domain::Range { lo, hi, int, log } => {
                let x = if log {
                    (lo.ln() + u * (hi.ln() - lo.ln())).exp()
                } else {
                    lo + u * (hi - lo)
                };
                if int {
                    format!("{}", x.round().clamp(lo, hi) as i64)
                } else {
                    let decimals = (-((hi - lo) / 100.0).log10()).ceil().max(0.0) as usize;
                    format!("{x:.decimals$}")
                }
            }
        }
    }

    /// Where `value` sits in [0, 1]: the inverse of [`Dim::value`]; `None` when it is not
    /// one of this dimension's values.
    pub fn unit(&self, value: &str) -> Option<f64> {
        match &self.domain {
            Domain::List { values } => {
                let i = values.iter().position(|v| v == value)?;
                Some((i as f64 + 0.5) / values.len() as f64)
            }
            &Domain::Range { lo, hi, log, .. } => {
                let x: f64 = value.trim().parse().ok()?;
                if !(lo..=hi).contains(&x) {
                    return None;
                }
                Some(if log {
                    (x.ln() - lo.ln()) / (hi.ln() - lo.ln())
                } else {
                    (x - lo) / (hi - lo)
                })
            }
        }
    }

    /// How many distinct values the dimension has, when it is countable (a list, or a range
    /// of integers).
    pub fn count(&self) -> Option<usize> {
        match &self.domain {
            Domain::List { values } => Some(values.len()),
            Domain::Range { lo, hi, int, .. } => int.then(|| (hi - lo) as usize + 1),
        }
    }

    pub fn is_list(&self) -> bool {
        matches!(self.domain, Domain::List { .. })
    }
}

/// A flag axis the host's SGLang would not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagProblem {
    #[error("--set {key}: this SGLang has no flag {flag}{}", nearest.as_ref().map(|n| format!(" (did you mean {n}?)")).unwrap_or_default())]
    Unknown {
        key: String,
        flag: String,
        nearest: Option<String>,
    },
    /// argparse would take a unique prefix, but the sweep names one flag exactly: SGLang
    /// 0.5.23 split `--cuda-graph-max-bs` into `-decode` and `-prefill`.
    #[error("--set {key}: {flag} is a prefix of {}; name one of them", matches.join(", "))]
    Prefix {
        key: String,
        flag: String,
        matches: Vec<String>,
    },
}

/// Every flag axis of `dims` that `help` does not know by its exact name.
pub fn check_flags(dims: &[Dim], help: &HelpSpec) -> Vec<FlagProblem> {
    dims.iter()
        .filter_map(|d| {
            let name = d.key.strip_prefix(FLAG_PREFIX)?;
            let flag = format!("--{}", name.trim_start_matches('-'));
            if help.has(&flag) {
                return None;
            }
            let matches: Vec<String> = help
                .names()
                .filter(|n| n.starts_with(&flag))
                .map(str::to_string)
                .collect();
            Some(if matches.is_empty() {
                FlagProblem::Unknown {
                    key: d.key.clone(),
                    nearest: help.nearest(&flag).map(str::to_string),
                    flag,
                }
            } else {
                FlagProblem::Prefix {
                    key: d.key.clone(),
                    flag,
                    matches,
                }
            })
        })
        .collect()
}

/// `extra` with each flag setting (`flag.NAME`, value) in place of what `extra` gave that
/// flag: `true` is the bare flag, `false` leaves it out, anything else is its value.
pub fn flag_args(extra: &[String], flags: &[(String, String)]) -> Vec<String> {
    let names: Vec<String> = flags
        .iter()
        .map(|(k, _)| format!("--{}", k[FLAG_PREFIX.len()..].trim_start_matches('-')))
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < extra.len() {
        let arg = &extra[i];
        i += 1;
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        if names.iter().any(|n| n == flag) {
            // Its value goes with it.
            if !arg.contains('=') && extra.get(i).is_some_and(|v| !v.starts_with("--")) {
                i += 1;
            }
            continue;
        }
        out.push(arg.clone());
    }
    for (name, (_, value)) in names.into_iter().zip(flags) {
        match value.as_str() {
            "true" => out.push(name),
            "false" => {}
            v => out.extend([name, v.to_string()]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn ranges_and_lists_keep_their_order_and_bad_ranges_are_named() {
        let d = dims(
            &s(&["no_buffer", "extra_buffer"]),
            &s(&[
                "server.mem_fraction_static=0.80..0.94",
                "flag.disable-radix-cache=true,false",
                "flag.cuda-graph-max-bs-decode=16..512:log",
            ]),
        )
        .unwrap();
        let keys: Vec<&str> = d.iter().map(|d| d.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "server.mamba_strategy",
                "server.mem_fraction_static",
                "flag.disable-radix-cache",
                "flag.cuda-graph-max-bs-decode"
            ]
        );
        assert_eq!(
            d[3].domain,
            Domain::Range {
                lo: 16.0,
                hi: 512.0,
                int: true,
                log: true
            }
        );
        assert!(has_range(&s(&["server.x=1..2"])) && !has_range(&s(&["server.x=1,2"])));
        let err = |raw: &str| dims(&[], &s(&[raw])).unwrap_err();
        for (raw, why) in [
            ("server.x=a..2", RangeProblem::NotANumber),
            ("server.x=2..1", RangeProblem::Empty),
            ("server.x=0..8:log", RangeProblem::LogNotPositive),
            ("server.x=1..8:lin", RangeProblem::Suffix),
        ] {
            assert_eq!(
                err(raw),
                SpaceError::Range {
                    raw: raw.into(),
                    why
                }
            );
        }
        assert!(err("server.x=1..8:lin").to_string().contains("LO..HI"));
        assert_eq!(
            dims(&[], &s(&["server.x=1..2", "server.x=3"])),
            Err(SpaceError::Duplicate {
                key: "server.x".into()
            })
        );
    }

    #[test]
    fn a_dimension_maps_the_unit_interval_onto_its_values_and_back() {
        let d = dims(
            &[],
            &s(&["server.m=0.80..0.94", "flag.b=16..512:log", "flag.c=x,y"]),
        )
        .unwrap();
        assert_eq!(
            [d[0].value(0.0), d[0].value(0.5), d[0].value(1.0)],
            ["0.800", "0.870", "0.940"]
        );
        assert_eq!([d[1].value(0.0), d[1].value(0.5)], ["16", "91"]);
        assert_eq!(d[1].value(1.0), "512");
        assert_eq!([d[2].value(0.0), d[2].value(0.99)], ["x", "y"]);
        assert!((d[0].unit("0.87").unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(d[0].unit("0.95"), None);
        assert_eq!(d[2].unit("y"), Some(0.75));
        assert_eq!(d[2].unit("z"), None);
        assert_eq!((d[1].count(), d[0].count()), (Some(497), None));
    }

    #[test]
    fn flag_axes_are_checked_against_the_help_by_exact_name() {
        let help = HelpSpec::parse(include_str!(
            "../../../tests/fixtures/sglang/help-0.5.23.txt"
        ));
        let d = dims(
            &[],
            &s(&[
                "flag.cuda-graph-max-bs-decode=16..512",
                "flag.cuda-graph-max-bs=8,16",
                "flag.schedule-conservativness=0.5..1.5",
                "server.mem_fraction_static=0.8..0.9",
            ]),
        )
        .unwrap();
        let problems = check_flags(&d, &help);
        assert_eq!(problems.len(), 2, "{problems:?}");
        let prefix = problems[0].to_string();
        assert!(
            prefix.contains("--cuda-graph-max-bs-decode") && prefix.contains("-prefill"),
            "{prefix}"
        );
        assert!(
            problems[1]
                .to_string()
                .contains("did you mean --schedule-conservativeness?"),
            "{}",
            problems[1]
        );
    }

    #[test]
    fn flag_settings_replace_what_the_profile_gave_those_flags() {
        let extra = s(&["--a", "1", "--disable-radix-cache", "--b=2", "--keep"]);
        let flags = [
            ("flag.a".to_string(), "5".to_string()),
            ("flag.disable-radix-cache".to_string(), "false".to_string()),
            ("flag.b".to_string(), "true".to_string()),
        ];
        assert_eq!(flag_args(&extra, &flags), s(&["--keep", "--a", "5", "--b"]));
    }
}

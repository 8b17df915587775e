//! Service-level objectives (`--slo ttft_p99<=2s,itl_p99<=60ms`): their parse, with typed
//! errors and hints; which limits a trial's figures break; and the penalty the adaptive search
//! scores a breaking trial with. Under an SLO the sweep maximises throughput among the
//! candidates that keep it: one that breaks it is ranked and shown, never crowned. Pure.

use serde::{Deserialize, Serialize};

use crate::sweep::measured::{Measured, Percentiles};

/// A latency the limits may bound: the client's percentiles over the measured window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    TtftP50,
    TtftP99,
    ItlP50,
    ItlP99,
}

const METRICS: [(&str, Metric); 4] = [
    ("ttft_p50", Metric::TtftP50),
    ("ttft_p99", Metric::TtftP99),
    ("itl_p50", Metric::ItlP50),
    ("itl_p99", Metric::ItlP99),
];

impl Metric {
    pub fn name(self) -> &'static str {
        METRICS
            .iter()
            .find(|(_, m)| *m == self)
            .map_or("", |(n, _)| n)
    }

    /// The figure in seconds; `None` when the window saw no first token (no second, for ITL).
    pub fn of(self, m: &Measured) -> Option<f64> {
        let pick = |p: Option<Percentiles>, high: bool| p.map(|p| if high { p.p99 } else { p.p50 });
        match self {
            Metric::TtftP50 => pick(m.ttft_s, false),
            Metric::TtftP99 => pick(m.ttft_s, true),
            Metric::ItlP50 => pick(m.itl_s, false),
            Metric::ItlP99 => pick(m.itl_s, true),
        }
    }
}

/// One limit: `metric <= max_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limit {
    pub metric: Metric,
    pub max_s: f64,
}

/// Every limit `--slo` gave; empty without it (then nothing breaks).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Slo {
    pub limits: Vec<Limit>,
}

/// A limit a trial broke, with its figure (`None`: the window could not tell, which keeps no
/// limit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Breach {
    pub metric: Metric,
    pub max_s: f64,
    pub value_s: Option<f64>,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.value_s {
            Some(v) => write!(
                f,
                "{} {} > {}",
                self.metric.name(),
                millis(v),
                millis(self.max_s)
            ),
            None => write!(
                f,
                "{} not measured (limit {})",
                self.metric.name(),
                millis(self.max_s)
            ),
        }
    }
}

fn millis(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1000.0)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SloError {
    #[error("--slo is empty; give limits such as ttft_p99<=2s,itl_p99<=60ms")]
    Empty,
    #[error("--slo `{part}`: not METRIC<=DURATION; write it as e.g. itl_p99<=60ms")]
    NoLimit { part: String },
    #[error(
        "--slo `{part}`: unknown metric `{metric}`{}; the metrics are ttft_p50, ttft_p99, itl_p50, itl_p99",
        hint.as_ref().map(|h| format!(" (did you mean {h}?)")).unwrap_or_default()
    )]
    Metric {
        part: String,
        metric: String,
        hint: Option<String>,
    },
    #[error(
        "--slo `{part}`: `{value}` is not a positive duration; write a number and a unit: 2s, 60ms, 500us"
    )]
    Duration { part: String, value: String },
    #[error("--slo names {metric} twice; give each metric one limit")]
    Twice { metric: &'static str },
}

/// A positive duration of `NUMBER UNIT`, the unit `s`, `ms` or `us`: seconds.
fn duration(text: &str) -> Option<f64> {
    let text = text.trim();
    let at = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(at);
    let n: f64 = number.trim().parse().ok()?;
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        _ => return None,
    };
    (n.is_finite() && n > 0.0).then_some(n * scale)
}

/// Parses `ttft_p99<=2s,itl_p99<=60ms`.
pub fn parse(text: &str) -> Result<Slo, SloError> {
    let mut limits: Vec<Limit> = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = part.split_once("<=") else {
            return Err(SloError::NoLimit { part: part.into() });
        };
        let name = name.trim();
        let Some(&(_, metric)) = METRICS.iter().find(|(n, _)| *n == name) else {
            let hint = METRICS
                .iter()
                .map(|(n, _)| (strsim::levenshtein(n, &name.to_lowercase()), *n))
                .min()
                .filter(|(d, _)| *d <= 3)
                .map(|(_, n)| n.to_string());
            return Err(SloError::Metric {
                part: part.into(),
                metric: name.into(),
                hint,
            });
        };
        let Some(max_s) = duration(value) else {
            return Err(SloError::Duration {
                part: part.into(),
                value: value.trim().into(),
            });
        };
        if limits.iter().any(|l| l.metric == metric) {
            return Err(SloError::Twice {
                metric: metric.name(),
            });
        }
        limits.push(Limit { metric, max_s });
    }
    if limits.is_empty() {
        return Err(SloError::Empty);
    }
    Ok(Slo { limits })
}

impl Slo {
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// The limits `m` breaks, in the order given.
    pub fn breaches(&self, m: &Measured) -> Vec<Breach> {
        self.limits
            .iter()
            .filter_map(|l| {
                let value_s = l.metric.of(m);
                value_s.is_none_or(|v| v > l.max_s).then_some(Breach {
                    metric: l.metric,
                    max_s: l.max_s,
                    value_s,
                })
            })
            .collect()
    }

    pub fn keeps(&self, m: &Measured) -> bool {
        self.breaches(m).is_empty()
    }

    /// What the search scores a measured figure with: the throughput, times (limit / value)²
    /// for each limit broken, and a half for each the window could not tell. A breaking
    /// candidate still says which way the feasible region lies, so it is not a failure.
    pub fn penalised(&self, m: &Measured, throughput: f64) -> f64 {
        self.breaches(m)
            .iter()
            .map(|b| b.value_s.map_or(0.5, |v| (b.max_s / v).powi(2)))
            .product::<f64>()
            * throughput
    }

    /// `ttft_p99<=2s,itl_p99<=60ms`, as given.
    pub fn text(&self) -> String {
        self.limits
            .iter()
            .map(|l| format!("{}<={}", l.metric.name(), millis(l.max_s).replace(' ', "")))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(ttft_p99: f64, itl_p99: Option<f64>) -> Measured {
        Measured {
            gpus: 1,
            server_gpus: 1,
            output_tok_s: 100.0,
            output_tok_s_per_gpu: 100.0,
            req_s: 1.0,
            completed: 10,
            errors: 0,
            mean_output_tokens: 20.0,
            ttft_s: Some(Percentiles {
                p50: ttft_p99 / 2.0,
                p99: ttft_p99,
            }),
            itl_s: itl_p99.map(|p99| Percentiles {
                p50: p99 / 2.0,
                p99,
            }),
            cap: 8,
            in_flight: 10,
            kv_tokens: 1000,
            strategy: None,
            startup_s: None,
            completed_output_tok_s: 100.0,
            metrics_output_tok_s: None,
            estimate: None,
            lengths: Default::default(),
        }
    }

    #[test]
    fn parses_the_issue_s_limits_and_reads_them_back() {
        let slo = parse("ttft_p99<=2s, itl_p99<=60ms").unwrap();
        assert_eq!(
            slo.limits,
            vec![
                Limit {
                    metric: Metric::TtftP99,
                    max_s: 2.0
                },
                Limit {
                    metric: Metric::ItlP99,
                    max_s: 0.06
                }
            ]
        );
        assert_eq!(slo.text(), "ttft_p99<=2.00s,itl_p99<=60.0ms");
        let json = serde_json::to_value(&slo).unwrap();
        assert_eq!(json[1]["metric"], "itl_p99");
        assert_eq!(serde_json::from_value::<Slo>(json).unwrap(), slo);
        assert_eq!(parse("itl_p50<=1.5ms").unwrap().limits[0].max_s, 0.0015);
    }

    #[test]
    fn bad_limits_are_named_with_a_hint() {
        assert_eq!(parse(" , "), Err(SloError::Empty));
        assert!(matches!(
            parse("itl_p99=60ms"),
            Err(SloError::NoLimit { .. })
        ));
        let e = parse("ttft_p99<=2s,itl_99<=60ms").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--slo `itl_99<=60ms`: unknown metric `itl_99` (did you mean itl_p99?); the metrics are ttft_p50, ttft_p99, itl_p50, itl_p99"
        );
        for bad in ["60", "-5ms", "2h", "ms"] {
            let e = parse(&format!("itl_p99<={bad}")).unwrap_err();
            assert!(matches!(e, SloError::Duration { .. }), "{bad}: {e}");
        }
        assert_eq!(
            parse("itl_p99<=1s,itl_p99<=2s"),
            Err(SloError::Twice { metric: "itl_p99" })
        );
    }

    #[test]
    fn a_figure_over_a_limit_or_unmeasured_breaks_it_and_is_penalised() {
        let slo = parse("ttft_p99<=2s,itl_p99<=60ms").unwrap();
        assert!(slo.keeps(&measured(1.5, Some(0.05))));
        let over = slo.breaches(&measured(1.5, Some(0.075)));
        assert_eq!(over.len(), 1);
        assert_eq!(over[0].to_string(), "itl_p99 75.0 ms > 60.0 ms");
        let p = slo.penalised(&measured(1.5, Some(0.075)), 100.0);
        assert!((p - 64.0).abs() < 1e-9, "{p}");
        let blind = slo.breaches(&measured(3.0, None));
        assert_eq!(blind.len(), 2);
        assert_eq!(blind[1].to_string(), "itl_p99 not measured (limit 60.0 ms)");
        assert!(Slo::default().keeps(&measured(99.0, None)));
    }
}

//! The memory prediction held against what the servers reported: for each measured row with a
//! prediction, the cap and KV pool predicted before the start, those `/server_info` gave, and
//! the error. Pure.

use serde::Serialize;

use crate::layout::predict::error_pct;
use crate::report::table;
use crate::sweep::rank::Ranked;

/// One measured candidate's prediction against its servers' figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapCheck {
    pub label: String,
    pub weights_gib_per_gpu: f64,
    pub predicted_cap: u64,
    /// `effective_max_running_requests`, the lowest over the candidate's servers.
    pub measured_cap: u32,
    /// (predicted − measured) ÷ measured, in percent.
    pub cap_error_pct: Option<f64>,
    /// Each DP rank's KV pool (`max_total_num_tokens`).
    pub predicted_kv_tokens: u64,
    pub measured_kv_tokens: u64,
    pub kv_error_pct: Option<f64>,
}

/// The checks of every measured row whose cap was predicted, in the rows' order.
pub fn checks(rows: &[Ranked]) -> Vec<CapCheck> {
    rows.iter()
        .filter_map(|row| {
            let m = row.trial.outcome.measured()?;
            let p = row.trial.prediction?;
            let (cap, kv) = (p.cap?, p.kv_tokens?);
            Some(CapCheck {
                label: row.label.clone(),
                weights_gib_per_gpu: p.weights_gib_per_gpu,
                predicted_cap: cap,
                measured_cap: m.cap,
                cap_error_pct: error_pct(cap, u64::from(m.cap)),
                predicted_kv_tokens: kv,
                measured_kv_tokens: m.kv_tokens,
                kv_error_pct: error_pct(kv, m.kv_tokens),
            })
        })
        .collect()
}

fn pct(e: Option<f64>) -> String {
    e.map_or("-".into(), |e| format!("{e:+.1}%"))
}

/// The checks as a table under a heading; empty without any.
pub fn text(checks: &[CapCheck]) -> String {
    if checks.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = checks
        .iter()
        .map(|c| {
            vec![
                c.label.clone(),
                format!("{:.1}", c.weights_gib_per_gpu),
                c.predicted_cap.to_string(),
                c.measured_cap.to_string(),
                pct(c.cap_error_pct),
                c.predicted_kv_tokens.to_string(),
                c.measured_kv_tokens.to_string(),
                pct(c.kv_error_pct),
            ]
        })
        .collect();
    format!(
        "memory predicted before the start vs reported by the servers:\n{}\n",
        table(
            &[
                "candidate",
                "weights GiB/GPU",
                "cap predicted",
                "cap measured",
                "cap error",
                "KV tokens predicted",
                "KV tokens measured",
                "KV error",
            ],
            rows,
        )
    )
}

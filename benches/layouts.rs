//! The layout search as a user runs it: `fleet sweep --set server.tp_size=1,2,4,8` (the release
//! binary) on 8 simulated GPUs of one board, for five boards × models whose best layout the
//! search is never told. Each layout is then measured alone, with the same windows, to know
//! the truth; the search's distance to the best is the truth of what it crowned over the best
//! truth, and its wall time is set against one candidate's (the best layout swept alone).
//!
//!     cargo bench --bench layouts [-- --quick]
//!
//! `--quick` runs the first two cases.

mod board_sweep;
mod headline;

use board_sweep::{BoardWorld, SIM, median};
use serde_json::Value;
const LAYOUTS: [u32; 4] = [1, 2, 4, 8];

/// (name, board fixture, model weights GiB).
const CASES: [(&str, &str, u32); 5] = [
    (
        "PCIe, switch pairs out of order, 120 GiB",
        "pcie-8-unordered",
        120,
    ),
    ("NVLink, 120 GiB", "nvlink-8", 120),
    (
        "PCIe, switch pairs out of order, 40 GiB",
        "pcie-8-unordered",
        40,
    ),
    ("NVLink, 200 GiB", "nvlink-8", 200),
    ("PCIe without switches, 120 GiB", "pcie-8-no-switch", 120),
];

/// The board and a sim model of `weights` GiB, whose best layout the search is never told.
fn world(board: &str, weights: u32) -> BoardWorld {
    BoardWorld::new(board, "big", |_, port_base| {
        format!(
            "model: /models/big\nlauncher: [{SIM}]\nport_base: {port_base}\nserver:\n  \
             mamba_strategy: no_buffer\n  extra_args: [--sim-weights-gib, \"{weights}\"]\n\
             env:\n  SGLANG_SIM_STARTUP_SECS: \"10\"\n  SGLANG_SIM_TIME_SCALE: \"20\"\n\
             health: {{startup_timeout: 60s, poll: 1s}}\n"
        )
    })
}

/// `fleet sweep` of `tp_sizes` with the bench's windows: its JSON and wall seconds.
fn sweep(w: &BoardWorld, tp_sizes: &str) -> (Value, f64) {
    let set = format!("server.tp_size={tp_sizes}");
    let args = ["--set", &set, "--input-len", "64", "--output-len", "256"];
    let windows = ["--warmup", "3s", "--duration", "12s"];
    w.sweep(
        &[&args[..], &windows[..]].concat(),
        &format!("sweep-{tp_sizes}.json"),
    )
}

fn per_gpu(report: &Value, tp: u32) -> Option<f64> {
    report["rows"]
        .as_array()?
        .iter()
        .find(|r| r["label"] == format!("tp_size={tp}"))?["trial"]["outcome"]["output_tok_s_per_gpu"]
        .as_f64()
}

fn main() {
    let cases = if headline::quick() {
        &CASES[..2]
    } else {
        &CASES[..]
    };
    let (mut distances, mut walls) = (Vec::new(), Vec::new());
    for (name, board, weights) in cases {
        let w = world(board, *weights);
        let (search, wall) = sweep(&w, "1,2,4,8");
        let winner = search["winner"].as_str().unwrap_or_default().to_string();
        // The truth: each layout alone, as the search would have seen it with no rival.
        let mut truth = Vec::new();
        let mut alone = Vec::new();
        for tp in LAYOUTS {
            let (one, secs) = sweep(&w, &tp.to_string());
            if let Some(t) = per_gpu(&one, tp) {
                truth.push((tp, t));
                alone.push((tp, secs));
            }
        }
        let (best_tp, best) = truth
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("some layout loads");
        let crowned: u32 = winner.trim_start_matches("tp_size=").parse().unwrap_or(0);
        let got = truth
            .iter()
            .find(|(tp, _)| *tp == crowned)
            .map_or(0.0, |x| x.1);
        let distance = got / best;
        let one = alone
            .iter()
            .find(|(tp, _)| *tp == best_tp)
            .map_or(f64::NAN, |x| x.1);
        let ratio = wall / one;
        let failed: Vec<String> = LAYOUTS
            .iter()
            .filter(|tp| per_gpu(&search, **tp).is_none())
            .map(|tp| format!("tp{tp}"))
            .collect();
        println!(
            "{name}: crowned tp{crowned} ({got:.0} tok/s/GPU alone), best tp{best_tp} \
             ({best:.0}); distance {distance:.3}; wall {wall:.0} s against {one:.0} s for the \
             best alone ({ratio:.2}x); did not load: {}; truth: {truth:?}",
            if failed.is_empty() {
                "none".to_string()
            } else {
                failed.join(", ")
            }
        );
        distances.push(distance);
        walls.push(ratio);
    }
    let worst_d = distances.iter().cloned().fold(f64::INFINITY, f64::min);
    let worst_w = walls.iter().cloned().fold(0.0, f64::max);
    headline::line(
        "layout search: crowned ÷ best layout per GPU (median, worst of 5 boards × models)",
        &format!("{:.3}, {worst_d:.3}", median(distances.clone())),
        "≥ 0.97",
        Some(worst_d >= 0.97),
    );
    headline::line(
        "layout search (tp 1,2,4,8): wall ÷ the best layout swept alone (median, worst)",
        &format!("{:.2}x, {worst_w:.2}x", median(walls.clone())),
        "≤ 3x",
        Some(worst_w <= 3.0),
    );
}

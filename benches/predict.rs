//! The layout memory prediction as a user meets it: `fleet sweep --set
//! server.tp_size=1,2,4,8` on 8 simulated GPUs of a board, for five boards × dense models on disk
//! (a `config.json` and sparse `*.safetensors` files of the model's size). fleet predicts each
//! layout's KV pool and cap before anything starts and skips those predicted not to fit; the
//! error is the predicted cap and KV pool against what each started server reports in
//! `/server_info`. The servers answer at once (`--sim-instant`): only their memory is compared.
//!
//!     cargo bench --bench predict [-- --quick]
//!
//! `--quick` runs the first two cases.

mod board_sweep;
mod headline;

use board_sweep::{BoardWorld, SIM, median};

/// A dense model: (layers, attention heads, KV heads, head dim, context, weights GiB).
type Shape = (u32, u32, u32, u32, u32, u64);

/// (name, board fixture, model, mem_fraction_static).
const CASES: [(&str, &str, Shape, f64); 5] = [
    (
        "PCIe, 70B-like (131 GiB)",
        "pcie-8-unordered",
        (80, 64, 8, 128, 32768, 131),
        0.85,
    ),
    (
        "NVLink, 8B-like (15 GiB)",
        "nvlink-8",
        (32, 32, 8, 128, 131072, 15),
        0.88,
    ),
    (
        "PCIe, 32B-like (61 GiB)",
        "pcie-8-unordered",
        (64, 64, 8, 128, 40960, 61),
        0.9,
    ),
    (
        "NVLink, 200 GiB, 4 KV heads",
        "nvlink-8",
        (96, 96, 4, 128, 65536, 200),
        0.85,
    ),
    (
        "PCIe without switches, 120 GiB, no GQA",
        "pcie-8-no-switch",
        (40, 40, 40, 128, 8192, 120),
        0.85,
    ),
];

/// The board and a dense model on disk of `shape`, a `config.json` and sparse weight files.
fn world(board: &str, shape: Shape, fraction: f64) -> BoardWorld {
    BoardWorld::new(board, "dense", |dir, port_base| {
        let (layers, heads, kv, head_dim, context, gib) = shape;
        let model = dir.join("model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(
            model.join("config.json"),
            format!(
                "{{\"num_hidden_layers\": {layers}, \"num_attention_heads\": {heads}, \
                 \"num_key_value_heads\": {kv}, \"head_dim\": {head_dim}, \
                 \"max_position_embeddings\": {context}, \"torch_dtype\": \"bfloat16\"}}"
            ),
        )
        .unwrap();
        for i in 0..4 {
            std::fs::File::create(model.join(format!("model-{i}.safetensors")))
                .unwrap()
                .set_len((gib << 30) / 4)
                .unwrap();
        }
        format!(
            "model: {}\nlauncher: [{SIM}]\nport_base: {port_base}\nserver:\n  \
             mem_fraction_static: {fraction}\n  extra_args: [--sim-instant]\n\
             env:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  SGLANG_SIM_TIME_SCALE: \"20\"\n\
             health: {{startup_timeout: 60s, poll: 1s}}\n",
            model.display()
        )
    })
}

/// Every layout, none pruned: each one that runs is a prediction to check.
const SWEEP: [&str; 11] = [
    "--set",
    "server.tp_size=1,2,4,8",
    "--input-len",
    "16",
    "--output-len",
    "8",
    "--warmup",
    "1s",
    "--duration",
    "2s",
    "--no-prune",
];

fn main() {
    let cases = if headline::quick() {
        &CASES[..2]
    } else {
        &CASES[..]
    };
    let (mut cap_err, mut kv_err) = (Vec::new(), Vec::new());
    let (mut skipped, mut failed, mut outside) = (0, 0, 0);
    for (name, board, shape, fraction) in cases {
        let (r, _) = world(board, *shape, *fraction).sweep(&SWEEP, "sweep.json");
        let rows = r["rows"].as_array().cloned().unwrap_or_default();
        let kind = |k: &str| {
            rows.iter()
                .filter(|row| row["trial"]["outcome"]["kind"] == k)
                .map(|row| row["label"].as_str().unwrap_or("?").to_string())
                .collect::<Vec<_>>()
        };
        let skips = kind("predicted");
        // Predicted to fit, yet failed at load: the static pool (not enough memory), or what
        // lies outside it, which the prediction does not model (CUDA graphs, activations).
        let (fails, ooms) = (kind("not_enough_memory"), kind("out_of_memory"));
        let checks = r["predictions"].as_array().cloned().unwrap_or_default();
        let mut line = Vec::new();
        for c in &checks {
            let (cap, kv) = (c["cap_error_pct"].as_f64(), c["kv_error_pct"].as_f64());
            cap_err.extend(cap.map(f64::abs));
            kv_err.extend(kv.map(f64::abs));
            line.push(format!(
                "{} cap {}/{} KV {}/{}",
                c["label"].as_str().unwrap_or("?"),
                c["predicted_cap"],
                c["measured_cap"],
                c["predicted_kv_tokens"],
                c["measured_kv_tokens"]
            ));
        }
        println!(
            "{name}: predicted/measured {}; skipped before the start: {skips:?}; not enough \
             memory at load (the prediction missed): {fails:?}; out of memory outside the \
             static pool: {ooms:?}",
            line.join(", ")
        );
        skipped += skips.len();
        failed += fails.len();
        outside += ooms.len();
    }
    let n = cap_err.len();
    assert!(n > 0, "no layout ran with a prediction");
    let worst = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    headline::line(
        &format!(
            "layout memory prediction: cap error, median and worst of {n} layouts ({skipped} \
             skipped before the start)"
        ),
        &format!("{:.1}%, {:.1}%", median(cap_err.clone()), worst(&cap_err)),
        "the layout memory prediction: the cap's error against the servers' `/server_info`, \
         over the layouts of a tp 1,2,4,8 sweep on 5 boards × dense models (sims) ≤ 5%",
        Some(worst(&cap_err) <= 5.0),
    );
    headline::line(
        "layout memory prediction: KV pool error, median and worst",
        &format!("{:.1}%, {:.1}%", median(kv_err.clone()), worst(&kv_err)),
        "the same, the KV pool's error ≤ 5%",
        Some(worst(&kv_err) <= 5.0),
    );
    headline::line(
        "layout memory prediction: predicted to fit, failed at load",
        &format!(
            "{failed} ({outside} more ran out of memory outside the static pool, which the \
             prediction does not model)"
        ),
        "the same, layouts predicted to fit that failed for want of static pool: 0",
        Some(failed == 0),
    );
}

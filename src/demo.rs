//! What `fleet demo` sets up and concludes, as pure values: the simulated inventory and the
//! seed's profile, the bundled sample of prompts, and the saturation verdict from the sims'
//! readings. The command in `commands::demo` runs fleet's own commands over them.

use serde::Serialize;

use crate::sweep::file::SweepFile;
use crate::sweep::rank::Outcome;

/// GPUs of the simulated host, as on the seed's Proxmox container.
pub const GPUS: u32 = 8;
/// Prompts in the bundled sample the demo generates for.
pub const SAMPLE_PROMPTS: usize = 2000;
/// The seed job's size, for the sweep's ETA projection.
pub const SEED_PROMPTS: u64 = 654_676;
/// The seed job's mean output length.
pub const SEED_OUTPUT_TOKENS: u64 = 988;
/// Simulated time runs this much faster than real time, so a day-long job shows in seconds.
pub const TIME_SCALE: u32 = 10;

/// `fleet.yaml`: this machine with 8 simulated GPUs.
pub fn inventory_yaml() -> String {
    let gpus: Vec<String> = (0..GPUS).map(|g| g.to_string()).collect();
    format!(
        "# fleet demo: this machine, with {GPUS} simulated GPUs\nhosts:\n  - name: local\n    gpus: [{}]\n",
        gpus.join(", ")
    )
}

/// The seed's original profile (DESIGN §1, extra_buffer), launching `sim` instead of SGLang.
/// Paths are written as JSON strings, which YAML reads verbatim whatever they contain.
pub fn seed_profile_yaml(sim: &str, gpu_state_dir: &str, port_base: u16) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    format!(
        "# The seed's original setup, simulated: Qwen3.6-27B on RTX PRO 6000 Blackwell GPUs with
# the extra_buffer mamba strategy copied from an old setup.
model: /models/Qwen3.6-27B
served_model_name: qwen3.6-27b
launcher: [{sim}]
port_base: {port_base}
server:
  mem_fraction_static: 0.85
  context_length: 8192
  attention_backend: flashinfer
  mamba_strategy: extra_buffer
  # SGLang streams a chunk per 8 tokens: at {TIME_SCALE}x simulated speed, one chunk per token
  # would make a 2-core client, not the GPUs, the bottleneck of the sweep's streamed load.
  extra_args: [--trust-remote-code, --stream-interval, \"8\"]
env:
  SGLANG_SIM_TIME_SCALE: \"{TIME_SCALE}\"
  SGLANG_SIM_STARTUP_SECS: \"20\"      # a 20 s model load, 2 s at time scale {TIME_SCALE}
  SGLANG_SIM_GPU_STATE_DIR: {state}
health:
  startup_timeout: 2m
  poll: 1s
",
        sim = q(sim),
        state = q(gpu_state_dir),
    )
}

/// The bundled sample: `n` varied prompts, deterministic, one JSONL line each, half of them
/// chat `messages` and half plain `prompt`, as a training-data job mixes them.
pub fn sample_prompts(n: usize) -> String {
    const TOPICS: [&str; 12] = [
        "the water cycle",
        "binary search trees",
        "the French Revolution",
        "photosynthesis",
        "TCP congestion control",
        "the Krebs cycle",
        "ownership in Rust",
        "supply and demand",
        "plate tectonics",
        "the Fourier transform",
        "public-key cryptography",
        "gradient descent",
    ];
    const ASKS: [&str; 5] = [
        "Explain {t} to a curious twelve-year-old, with one everyday analogy.",
        "Write a step-by-step tutorial on {t} for a university student, including a worked example and three exercises with solutions.",
        "Summarise the key ideas of {t} in five bullet points, then describe one common misconception and why it is wrong.",
        "Write a short dialogue between a teacher and a student who keeps asking why, about {t}.",
        "Compare two competing explanations of {t}, say when each applies, and end with an open question.",
    ];
    let mut out = String::with_capacity(n * 200);
    for i in 0..n {
        let ask = ASKS[i % ASKS.len()].replace("{t}", TOPICS[(i / ASKS.len()) % TOPICS.len()]);
        let text = format!("{ask} (variant {i})");
        let line = if i % 2 == 0 {
            serde_json::json!({"id": format!("demo-{i:05}"), "prompt": text})
        } else {
            serde_json::json!({"id": format!("demo-{i:05}"), "messages": [
                {"role": "system", "content": "You are a careful, concise tutor."},
                {"role": "user", "content": text}]})
        };
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// One sweep candidate in real-time terms: what a real GPU would do, the simulated one being
/// `TIME_SCALE` times faster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RealTime {
    pub label: String,
    pub output_tok_s_per_gpu: f64,
    pub cap: u64,
    /// Hours for the seed's job on all the demo's GPUs.
    pub seed_job_hours: f64,
}

/// The measured trials of a sweep, scaled back to real time, fastest first.
pub fn real_time(sweep: &SweepFile, time_scale: f64) -> Vec<RealTime> {
    let mut rows: Vec<RealTime> = sweep
        .trials
        .iter()
        .filter_map(|t| {
            let Outcome::Ok(m) = &t.outcome else {
                return None;
            };
            let tok = m.output_tok_s_per_gpu / time_scale;
            Some(RealTime {
                label: t.candidate.label(),
                output_tok_s_per_gpu: tok,
                cap: m.cap.into(),
                seed_job_hours: SEED_PROMPTS as f64 * SEED_OUTPUT_TOKENS as f64
                    / (tok * f64::from(GPUS))
                    / 3600.0,
            })
        })
        .collect();
    rows.sort_by(|a, b| b.output_tok_s_per_gpu.total_cmp(&a.output_tok_s_per_gpu));
    rows
}

/// How close the job came to what the simulated GPUs can do at most.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Saturation {
    /// The fleet's summed decode throughput (`sglang:gen_throughput`) while the job held every
    /// batch full: the median of the samples taken between 20% and 80% of the job.
    pub steady_output_tok_s: f64,
    /// The sum of the sims' `ideal_output_tok_s` for their configs.
    pub ideal_output_tok_s: f64,
    pub ratio: f64,
    pub samples: usize,
}

/// `samples`: (fraction of the job done, fleet-wide gen throughput) in time order.
pub fn saturation(samples: &[(f64, f64)], ideal_output_tok_s: f64) -> Option<Saturation> {
    let mut steady: Vec<f64> = samples
        .iter()
        .filter(|(done, _)| (0.2..=0.8).contains(done))
        .map(|(_, tok_s)| *tok_s)
        .collect();
    if steady.is_empty() || ideal_output_tok_s <= 0.0 {
        return None;
    }
    steady.sort_by(f64::total_cmp);
    let median = steady[steady.len() / 2];
    Some(Saturation {
        steady_output_tok_s: median,
        ideal_output_tok_s,
        ratio: median / ideal_output_tok_s,
        samples: steady.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_has_unique_ids_and_both_shapes() {
        let text = sample_prompts(SAMPLE_PROMPTS);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), SAMPLE_PROMPTS);
        let ids: std::collections::HashSet<&str> =
            lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), SAMPLE_PROMPTS);
        assert!(lines[0]["prompt"].is_string() && lines[1]["messages"].is_array());
        assert_eq!(sample_prompts(10), sample_prompts(10), "deterministic");
    }

    #[test]
    fn the_seed_profile_and_inventory_are_valid_for_fleet() {
        let dir = std::path::Path::new("/nonexistent");
        let yaml = seed_profile_yaml("/opt/x y/sglang-sim", "/tmp/a \"b\"", 31000);
        let p = crate::config::profile_from_str(&yaml, &dir.join("seed.yaml"), dir).unwrap();
        assert_eq!(p.launcher, vec!["/opt/x y/sglang-sim".to_string()]);
        assert_eq!(p.env["SGLANG_SIM_GPU_STATE_DIR"], "/tmp/a \"b\"");
        assert_eq!(
            p.server.mamba_strategy,
            Some(crate::config::MambaStrategy::ExtraBuffer)
        );
        let inv =
            crate::config::inventory_from_str(&inventory_yaml(), &dir.join("fleet.yaml")).unwrap();
        assert_eq!(
            inv.hosts[0].machine().map(|m| &m.gpus),
            Some(&crate::config::GpuSelection::List((0..GPUS).collect()))
        );
    }

    #[test]
    fn sweep_results_scale_back_to_real_time() {
        use crate::sweep::file::{FORMAT, SweepSpec};
        use crate::sweep::rank::{Measured, Trial};
        use crate::sweep::search::SearchSpec;
        use crate::sweep::space::axes;
        let strategies = ["extra_buffer", "no_buffer", "extra_buffer_lazy"].map(String::from);
        let search = SearchSpec::Grid {
            axes: axes(&strategies, &[]).unwrap(),
        };
        let candidates = search.space();
        let measured = |tok: f64, cap: u32| {
            Outcome::Ok(Measured {
                gpus: 4,
                server_gpus: 1,
                output_tok_s: tok * 4.0,
                output_tok_s_per_gpu: tok,
                req_s: 1.0,
                completed: 10,
                errors: 0,
                mean_output_tokens: 988.0,
                ttft_s: None,
                itl_s: None,
                cap,
                in_flight: cap + cap / 4,
                kv_tokens: 1,
                strategy: None,
                startup_s: None,
                completed_output_tok_s: tok * 4.0,
                metrics_output_tok_s: None,
                estimate: None,
                lengths: Default::default(),
            })
        };
        let outcomes = [
            measured(1070.0, 37),
            measured(11800.0, 72),
            Outcome::Failed {
                kind: crate::sweep::rank::Failure::OutOfMemory,
                reason: "OOM".into(),
                log_tail: vec![],
            },
        ];
        let sweep = SweepFile {
            format: FORMAT,
            spec: SweepSpec {
                profile: "seed".into(),
                search: search.clone(),
                mode: crate::sweep::assign::Mode::Parallel,
                workload: crate::sweep::load::WorkloadSpec::Synthetic {
                    input_len: 1,
                    output_len: 1,
                },
                warmup_s: 1.0,
                duration_s: 1.0,
                first_window_s: None,
                slo: Default::default(),
            },
            search: search.start(),
            trials: candidates
                .into_iter()
                .zip(outcomes)
                .map(|(candidate, outcome)| Trial {
                    candidate,
                    gpus: vec![],
                    first_window: None,
                    outcome,
                    cache: None,
                    prediction: None,
                })
                .collect(),
        };
        let rows = real_time(&sweep, 10.0);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].label, "no_buffer");
        assert_eq!(rows[0].output_tok_s_per_gpu, 1180.0);
        assert_eq!(rows[0].cap, 72);
        assert!(
            (rows[0].seed_job_hours - 19.0).abs() < 0.1,
            "{}",
            rows[0].seed_job_hours
        );
        assert!(
            (rows[1].seed_job_hours - 209.9).abs() < 0.5,
            "{}",
            rows[1].seed_job_hours
        );
    }

    #[test]
    fn saturation_is_the_median_of_the_steady_part() {
        let samples = [
            (0.05, 100.0),
            (0.3, 970.0),
            (0.5, 990.0),
            (0.6, 1000.0),
            (0.95, 300.0),
        ];
        let s = saturation(&samples, 1000.0).unwrap();
        assert_eq!(s.steady_output_tok_s, 990.0);
        assert!((s.ratio - 0.99).abs() < 1e-9);
        assert_eq!(s.samples, 3);
        assert!(saturation(&[(0.1, 5.0)], 1000.0).is_none());
    }
}

//! The sim's landscape offline: the saturated throughput and decode step of any config from the
//! sim's own model ([`model::plan`]), and the best config of a searched space (strategies × a
//! static-fraction range × a decode graph bound range), optionally under a limit on the decode
//! step. Tests and benchmarks measure a search's distance to this.

use super::model::{self, Params, Settings, Strategy};

/// One config of the space with what the model says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub strategy: Strategy,
    pub mem_fraction_static: f64,
    /// `--cuda-graph-max-bs-decode`.
    pub cuda_graph_max_bs: u64,
    /// Saturated output tokens per simulated second (`ideal_output_tok_s`).
    pub tok_s: f64,
    /// One decode step at the saturated batch, simulated seconds: the inter-token latency.
    pub step_s: f64,
    /// effective_max_running_requests_per_dp.
    pub cap: u64,
}

/// The space a search explores: every strategy, the static fraction from `mem.0` to `mem.1`
/// in steps of `mem_step`, and every integer bound from `bs.0` to `bs.1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub strategies: Vec<Strategy>,
    pub mem: (f64, f64),
    pub mem_step: f64,
    pub bs: (u64, u64),
}

impl Space {
    /// The issue's space: no_buffer and extra_buffer × 0.80..0.94 (to 0.001, as the search
    /// writes the fraction) × 16..512.
    pub fn issue() -> Space {
        Space {
            strategies: vec![Strategy::NoBuffer, Strategy::ExtraBuffer],
            mem: (0.80, 0.94),
            mem_step: 0.001,
            bs: (16, 512),
        }
    }
}

/// The model's figures for `base` with this strategy, static fraction and bound; `None` when
/// the server would fail to load (out of memory).
pub fn at(
    params: &Params,
    base: &Settings,
    strategy: Strategy,
    mem_fraction_static: f64,
    cuda_graph_max_bs: u64,
) -> Option<Point> {
    let settings = Settings {
        strategy,
        mem_fraction_static,
        cuda_graph_max_bs: Some(cuda_graph_max_bs),
        ..base.clone()
    };
    let plan = model::plan(params, &settings).ok()?;
    Some(Point {
        strategy,
        mem_fraction_static,
        cuda_graph_max_bs,
        tok_s: plan.ideal_output_tok_s(),
        step_s: plan.decode_step_secs(plan.saturated_batch()),
        cap: plan.cap,
    })
}

/// The fastest config of `space` whose decode step is at most `max_step_s` (none: any), the
/// one of least memory among equals; `None` when nothing in it loads.
pub fn best(
    params: &Params,
    base: &Settings,
    space: &Space,
    max_step_s: Option<f64>,
) -> Option<Point> {
    let steps = ((space.mem.1 - space.mem.0) / space.mem_step).round() as u64;
    let mut top: Option<Point> = None;
    for &strategy in &space.strategies {
        for i in 0..=steps {
            let mem = space.mem.0 + i as f64 * space.mem_step;
            for bs in space.bs.0..=space.bs.1 {
                let Some(p) = at(params, base, strategy, mem, bs) else {
                    continue;
                };
                if max_step_s.is_some_and(|m| p.step_s > m) {
                    continue;
                }
                if top.as_ref().is_none_or(|t| p.tok_s > t.tok_s) {
                    top = Some(p);
                }
            }
        }
    }
    top
}

/// A sim model drawn from `seed` around the defaults, for searches that must not be tuned on
/// one model: the GPU's memory (where the out-of-memory edge lies), the decode graphs' memory,
/// a mamba slot's (the cap a static fraction buys), a prefill token's activations, the decode
/// step and each strategy's speed. With the `SGLANG_SIM_*` variables that give a sim the same
/// model, each value written as the sim parses it back.
pub fn drawn(seed: u64, mean_output_tokens: u64) -> (Params, Vec<(&'static str, String)>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut draw = |lo: f64, hi: f64| (rng.random_range(lo..hi) * 1000.0).round() / 1000.0;
    let knobs = [
        ("SGLANG_SIM_GPU_MEM_GIB", draw(92.0, 100.0)),
        ("SGLANG_SIM_CUDA_GRAPH_GIB", draw(3.5, 7.0)),
        ("SGLANG_SIM_MAMBA_SLOT_MIB", draw(56.0, 90.0)),
        ("SGLANG_SIM_ACTIVATION_KIB_PER_TOKEN", draw(500.0, 750.0)),
        ("SGLANG_SIM_DECODE_BASE_MS", draw(20.0, 30.0)),
        ("SGLANG_SIM_DECODE_PER_REQ_MS", draw(0.35, 0.65)),
        ("SGLANG_SIM_EXTRA_BUFFER_COPY_MS", draw(1.0, 9.0)),
        ("SGLANG_SIM_OVERLAP_SPEEDUP", draw(1.05, 1.3)),
    ];
    let k = |i: usize| knobs[i].1;
    // As `config.rs` reads them: GiB to MiB, the GPU's total to the MiB.
    let params = Params {
        gpu_total_mib: (k(0) * 1024.0).round(),
        cuda_graph_mib: k(1) * 1024.0,
        mamba_slot_mib: k(2),
        activation_kib_per_token: k(3),
        decode_base_ms: k(4),
        decode_per_req_ms: k(5),
        extra_buffer_copy_ms: k(6),
        overlap_speedup: k(7),
        mean_output_tokens,
        ..Params::default()
    };
    (
        params,
        knobs.iter().map(|(n, v)| (*n, v.to_string())).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Settings {
        Settings {
            context_length: Some(8192),
            ..Settings::default()
        }
    }

    #[test]
    fn the_issue_s_best_lies_just_below_the_oom_edge_with_the_bound_just_above_the_cap() {
        let p = Params::default();
        let b = best(&p, &base(), &Space::issue(), None).unwrap();
        assert_eq!(b.strategy, Strategy::NoBuffer);
        assert!(
            b.cuda_graph_max_bs >= b.cap && b.cuda_graph_max_bs <= b.cap + 1,
            "{b:?}"
        );
        // The edge: a little more static memory, or one more graph size, and it does not load.
        let more = at(
            &p,
            &base(),
            b.strategy,
            b.mem_fraction_static + 0.005,
            b.cap,
        );
        assert!(more.is_none(), "{more:?}");
        assert!(
            at(&p, &base(), b.strategy, b.mem_fraction_static, b.cap + 40).is_none(),
            "past the edge"
        );
        assert!(
            b.mem_fraction_static > 0.90 && b.mem_fraction_static < 0.94,
            "{b:?}"
        );
        // Below the cap the batch decodes eagerly: slower, though it loads higher up.
        let eager = at(&p, &base(), b.strategy, 0.94, 16).unwrap();
        assert!(
            eager.cap > b.cap && eager.tok_s < 0.9 * b.tok_s,
            "{eager:?}"
        );
        // The grid a user types (0.80, 0.85, 0.90 × the default 256) misses it by over 3%.
        let typed = [0.80, 0.85, 0.90]
            .iter()
            .filter_map(|&m| at(&p, &base(), Strategy::NoBuffer, m, 256))
            .map(|q| q.tok_s)
            .fold(0.0, f64::max);
        assert!(at(&p, &base(), Strategy::NoBuffer, 0.90, 256).is_none());
        assert!(typed < 0.97 * b.tok_s, "{typed} against {}", b.tok_s);
    }

    #[test]
    fn a_drawn_model_is_its_seed_s_and_its_variables_read_back_as_its_parameters() {
        let (p, env) = drawn(3, 40);
        assert_eq!(
            drawn(3, 40),
            (p.clone(), env.clone()),
            "the same seed, the same model"
        );
        assert_ne!(drawn(4, 40).0, p);
        let var = |name: &str| -> f64 {
            env.iter()
                .find(|(n, _)| *n == name)
                .unwrap()
                .1
                .parse()
                .unwrap()
        };
        assert_eq!(
            p.gpu_total_mib,
            (var("SGLANG_SIM_GPU_MEM_GIB") * 1024.0).round()
        );
        assert_eq!(p.cuda_graph_mib, var("SGLANG_SIM_CUDA_GRAPH_GIB") * 1024.0);
        assert_eq!(p.overlap_speedup, var("SGLANG_SIM_OVERLAP_SPEEDUP"));
        assert_eq!(env.len(), 8);
        // Its space has a best, just below its own edge.
        let b = best(&p, &base(), &Space::issue(), None).unwrap();
        assert!(
            at(
                &p,
                &base(),
                b.strategy,
                b.mem_fraction_static + 0.01,
                b.cuda_graph_max_bs
            )
            .is_none()
        );
    }

    #[test]
    fn a_step_limit_moves_the_best_to_a_lower_cap() {
        let p = Params::default();
        let free = best(&p, &base(), &Space::issue(), None).unwrap();
        let limit = free.step_s * 0.9;
        let held = best(&p, &base(), &Space::issue(), Some(limit)).unwrap();
        assert!(held.step_s <= limit && held.cap < free.cap, "{held:?}");
        assert!(held.tok_s < free.tok_s);
    }
}

//! The model directory the sim serves (`--model-path`): where it holds a `config.json` and
//! `*.safetensors` files, as a real model does, the memory plan takes the model's shape and
//! weight bytes from them, as SGLang's model runner does (`srt/configs/model_config.py` reads
//! the config, the loader the weights), instead of the `--sim-*` defaults; a `--sim-*` flag
//! given still wins. Without a `config.json` there (a made-up path), nothing changes.

use std::path::Path;

use crate::layout::predict::Model;

/// What the model directory says, in the units the sim's `Params` use.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Every weight file's bytes, in MiB: what the loader puts on the GPUs.
    pub weights_mib: f64,
    pub attention_heads: u64,
    pub kv_heads: u64,
    /// K and V of every layer and KV head, per token (`profile_max_num_token`'s cell size,
    /// before the heads split over tensor parallelism).
    pub kv_kib_per_token: f64,
    pub context_len: u64,
    pub dense: bool,
}

/// The shape of the model at `dir`; `None` when it holds no `config.json`.
pub fn read(dir: &Path) -> Option<Result<Shape, String>> {
    let config = std::fs::read_to_string(dir.join("config.json")).ok()?;
    Some(shape(dir, &config))
}

fn shape(dir: &Path, config: &str) -> Result<Shape, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut bytes = 0u64;
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .ends_with(".safetensors")
        {
            bytes += entry.metadata().map_or(0, |m| m.len());
        }
    }
    let m = Model::from_config(config, bytes)
        .map_err(|e| format!("{}: {e}", dir.join("config.json").display()))?;
    let cell = 2 * m.layers * m.kv_heads * m.head_dim * m.dtype_bytes;
    Ok(Shape {
        weights_mib: bytes as f64 / (1024.0 * 1024.0),
        attention_heads: m.attention_heads,
        kv_heads: m.kv_heads,
        kv_kib_per_token: cell as f64 / 1024.0,
        context_len: m.context_len,
        dense: !m.hybrid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::predict::{self, Server};
    use crate::layout::{self, Parallel};
    use crate::sim::model::{self, Params, Settings};
    use crate::sim::parallel;

    /// A 70B-like dense model: 80 layers, 8 KV heads of 128, bf16, 131 GiB of weights.
    const CONFIG: &str = r#"{"hidden_size": 8192, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072}"#;

    fn dir(weights: u64) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.json"), CONFIG).unwrap();
        for i in 0..2 {
            let f = std::fs::File::create(d.path().join(format!("model-{i}.safetensors"))).unwrap();
            f.set_len(weights / 2).unwrap();
        }
        d
    }

    /// The sim's plan (its own reading of the directory and its own formula) and fleet's
    /// prediction agree on every layout, on GPUs of 80 and 141 GiB and at two fractions.
    #[test]
    fn the_sims_plan_and_fleets_prediction_agree() {
        let d = dir(131 << 30);
        let s = read(d.path()).unwrap().unwrap();
        assert!(s.dense);
        assert_eq!((s.kv_kib_per_token, s.weights_mib), (320.0, 131.0 * 1024.0));
        let m = Model::from_config(CONFIG, 131 << 30).unwrap();
        let mut compared = 0;
        for gpu_mib in [81_559u64, 144_384] {
            for fraction in [0.85, 0.9] {
                for (tp, dp, attn) in [(1, 1, false), (2, 1, false), (4, 2, false), (8, 8, true)] {
                    let params = Params {
                        gpu_total_mib: gpu_mib as f64,
                        weights_mib: s.weights_mib,
                        kv_kib_per_token: s.kv_kib_per_token,
                        kv_heads: s.kv_heads,
                        attention_heads: s.attention_heads,
                        model_context_len: s.context_len,
                        dense: s.dense,
                        ..Params::default()
                    };
                    let layout = parallel::Layout {
                        tp,
                        dp: if attn { 1 } else { dp },
                        attn_dp: if attn { dp } else { 1 },
                        ..parallel::Layout::default()
                    };
                    let settings = Settings {
                        mem_fraction_static: fraction,
                        cuda_graph_max_bs: None,
                        parallel: parallel::Parallel::new(
                            &layout,
                            parallel::Hop::Link(layout::Link::Pix),
                            &parallel::PerLink::parse(parallel::DEFAULT_GB_S).unwrap(),
                            &parallel::PerLink::parse(parallel::DEFAULT_LATENCY_MS).unwrap(),
                        ),
                        ..Settings::default()
                    };
                    let server = Server {
                        parallel: Parallel {
                            tp: tp as u32,
                            dp: dp as u32,
                            dp_attention: attn,
                            ..Parallel::default()
                        },
                        gpu_mib,
                        mem_fraction_static: fraction,
                        context_length: None,
                        max_running_requests: None,
                        max_total_tokens: None,
                    };
                    let sim = model::plan(&params, &settings);
                    let fleet = predict::predict(&m, &server);
                    match (sim, fleet) {
                        (Ok(plan), Ok(p)) => {
                            assert_eq!(p.kv_tokens, Some(plan.max_total_num_tokens), "{server:?}");
                            assert_eq!(p.cap, Some(plan.running_cap()), "{server:?}");
                            compared += 1;
                        }
                        // fleet skips a pool short of one request of the context, which the
                        // server would start with: the pools still agree.
                        (Ok(plan), Err(predict::Unfit::Context { kv_tokens, .. })) => {
                            assert_eq!(kv_tokens, plan.max_total_num_tokens, "{server:?}");
                        }
                        (
                            Err(model::LoadError::NotEnoughMemory),
                            Err(predict::Unfit::Weights { .. }),
                        ) => {}
                        (sim, fleet) => panic!("{server:?}: sim {sim:?}, fleet {fleet:?}"),
                    }
                }
            }
        }
        assert!(compared >= 10, "{compared} layouts fit");
    }

    #[test]
    fn a_made_up_path_changes_nothing() {
        assert!(read(Path::new("/models/none")).is_none());
    }
}

//! The memory a layout's servers will have, predicted before any start: from the model's
//! `config.json`, its weight bytes, one GPU's memory and the static fraction, the weights each
//! GPU holds, the KV pool and the running-request cap, by SGLang 0.5.23's own sizing; and the
//! layouts predicted not to fit, with the numbers that say why. Pure.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Parallel;

const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * MIB;

/// What the prediction needs of a model: its `config.json` and the bytes of its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub layers: u64,
    pub attention_heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// Bytes of one KV element: the model's dtype (SGLang's `--kv-cache-dtype auto`).
    pub dtype_bytes: u64,
    /// `max_position_embeddings`: the context without `--context-length`.
    pub context_len: u64,
    /// Linear-attention (mamba) layers beside the full-attention ones: their state pool and the
    /// cap it sets are not predicted, only whether the weights fit.
    pub hybrid: bool,
    pub weight_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("config.json is not JSON: {0}")]
    Json(String),
    #[error("config.json has no `{0}`")]
    Missing(&'static str),
}

/// Keys only hybrid (linear-attention or mamba) configs carry.
const HYBRID_KEYS: [&str; 6] = [
    "full_attention_interval",
    "linear_num_value_heads",
    "mamba_d_state",
    "ssm_state_size",
    "layers_block_type",
    "hybrid_override_pattern",
];

impl Model {
    /// Reads `config.json` as `srt/configs/model_config.py` does: a multimodal model's language
    /// model is its `text_config`; `head_dim` is `hidden_size ÷ num_attention_heads` unless
    /// given; `num_key_value_heads` defaults to the attention heads (no grouped-query attention).
    pub fn from_config(text: &str, weight_bytes: u64) -> Result<Model, ModelError> {
        let top: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::Json(e.to_string()))?;
        let inner = top.get("text_config").filter(|v| v.is_object());
        let get = |key: &str| inner.and_then(|c| c.get(key)).or_else(|| top.get(key));
        let num = |key: &'static str| get(key).and_then(serde_json::Value::as_u64);
        let need = |key: &'static str| num(key).filter(|n| *n > 0).ok_or(ModelError::Missing(key));
        let layers = need("num_hidden_layers")?;
        let attention_heads = need("num_attention_heads")?;
        let kv_heads = num("num_key_value_heads")
            .filter(|n| *n > 0)
            .unwrap_or(attention_heads);
        let head_dim = match num("head_dim").filter(|n| *n > 0) {
            Some(d) => d,
            None => need("hidden_size")? / attention_heads,
        };
        let dtype = get("torch_dtype")
            .or_else(|| get("dtype"))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("bfloat16");
        let dtype_bytes = match dtype {
            "float32" => 4,
            d if d.starts_with("float8") => 1,
            _ => 2,
        };
        Ok(Model {
            layers,
            attention_heads,
            kv_heads,
            head_dim,
            dtype_bytes,
            context_len: num("max_position_embeddings").unwrap_or(2048),
            hybrid: HYBRID_KEYS.iter().any(|k| get(k).is_some())
                || get("layer_types")
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(|types| {
                        types
                            .iter()
                            .filter_map(serde_json::Value::as_str)
                            .any(|t| t.contains("linear") || t.contains("mamba"))
                    }),
            weight_bytes,
        })
    }
}

/// A server of one layout as the profile asks for it, on GPUs of `gpu_mib` each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Server {
    pub parallel: Parallel,
    pub gpu_mib: u64,
    pub mem_fraction_static: f64,
    pub context_length: Option<u64>,
    pub max_running_requests: Option<u64>,
    pub max_total_tokens: Option<u64>,
}

/// What a server of the layout is predicted to have.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub weights_gib_per_gpu: f64,
    /// The static pool of one GPU (`mem_fraction_static` × its memory).
    pub static_gib: f64,
    /// Each DP rank's KV pool in tokens (`max_total_num_tokens`); `None` for a hybrid model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_tokens: Option<u64>,
    /// The server's running-request cap, its DP ranks' summed (`effective_max_running_requests`);
    /// `None` for a hybrid model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
}

/// Why a layout is predicted not to fit, with the numbers.
#[derive(Debug, Clone, PartialEq)]
pub enum Unfit {
    Weights {
        parallel: Parallel,
        weights_gib: f64,
        static_gib: f64,
        gpu_gib: f64,
        fraction: f64,
    },
    Context {
        parallel: Parallel,
        kv_tokens: u64,
        context_len: u64,
        rest_gib: f64,
    },
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::Weights {
                parallel,
                weights_gib,
                static_gib,
                gpu_gib,
                fraction,
            } => write!(
                f,
                "{parallel}: weights {weights_gib:.1} GiB per GPU, the static pool holds \
                 {static_gib:.1} GiB of {gpu_gib:.1} GiB at mem_fraction_static {fraction:.2}"
            ),
            Unfit::Context {
                parallel,
                kv_tokens,
                context_len,
                rest_gib,
            } => write!(
                f,
                "{parallel}: the {rest_gib:.2} GiB per GPU beside the weights hold a KV pool of \
                 {kv_tokens} tokens, less than one request of the {context_len}-token context"
            ),
        }
    }
}

/// KV bytes of one token on one GPU: K and V of every layer, over the KV heads that GPU holds.
/// `srt/configs/model_config.py` `get_num_kv_heads`: the KV heads split over the attention-TP
/// ranks, at least one each (replicated when there are fewer heads than ranks);
/// `srt/model_executor/model_runner.py` `profile_max_num_token`: `cell_size = kv_heads ×
/// head_dim × layers × 2 × element_size`.
pub fn kv_bytes_per_token(model: &Model, parallel: &Parallel) -> u64 {
    let heads = (model.kv_heads / attn_tp(parallel)).max(1);
    2 * model.layers * heads * model.head_dim * model.dtype_bytes
}

/// The GPUs the attention (and KV) heads split over: with DP attention the tp GPUs are shared
/// by dp ranks (`derive_attn_tp_size`, `srt/arg_groups/parallel_hook.py`).
fn attn_tp(p: &Parallel) -> u64 {
    let tp = u64::from(p.tp.max(1));
    match p.dp_attention {
        true => (tp / u64::from(p.dp.max(1))).max(1),
        false => tp,
    }
}

/// The request cap of one DP rank, as 0.5.23's `resolve_max_num_reqs`
/// (`srt/mem_cache/kv_cache_configurator.py`) derives it: `--max-running-requests` if given,
/// else `tokens ÷ context × 512` held within 2048–4096; either way at most half the tokens.
fn rank_cap(tokens: u64, context_len: u64, requested: Option<u64>) -> u64 {
    let half = tokens / 2;
    match requested {
        Some(r) => r.max(1).min(half),
        None => ((tokens as f64 / context_len.max(1) as f64 * 512.0) as u64)
            .clamp(2048, 4096)
            .min(half),
    }
}

/// Predicts a server of `server`'s layout. Every tensor-parallel rank holds the weights ÷ tp
/// (`srt/layers/linear.py` shards every projection; experts spread over the same GPUs); the
/// static pool is `mem_fraction_static` × the GPU's memory and the KV pool is what it holds
/// beside the weights (`profile_max_num_token`: `rest = available − total × (1 −
/// mem_fraction_static)`, in tokens `rest ÷ cell_size`), at most `--max-total-tokens`; each DP
/// rank has its own pool and cap.
pub fn predict(model: &Model, server: &Server) -> Result<Prediction, Unfit> {
    let p = server.parallel;
    let gpu_bytes = server.gpu_mib as f64 * MIB;
    let static_bytes = server.mem_fraction_static * gpu_bytes;
    let weights = model.weight_bytes as f64 / f64::from(p.tp.max(1));
    let (weights_gib, static_gib) = (weights / GIB, static_bytes / GIB);
    if weights >= static_bytes {
        return Err(Unfit::Weights {
            parallel: p,
            weights_gib,
            static_gib,
            gpu_gib: gpu_bytes / GIB,
            fraction: server.mem_fraction_static,
        });
    }
    let mut out = Prediction {
        weights_gib_per_gpu: weights_gib,
        static_gib,
        kv_tokens: None,
        cap: None,
    };
    if model.hybrid {
        return Ok(out);
    }
    let rest = static_bytes - weights;
    let pool = (rest / kv_bytes_per_token(model, &p) as f64).floor() as u64;
    let context_len = server.context_length.unwrap_or(model.context_len);
    if pool < context_len {
        return Err(Unfit::Context {
            parallel: p,
            kv_tokens: pool,
            context_len,
            rest_gib: rest / GIB,
        });
    }
    let tokens = server.max_total_tokens.map_or(pool, |t| t.min(pool));
    let ranks = u64::from(p.dp.max(1));
    out.kv_tokens = Some(tokens);
    out.cap = Some(rank_cap(tokens, context_len, server.max_running_requests) * ranks);
    Ok(out)
}

/// The prediction's error against what the server reported, in percent of the measured value.
pub fn error_pct(predicted: u64, measured: u64) -> Option<f64> {
    (measured > 0).then(|| (predicted as f64 - measured as f64) / measured as f64 * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA_8B: &str = r#"{"hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072, "vocab_size": 128256}"#;

    fn server(tp: u32, gpu_mib: u64, fraction: f64) -> Server {
        Server {
            parallel: Parallel {
                tp,
                ..Parallel::default()
            },
            gpu_mib,
            mem_fraction_static: fraction,
            context_length: None,
            max_running_requests: None,
            max_total_tokens: None,
        }
    }

    #[test]
    fn a_dense_model_gets_its_pool_and_cap_by_sglangs_rules() {
        let m = Model::from_config(LLAMA_8B, 16 << 30).unwrap();
        assert_eq!((m.head_dim, m.kv_heads, m.dtype_bytes), (128, 8, 2));
        // 2 × 32 layers × 8 heads × 128 × 2 bytes = 128 KiB a token.
        assert_eq!(kv_bytes_per_token(&m, &Parallel::default()), 131_072);
        // 80 GiB × 0.9 = 72 GiB static, 16 GiB of weights: 56 GiB of KV = 458,752 tokens.
        let p = predict(&m, &server(1, 80 * 1024, 0.9)).unwrap();
        assert_eq!(p.kv_tokens, Some(458_752));
        // 458,752 ÷ 131,072 × 512 = 1792, held at 2048.
        assert_eq!(p.cap, Some(2048));
        // TP 2: half the weights, half the heads per GPU.
        let p2 = predict(&m, &server(2, 80 * 1024, 0.9)).unwrap();
        assert_eq!(p2.weights_gib_per_gpu, 8.0);
        assert_eq!(p2.kv_tokens, Some(1_048_576));
        // TP 16: 8 KV heads replicated, one a GPU.
        let tp16 = Parallel {
            tp: 16,
            ..Parallel::default()
        };
        assert_eq!(kv_bytes_per_token(&m, &tp16), 131_072 / 8);
    }

    #[test]
    fn dp_ranks_each_have_their_pool_and_cap() {
        let m = Model::from_config(LLAMA_8B, 16 << 30).unwrap();
        let mut s = server(2, 80 * 1024, 0.9);
        s.parallel.dp = 2;
        s.max_running_requests = Some(100);
        let p = predict(&m, &s).unwrap();
        assert_eq!(p.cap, Some(200));
        s.parallel.dp_attention = true;
        // Attention TP 1: every GPU holds all 8 KV heads.
        let attn = predict(&m, &s).unwrap();
        assert_eq!(attn.kv_tokens.unwrap() * 2, p.kv_tokens.unwrap());
    }

    #[test]
    fn a_layout_that_cannot_hold_its_weights_or_one_context_is_named_with_its_numbers() {
        let m = Model::from_config(LLAMA_8B, 120 << 30).unwrap();
        let err = predict(&m, &server(1, 96 * 1024, 0.9)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tp1: weights 120.0 GiB per GPU, the static pool holds 86.4 GiB of 96.0 GiB at \
             mem_fraction_static 0.90"
        );
        assert!(predict(&m, &server(2, 96 * 1024, 0.9)).is_ok());
        // About 1 GiB beside the weights holds about 8,000 tokens: not one 131,072-token request.
        let tight = Model::from_config(LLAMA_8B, (85 << 30) + (400 << 20)).unwrap();
        let err = predict(&tight, &server(1, 96 * 1024, 0.9)).unwrap_err();
        assert!(
            err.to_string()
                .contains("less than one request of the 131072-token context"),
            "{err}"
        );
    }

    #[test]
    fn configs_as_models_write_them() {
        // Newer transformers write `dtype`; a multimodal model nests its language model.
        let nested = r#"{"text_config": {"num_hidden_layers": 4, "num_attention_heads": 8,
            "head_dim": 64, "dtype": "float32", "full_attention_interval": 4}}"#;
        let m = Model::from_config(nested, 1).unwrap();
        assert_eq!(
            (m.layers, m.kv_heads, m.head_dim, m.dtype_bytes),
            (4, 8, 64, 4)
        );
        assert!(m.hybrid);
        let linear = r#"{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64,
            "layer_types": ["linear_attention", "full_attention"]}"#;
        assert!(Model::from_config(linear, 1).unwrap().hybrid);
        let p = predict(&m, &server(1, 1024, 0.5)).unwrap();
        assert_eq!((p.kv_tokens, p.cap), (None, None));
        assert_eq!(
            Model::from_config("{}", 1),
            Err(ModelError::Missing("num_hidden_layers"))
        );
        assert_eq!(error_pct(110, 100), Some(10.0));
        assert_eq!(error_pct(1, 0), None);
    }
}

//! The simulated GPU: how a memory budget becomes KV tokens and mamba slots, the effective
//! running-request cap per mamba strategy, and the time a prefill or decode step takes.
//!
//! Memory (MiB; defaults model the seed GPU, an RTX PRO 6000 Blackwell with 97887 MiB, and a
//! 27B hybrid model in bf16 at `--mem-fraction-static 0.85`):
//! - static pool = mem_fraction_static × GPU memory = 83204;
//! - rest = static pool − weights (49 GiB = 50176) = 33028, minus, under extra_buffer, a fixed
//!   overlap reservation (4.5 GiB: the ping-pong copies of conv/ssm state that overlapped
//!   batches need) = 28420;
//! - mamba pool = rest × r / (1 + r), r = `--mamba-full-memory-ratio` (0.9): 15645 / 13462;
//! - max_mamba_cache_size = mamba pool / 72 MiB per slot = 217 / 186;
//! - KV pool = rest − mamba pool, at 64 KiB per token (16 full-attention layers × 4 KV heads
//!   × 256 dims × K and V × bf16) = 278,130 tokens with no_buffer (239,325 with extra_buffer);
//! - cap = max_mamba_cache_size // slots per request: no_buffer 217 // 3 = 72, extra_buffer
//!   186 // 5 = 37, extra_buffer_lazy 186 // 4 = 46, radix cache disabled 217 // 1; further
//!   limited by `--max-running-requests` and by max_total_num_tokens / 2.
//!
//! A dense model (`--sim-dense`, e.g. the tiny Llama the real-server tests run) has no mamba
//! pool: the KV pool takes all the rest, and the cap is SGLang's general request cap, which on
//! a small pool is far above what the pool holds (see [`general_cap`]); the scheduler then
//! admits what the pool can take under the new-token ratio (`src/sim/batch.rs`).
//!
//! A `--model-path` directory with a `config.json` and weight files gives the weights, KV
//! bytes a token, heads, context and density instead of these defaults (`model_files`).
//!
//! Time (ms of simulated GPU time; divided by `--sim-time-scale` on the wall clock):
//! - decode step with b running requests = (base + per_req × b) / overlap_speedup + copy × b,
//!   where overlap_speedup applies with extra_buffer(_lazy) unless `--disable-overlap-schedule`
//!   and copy (the per-request mamba state copy under extra_buffer on this hardware, 8.34 ms)
//!   is what makes the seed's extra_buffer run 11x slower than no_buffer beyond its lower cap;
//! - prefill batch = prefill_base + prefill_per_token × new tokens.
//! - outside the static pool (what `mem_fraction_static` leaves), the three terms that
//!   0.5.23's `srt/arg_groups/memory_hook.py` (`handle_gpu_memory_settings`) reserves when it
//!   picks the fraction itself: a constant 512 MiB of metadata, the activations of one chunked
//!   prefill (of `max(chunked_prefill_size, 2048)` tokens) and the decode CUDA graphs, which
//!   grow with `--cuda-graph-max-bs-decode` (default 256; `reserve_for_graph_mb`). SGLang's
//!   own estimates (1.5 MB a token, 2 MB a graph size) only choose a default; what a load
//!   really needs is the sim's calibration (`--sim-activation-kib-per-token`, 624 KiB × 8192 =
//!   4992 MiB; `--sim-cuda-graph-gib` at 256, 20 MiB a size), so that a fraction the user sets
//!   too high fails. When these do not fit, graph capture fails with CUDA out of memory
//!   (`srt/model_executor/cuda_graph_runner.py`); a batch above the bound, or any with
//!   `--disable-cuda-graph`, decodes eagerly, 1.3× slower.
//!
//! So at 0.85 the default bound fits with 4 GiB to spare, but past about 0.89 it does not: the
//! best of the space (0.80–0.94 × bounds 16–512) is a bound just above the cap, at the
//! highest static fraction whose graphs still fit (no_buffer 0.923 with 88, see `best`).
//!
//! Over tensor parallelism of t GPUs (t_a = t ÷ attention-DP ranks: `derive_attn_tp_size`), each
//! GPU holds weights ÷ t (`srt/layers/linear.py` shards every projection), a mamba slot ÷ t_a
//! (the linear-attention heads split like the attention heads) and, per token,
//! `kv_kib_per_token × max(1, kv_heads ÷ t_a) ÷ kv_heads` (`get_num_kv_heads` in
//! `srt/configs/model_config.py`: split while there are at least as many KV heads as ranks,
//! replicated beyond). So the KV pool is the per-GPU pool × t in memory and the token count one
//! GPU's pool holds. Each DP rank (replica or attention-DP rank) has its own pool and cap. A
//! step's compute is `base ÷ t + per_req × ⌈b ÷ dp⌉ ÷ t_a` (weights read once per GPU, requests
//! spread over the DP ranks), plus the TP group's all-reduce (`parallel::Parallel`). The sim runs
//! one scheduler for all DP ranks whose step takes one rank's share of the batch: the DP
//! controller round-robins requests, so the ranks run near-equal batches side by side.
//!
//! Calibration at defaults: no_buffer 72 × 988 / (987 × 60.5 + 72 × 7.8) ms ≈ 1,180 tok/s;
//! extra_buffer (43 / 1.15 + 37 × 8.34 = 346 ms steps) ≈ 107 tok/s.

use std::fmt;

use crate::sim::lengths::OutputDist;
use crate::sim::parallel::Parallel;

/// The mamba state strategy after `auto` has been resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    NoBuffer,
    ExtraBuffer,
    ExtraBufferLazy,
}

impl Strategy {
    pub fn parse(s: &str) -> Option<Strategy> {
        match s {
            "no_buffer" => Some(Strategy::NoBuffer),
            "extra_buffer" => Some(Strategy::ExtraBuffer),
            "extra_buffer_lazy" => Some(Strategy::ExtraBufferLazy),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::NoBuffer => "no_buffer",
            Strategy::ExtraBuffer => "extra_buffer",
            Strategy::ExtraBufferLazy => "extra_buffer_lazy",
        }
    }

    fn buffered(self) -> bool {
        self != Strategy::NoBuffer
    }
}

/// The simulated hardware, model and cost parameters (all adjustable through `--sim-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub gpu_total_mib: f64,
    pub weights_mib: f64,
    pub mamba_slot_mib: f64,
    pub kv_kib_per_token: f64,
    pub overlap_reserve_mib: f64,
    pub cuda_graph_mib: f64,
    /// Fixed memory outside the static pool besides activations and graphs.
    pub reserved_mib: f64,
    /// Activation memory of one prefill token: a chunked prefill of N tokens needs N of these.
    pub activation_kib_per_token: f64,
    pub model_context_len: u64,
    pub decode_base_ms: f64,
    pub decode_per_req_ms: f64,
    pub overlap_speedup: f64,
    pub extra_buffer_copy_ms: f64,
    pub prefill_base_ms: f64,
    pub prefill_per_token_ms: f64,
    pub mean_output_tokens: u64,
    pub mean_prompt_tokens: u64,
    /// How natural output lengths are distributed (`uniform` scales `mean_output_tokens`).
    pub output_dist: OutputDist,
    /// Mixed into each prompt's hash for its length draw; 0 keeps the historical draws.
    pub output_seed: u64,
    /// A dense model: no mamba state, every layer full attention.
    pub dense: bool,
    /// `num_attention_heads`: the attention-TP size must divide it.
    pub attention_heads: u64,
    /// `num_key_value_heads`: what `kv_kib_per_token` holds, split over attention TP.
    pub kv_heads: u64,
    /// What a step all-reduces per token over a TP group.
    pub allreduce_mib_per_token: f64,
}

impl Params {
    /// The natural output length (before the max-tokens and context caps) of a prompt.
    pub fn natural_output_len(&self, prompt_hash: u64) -> u64 {
        self.output_dist
            .draw(prompt_hash, self.output_seed, self.mean_output_tokens)
    }

    /// The mean output length of the default workload behind `ideal_output_tok_s`: the
    /// distribution's analytic mean, deliberately without the max-tokens and context caps
    /// (a heavy tail meant to hit max tokens overstates it; kept simple on purpose).
    pub fn mean_output_len(&self) -> f64 {
        self.output_dist.mean(self.mean_output_tokens)
    }
}

impl Default for Params {
    fn default() -> Self {
        Params {
            gpu_total_mib: 97887.0,
            weights_mib: 49.0 * 1024.0,
            mamba_slot_mib: 72.0,
            kv_kib_per_token: 64.0,
            overlap_reserve_mib: 4.5 * 1024.0,
            cuda_graph_mib: 5.0 * 1024.0,
            reserved_mib: RESERVED_MIB,
            activation_kib_per_token: 624.0,
            model_context_len: 262_144,
            decode_base_ms: 24.5,
            decode_per_req_ms: 0.5,
            overlap_speedup: 1.15,
            extra_buffer_copy_ms: 8.34,
            prefill_base_ms: 3.0,
            prefill_per_token_ms: 0.05,
            mean_output_tokens: 988,
            mean_prompt_tokens: 96,
            output_dist: OutputDist::Uniform,
            output_seed: 0,
            dense: false,
            attention_heads: 32,
            kv_heads: 4,
            allreduce_mib_per_token: 1.25,
        }
    }
}

/// The server flags that shape the memory plan and the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub mem_fraction_static: f64,
    pub strategy: Strategy,
    pub radix_cache_disabled: bool,
    pub overlap_disabled: bool,
    pub max_running_requests: Option<u64>,
    pub max_mamba_cache_size: Option<u64>,
    pub mamba_full_memory_ratio: f64,
    pub context_length: Option<u64>,
    pub max_total_tokens: Option<u64>,
    /// `--chunked-prefill-size`; `None` when -1 turns chunking off.
    pub chunked_prefill_size: Option<u64>,
    /// `--schedule-conservativeness`: scales the new-token ratio admission leans on.
    pub schedule_conservativeness: f64,
    pub max_prefill_tokens: u64,
    /// `--stream-interval`: streamed requests hear about every this many tokens (and the last).
    pub stream_interval: u64,
    /// `--cuda-graph-max-bs-decode`: the largest decode batch captured as a CUDA graph;
    /// `None` with `--disable-cuda-graph`.
    pub cuda_graph_max_bs: Option<u64>,
    /// `--page-size`: the radix cache matches whole pages.
    pub page_size: Option<u64>,
    /// Tensor and data parallelism, and the link the TP group all-reduces over.
    pub parallel: Parallel,
}

impl Default for Settings {
    /// SGLang's defaults for one GPU with the 0.85 static fraction the sim assumes.
    fn default() -> Self {
        Settings {
            mem_fraction_static: 0.85,
            strategy: Strategy::NoBuffer,
            radix_cache_disabled: false,
            overlap_disabled: false,
            max_running_requests: None,
            max_mamba_cache_size: None,
            mamba_full_memory_ratio: 0.9,
            context_length: None,
            max_total_tokens: None,
            chunked_prefill_size: Some(8192),
            schedule_conservativeness: 1.0,
            max_prefill_tokens: 16384,
            stream_interval: 1,
            cuda_graph_max_bs: Some(DEFAULT_CUDA_GRAPH_MAX_BS),
            page_size: None,
            parallel: Parallel::default(),
        }
    }
}

/// The decode graph bound when none is given. SGLang's `srt/arg_groups/memory_hook.py`
/// (`handle_gpu_memory_settings`) picks it from the GPU's memory and the TP size; the sim
/// models the one value a single large GPU at TP 1 gets, at which `cuda_graph_mib` is measured.
pub const DEFAULT_CUDA_GRAPH_MAX_BS: u64 = 256;

/// `srt/arg_groups/memory_hook.py` `handle_gpu_memory_settings`: "Constant meta data (e.g.,
/// from attention backend)", the first term of the memory it keeps outside the static pool.
pub const RESERVED_MIB: f64 = 512.0;

/// How much slower a decode step runs eagerly than replayed from a graph. In
/// `srt/model_executor/cuda_graph_runner.py`, `can_run` is false for a batch above the largest
/// captured size, and `model_runner.forward_decode` then launches every kernel itself.
pub const EAGER_DECODE_FACTOR: f64 = 1.3;

/// Why loading the model fails, with the numbers the log shows.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    /// The static pool cannot hold the weights plus any cache (SGLang's "Not enough memory").
    NotEnoughMemory,
    /// What is left outside the static pool cannot hold CUDA graph capture.
    CudaGraphOom { needed_mib: f64, free_mib: f64 },
    /// The attention-TP size does not divide the attention heads (raised as the model is built,
    /// before any weight loads).
    HeadsNotDivisible { heads: u64, tp: u64 },
}

/// The memory plan and cost model of one configured server.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub params: Params,
    pub settings: Settings,
    pub static_mib: f64,
    pub mamba_mib: f64,
    pub kv_mib: f64,
    pub max_mamba_cache_size: u64,
    pub slots_per_request: u64,
    pub max_total_num_tokens: u64,
    /// effective_max_running_requests_per_dp.
    pub cap: u64,
    pub context_len: u64,
    pub overlap: bool,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotEnoughMemory => write!(
                f,
                "Not enough memory. Please try to increase --mem-fraction-static."
            ),
            LoadError::CudaGraphOom {
                needed_mib,
                free_mib,
            } => write!(
                f,
                "CUDA out of memory. Tried to allocate {:.2} GiB. GPU 0 has {:.2} GiB free.",
                needed_mib / 1024.0,
                free_mib / 1024.0
            ),
            LoadError::HeadsNotDivisible { heads, tp } => write!(
                f,
                "Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."
            ),
        }
    }
}

/// `Qwen3NextAttention.__init__` (`srt/models/qwen3_next.py`): `assert self.total_num_heads %
/// self.attn_tp_size == 0`.
pub fn check_heads(params: &Params, settings: &Settings) -> Result<(), LoadError> {
    let tp = settings.parallel.attn_tp.max(1);
    if !params.attention_heads.is_multiple_of(tp) {
        return Err(LoadError::HeadsNotDivisible {
            heads: params.attention_heads,
            tp,
        });
    }
    Ok(())
}

/// KV cache per token on one GPU: the KV heads split over attention TP, one per GPU at least.
pub fn kv_kib_per_token_per_gpu(params: &Params, settings: &Settings) -> f64 {
    let kv = params.kv_heads.max(1);
    let per_gpu = (kv / settings.parallel.attn_tp.max(1)).max(1);
    params.kv_kib_per_token * per_gpu as f64 / kv as f64
}

/// The weights one GPU holds.
pub fn weights_per_gpu_mib(params: &Params, settings: &Settings) -> f64 {
    params.weights_mib / settings.parallel.tp.max(1) as f64
}

/// Computes one GPU's memory plan (every GPU of the group holds the same); fails the way
/// SGLang's load fails when memory does not fit.
pub fn plan(params: &Params, settings: &Settings) -> Result<Plan, LoadError> {
    check_heads(params, settings)?;
    let static_mib = settings.mem_fraction_static * params.gpu_total_mib;
    let slot_mib = params.mamba_slot_mib / settings.parallel.attn_tp.max(1) as f64;
    let hybrid_buffered = !params.dense && settings.strategy.buffered();
    let overlap = if params.dense {
        !settings.overlap_disabled
    } else {
        hybrid_buffered && !settings.overlap_disabled
    };
    let reserve = if hybrid_buffered {
        params.overlap_reserve_mib
    } else {
        0.0
    };
    let rest = static_mib - weights_per_gpu_mib(params, settings) - reserve;
    if rest <= 0.0 {
        return Err(LoadError::NotEnoughMemory);
    }
    let (mamba_mib, max_mamba_cache_size) = match settings.max_mamba_cache_size {
        _ if params.dense => (0.0, 0),
        Some(n) => (n as f64 * slot_mib, n),
        None => {
            let r = settings.mamba_full_memory_ratio;
            let m = rest * r / (1.0 + r);
            (m, (m / slot_mib).floor() as u64)
        }
    };
    let kv_mib = rest - mamba_mib;
    let kv_tokens = (kv_mib * 1024.0 / kv_kib_per_token_per_gpu(params, settings)).floor();
    if kv_tokens < 1.0 {
        return Err(LoadError::NotEnoughMemory);
    }
    let max_total_num_tokens = match settings.max_total_tokens {
        Some(t) => t.min(kv_tokens as u64),
        None => kv_tokens as u64,
    };
    let slots_per_request = if settings.radix_cache_disabled {
        1
    } else {
        match settings.strategy {
            Strategy::NoBuffer => 3,
            Strategy::ExtraBuffer => 5,
            Strategy::ExtraBufferLazy => 4,
        }
    };
    let context_len = settings.context_length.unwrap_or(params.model_context_len);
    let mut cap = general_cap(
        max_total_num_tokens,
        context_len,
        settings.max_running_requests,
    );
    if !params.dense {
        cap = cap.min(max_mamba_cache_size / slots_per_request);
    }
    if cap == 0 {
        return Err(LoadError::NotEnoughMemory);
    }
    let free_mib = params.gpu_total_mib - static_mib;
    let needed_mib = outside_pool_mib(params, settings);
    if free_mib < needed_mib {
        return Err(LoadError::CudaGraphOom {
            needed_mib,
            free_mib,
        });
    }
    Ok(Plan {
        params: params.clone(),
        settings: settings.clone(),
        static_mib,
        mamba_mib,
        kv_mib,
        max_mamba_cache_size,
        slots_per_request,
        max_total_num_tokens,
        cap,
        context_len,
        overlap,
    })
}

/// The request cap before any mamba limit, as 0.5.23's `resolve_max_num_reqs`
/// (`srt/mem_cache/kv_cache_configurator.py`) derives it: `--max-running-requests` if given,
/// else `token_capacity / context_len × 512` held within 2048–4096; either way at most half the
/// token capacity. On a dense model this is the cap `/server_info` reports
/// (`effective_max_running_requests_per_dp`): 4096 for a 16,384-token pool, where a few hundred
/// requests fill the pool.
pub fn general_cap(token_capacity: u64, context_len: u64, requested: Option<u64>) -> u64 {
    let half = token_capacity / 2;
    match requested {
        Some(r) => r.max(1).min(half),
        None => {
            let estimated = (token_capacity as f64 / context_len.max(1) as f64 * 512.0) as u64;
            estimated.clamp(2048, 4096).min(half)
        }
    }
}

/// What a server needs outside the static pool: the reserve, one chunked prefill's activations
/// and the decode graphs. `model_runner.py` sizes the static pool from `mem_fraction_static`
/// alone, so nothing checks this before graph capture runs out of memory.
pub fn outside_pool_mib(params: &Params, settings: &Settings) -> f64 {
    // `activation_tokens` in memory_hook.py: the chunk (or, unchunked, the prefill budget),
    // never under 2048.
    let chunk = settings
        .chunked_prefill_size
        .unwrap_or(settings.max_prefill_tokens)
        .max(2048);
    params.reserved_mib
        + params.activation_kib_per_token * chunk as f64 / 1024.0
        + graph_mib(params, settings)
}

/// The memory CUDA graph capture takes outside the static pool: `cuda_graph_runner.py`
/// captures every batch size up to the bound into one memory pool, which the largest size
/// fills, so it grows with the bound (`cuda_graph_mib` at the default bound).
pub fn graph_mib(params: &Params, settings: &Settings) -> f64 {
    settings.cuda_graph_max_bs.map_or(0.0, |bs| {
        params.cuda_graph_mib * bs as f64 / DEFAULT_CUDA_GRAPH_MAX_BS as f64
    })
}

impl Plan {
    /// The running-request cap of the whole server: each DP rank's cap, summed (what fleet
    /// reads from `internal_states`).
    pub fn running_cap(&self) -> u64 {
        self.cap * self.settings.parallel.dp_ranks.max(1)
    }

    /// KV tokens of the whole server: each DP rank's pool, summed.
    pub fn pool_tokens(&self) -> u64 {
        self.max_total_num_tokens * self.settings.parallel.dp_ranks.max(1)
    }

    /// Simulated seconds of one decode step with `batch` running requests over all DP ranks.
    pub fn decode_step_secs(&self, batch: u64) -> f64 {
        let p = &self.params;
        let par = &self.settings.parallel;
        let rank_batch = par.per_rank(batch);
        let b = rank_batch as f64;
        let (tp, attn_tp) = (par.tp.max(1) as f64, par.attn_tp.max(1) as f64);
        let mut ms = p.decode_base_ms / tp + p.decode_per_req_ms * b / attn_tp;
        if self.overlap {
            ms /= p.overlap_speedup;
        }
        // A batch the graphs do not cover runs eagerly (see EAGER_DECODE_FACTOR).
        if self
            .settings
            .cuda_graph_max_bs
            .is_none_or(|bs| rank_batch > bs)
        {
            ms *= EAGER_DECODE_FACTOR;
        }
        if !p.dense && self.settings.strategy.buffered() {
            ms += p.extra_buffer_copy_ms * b / attn_tp;
        }
        ms += par.allreduce_ms(batch, p.allreduce_mib_per_token);
        ms / 1000.0
    }

    /// Simulated seconds of one prefill batch over `tokens` new prompt tokens.
    pub fn prefill_secs(&self, tokens: u64) -> f64 {
        let p = &self.params;
        let par = &self.settings.parallel;
        let ms = p.prefill_base_ms / par.tp.max(1) as f64
            + p.prefill_per_token_ms * par.per_rank(tokens) as f64 / par.attn_tp.max(1) as f64
            + par.allreduce_ms(tokens, p.allreduce_mib_per_token);
        ms / 1000.0
    }

    /// The batch size the default workload sustains over all DP ranks: the caps, unless KV
    /// tokens bind first.
    pub fn saturated_batch(&self) -> u64 {
        let per_req = self.params.mean_prompt_tokens + self.params.mean_output_len().round() as u64;
        self.running_cap()
            .min(self.pool_tokens() / per_req.max(1))
            .max(1)
    }

    /// Saturated output tokens per simulated second for the default workload: the batch holds
    /// `saturated_batch` requests, each finished request is replaced by a one-request prefill
    /// (which yields its first token), and the other L−1 tokens come from decode steps. DP
    /// ranks prefill side by side.
    pub fn ideal_output_tok_s(&self) -> f64 {
        let b = self.saturated_batch() as f64;
        let l = self.params.mean_output_len().max(2.0);
        let step = self.decode_step_secs(self.saturated_batch());
        let prefill = self.prefill_secs(self.params.mean_prompt_tokens)
            / self.settings.parallel.dp_ranks.max(1) as f64;
        b * l / ((l - 1.0) * step + b * prefill)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Typical launch settings (mem fraction 0.85, 8192-token context) with `strategy`.
    pub(crate) fn settings(strategy: Strategy) -> Settings {
        Settings {
            mem_fraction_static: 0.85,
            strategy,
            radix_cache_disabled: false,
            overlap_disabled: false,
            max_running_requests: None,
            max_mamba_cache_size: None,
            mamba_full_memory_ratio: 0.9,
            context_length: Some(8192),
            max_total_tokens: None,
            chunked_prefill_size: Some(8192),
            schedule_conservativeness: 1.0,
            max_prefill_tokens: 16384,
            stream_interval: 1,
            cuda_graph_max_bs: Some(DEFAULT_CUDA_GRAPH_MAX_BS),
            page_size: None,
            parallel: Parallel::default(),
        }
    }

    #[test]
    fn seed_gpu_calibration() {
        let p = Params::default();
        let nb = plan(&p, &settings(Strategy::NoBuffer)).unwrap();
        assert_eq!(nb.max_mamba_cache_size, 217);
        assert_eq!(nb.cap, 72);
        let nb_tok = nb.ideal_output_tok_s();
        assert!((nb_tok - 1180.0).abs() < 12.0, "no_buffer {nb_tok}");
        let eb = plan(&p, &settings(Strategy::ExtraBuffer)).unwrap();
        assert_eq!(eb.cap, 37);
        let eb_tok = eb.ideal_output_tok_s();
        assert!((eb_tok - 107.0).abs() < 2.0, "extra_buffer {eb_tok}");
        assert!(nb_tok / eb_tok > 10.0);
        let lazy = plan(&p, &settings(Strategy::ExtraBufferLazy)).unwrap();
        assert_eq!(lazy.cap, 46);
        let mut no_radix = settings(Strategy::NoBuffer);
        no_radix.radix_cache_disabled = true;
        assert_eq!(plan(&p, &no_radix).unwrap().cap, 217);
    }

    #[test]
    fn extra_buffer_wins_when_the_cap_does_not_bind_and_copies_are_free() {
        let p = Params {
            extra_buffer_copy_ms: 0.0,
            ..Params::default()
        };
        let mut nb = settings(Strategy::NoBuffer);
        nb.max_running_requests = Some(32);
        let mut eb = settings(Strategy::ExtraBuffer);
        eb.max_running_requests = Some(32);
        let nb = plan(&p, &nb).unwrap();
        let eb = plan(&p, &eb).unwrap();
        assert_eq!((nb.cap, eb.cap), (32, 32));
        assert!(eb.ideal_output_tok_s() > 1.1 * nb.ideal_output_tok_s());
    }

    #[test]
    fn memory_failures() {
        let p = Params::default();
        let mut low = settings(Strategy::NoBuffer);
        low.mem_fraction_static = 0.5;
        assert_eq!(plan(&p, &low), Err(LoadError::NotEnoughMemory));
        let mut high = settings(Strategy::NoBuffer);
        high.mem_fraction_static = 0.95;
        assert!(matches!(
            plan(&p, &high),
            Err(LoadError::CudaGraphOom { .. })
        ));
        // The default bound's graphs, one chunked prefill and the reserve fit beside 0.89 but
        // not 0.90; with a bound of 18 at most, beside 0.94.
        high.mem_fraction_static = 0.89;
        assert!(plan(&p, &high).is_ok());
        high.mem_fraction_static = 0.90;
        assert!(matches!(
            plan(&p, &high),
            Err(LoadError::CudaGraphOom { .. })
        ));
        high.mem_fraction_static = 0.94;
        high.cuda_graph_max_bs = Some(16);
        assert!(plan(&p, &high).is_ok());
        high.cuda_graph_max_bs = Some(19);
        assert!(plan(&p, &high).is_err());
    }

    #[test]
    fn step_time_grows_with_batch() {
        let nb = plan(&Params::default(), &settings(Strategy::NoBuffer)).unwrap();
        assert!(nb.decode_step_secs(72) > nb.decode_step_secs(1));
        assert!((nb.decode_step_secs(72) - 0.0605).abs() < 1e-9);
    }

    #[test]
    fn a_dense_model_reports_the_general_cap_not_what_its_pool_holds() {
        // The tiny Llama: --max-total-tokens 16384, a 2048-token context.
        let p = Params {
            dense: true,
            ..Params::default()
        };
        let mut s = settings(Strategy::NoBuffer);
        s.max_total_tokens = Some(16_384);
        s.context_length = Some(2048);
        let dense = plan(&p, &s).unwrap();
        assert_eq!(dense.max_total_num_tokens, 16_384);
        assert_eq!(dense.cap, 4096);
        assert_eq!(dense.max_mamba_cache_size, 0);
        // A 48 + 4 token request: the pool holds 315 of them.
        assert_eq!(dense.max_total_num_tokens / 52, 315);
        s.max_running_requests = Some(64);
        assert_eq!(plan(&p, &s).unwrap().cap, 64);
        assert_eq!(general_cap(3000, 2048, None), 1500);
        assert_eq!(general_cap(10_000_000, 2048, None), 4096);
    }
}

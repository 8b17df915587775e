//! The `--sim-*` knobs: the sim's own options beside SGLang's, each also settable as
//! `SGLANG_SIM_*` (see `config::env_name`), with their defaults and help.

use crate::sim::argparse::Kind;
use crate::sim::config::{DEFAULT_PYTHON, DEFAULT_VERSION};
use crate::sim::parallel;

pub struct SimOpt {
    pub name: &'static str,
    pub kind: Kind,
    pub flag: bool,
    pub default: &'static str,
    pub help: &'static str,
}

const fn knob(name: &'static str, kind: Kind, default: &'static str, help: &'static str) -> SimOpt {
    SimOpt {
        name,
        kind,
        flag: false,
        default,
        help,
    }
}

const fn switch(name: &'static str, help: &'static str) -> SimOpt {
    SimOpt {
        name,
        kind: Kind::Str,
        flag: true,
        default: "False",
        help,
    }
}

pub const SIM_OPTS: &[SimOpt] = &[
    knob(
        "--sim-version",
        Kind::Str,
        DEFAULT_VERSION,
        "SGLang version to emulate: picks the accepted options, what `auto` resolves to and the reported version.",
    ),
    knob(
        "--sim-python",
        Kind::Str,
        DEFAULT_PYTHON,
        "Python version whose argparse renders --help: from 3.13 an entry's metavar follows only its last alias.",
    ),
    knob(
        "--sim-time-scale",
        Kind::Float,
        "1",
        "Run this many times faster than real time (startup, prefill and decode alike).",
    ),
    knob(
        "--sim-startup-secs",
        Kind::Float,
        "30",
        "Simulated model load time in seconds before the server is ready.",
    ),
    knob(
        "--sim-gpu-mem-gib",
        Kind::Float,
        "95.59",
        "Simulated GPU memory in GiB (default 97887 MiB: RTX PRO 6000 Blackwell Server Edition).",
    ),
    knob(
        "--sim-weights-gib",
        Kind::Float,
        "49",
        "Model weights in GiB (27B parameters in bf16); by default the bytes of the *.safetensors files where --model-path is a directory with a config.json.",
    ),
    knob(
        "--sim-model-context-length",
        Kind::Int,
        "262144",
        "The model's own context length (config.json max_position_embeddings where --model-path has one), used without --context-length.",
    ),
    knob(
        "--sim-attention-heads",
        Kind::Int,
        "32",
        "The model's attention heads (config.json num_attention_heads): a tensor-parallel size that does not divide them fails at load.",
    ),
    knob(
        "--sim-kv-heads",
        Kind::Int,
        "4",
        "The model's KV heads (num_key_value_heads): --sim-kv-kib-per-token splits over TP while there are at least as many heads as ranks, and is replicated beyond.",
    ),
    knob(
        "--sim-allreduce-mib-per-token",
        Kind::Float,
        "1.25",
        "What one token of a step all-reduces over a TP group, MiB (64 layers x 2 all-reduces x hidden 5120 x bf16).",
    ),
    knob(
        "--sim-link-gb-s",
        Kind::Str,
        parallel::DEFAULT_GB_S,
        "Effective all-reduce bandwidth of each link class, GB/s (NV: per bonded link; NET: between nodes).",
    ),
    knob(
        "--sim-link-latency-ms",
        Kind::Str,
        parallel::DEFAULT_LATENCY_MS,
        "All-reduce latency of one step per extra rank of a TP group, by link class, ms.",
    ),
    knob(
        "--sim-mamba-slot-mib",
        Kind::Float,
        "72",
        "Memory of one mamba state slot (conv + ssm state of all linear-attention layers), MiB.",
    ),
    knob(
        "--sim-kv-kib-per-token",
        Kind::Float,
        "64",
        "KV cache per token over the full-attention layers, KiB; by default from --model-path's config.json where it has one (K and V x layers x KV heads x head dim x dtype bytes).",
    ),
    knob(
        "--sim-overlap-reserve-gib",
        Kind::Float,
        "4.5",
        "Memory extra_buffer strategies reserve for overlapped state copies before the mamba/KV split, GiB.",
    ),
    knob(
        "--sim-cuda-graph-gib",
        Kind::Float,
        "5",
        "Memory the decode CUDA graphs need outside the static pool at --cuda-graph-max-bs-decode 256, GiB (in proportion to the bound).",
    ),
    knob(
        "--sim-activation-kib-per-token",
        Kind::Float,
        "624",
        "Activation memory outside the static pool per token of one chunked prefill (--chunked-prefill-size), KiB.",
    ),
    knob(
        "--sim-decode-base-ms",
        Kind::Float,
        "24.5",
        "Fixed cost of one decode step, ms.",
    ),
    knob(
        "--sim-decode-per-req-ms",
        Kind::Float,
        "0.5",
        "Cost of one decode step per running request, ms.",
    ),
    knob(
        "--sim-overlap-speedup",
        Kind::Float,
        "1.15",
        "Decode speedup from overlap scheduling (extra_buffer strategies only).",
    ),
    knob(
        "--sim-extra-buffer-copy-ms",
        Kind::Float,
        "8.34",
        "Per-request mamba state copy cost per decode step under extra_buffer on this hardware, ms (calibrated to the seed's 107 tok/s).",
    ),
    knob(
        "--sim-prefill-base-ms",
        Kind::Float,
        "3",
        "Fixed cost of one prefill batch, ms.",
    ),
    knob(
        "--sim-prefill-per-token-ms",
        Kind::Float,
        "0.05",
        "Prefill cost per prompt token, ms.",
    ),
    knob(
        "--sim-mean-output-tokens",
        Kind::Int,
        "988",
        "Mean natural output length (before max tokens and context caps).",
    ),
    knob(
        "--sim-output-dist",
        Kind::Str,
        "uniform",
        "Distribution of natural output lengths: uniform ([0.5, 1.5] x --sim-mean-output-tokens), uniform:LO:HI, lognormal:MEDIAN:SIGMA or bimodal:SHORT:LONG:SHARE (SHARE of [0.8, 1.2] x LONG, else [0.5, 1.5] x SHORT).",
    ),
    knob(
        "--sim-output-seed",
        Kind::Int,
        "0",
        "Seed mixed into each prompt's output length draw; 0 keeps the historical draws.",
    ),
    knob(
        "--sim-mean-prompt-tokens",
        Kind::Int,
        "96",
        "Prompt length of the default workload behind ideal_output_tok_s.",
    ),
    knob(
        "--sim-die-after",
        Kind::Int,
        "None",
        "Crash abruptly after N completed requests; 0 crashes during model load.",
    ),
    knob(
        "--sim-fail-rate",
        Kind::Float,
        "0",
        "Fraction of generation requests answered with HTTP 500.",
    ),
    knob(
        "--sim-seed",
        Kind::Int,
        "0",
        "Seed of the fault injection draws.",
    ),
    switch(
        "--sim-instant",
        "Answer generation requests at once with realistic bodies, without scheduling (client benchmarks).",
    ),
    switch(
        "--sim-dense",
        "Simulate a dense model (every layer full attention, no mamba state): the cap is SGLang's general request cap and the KV pool alone bounds what runs.",
    ),
    switch(
        "--sim-ignore-sigterm",
        "Ignore SIGTERM (to test SIGKILL escalation); SIGINT still stops the server.",
    ),
    knob(
        "--sim-gpu-state-dir",
        Kind::Str,
        "/tmp/sglang-sim-gpus",
        "Where the fake GPU state file gpu<N>-<pid>.json is written (N: first CUDA_VISIBLE_DEVICES entry).",
    ),
];

//! The sim's command line: SGLang's option table for the chosen version plus the `--sim-*`
//! knobs (each also settable as `SGLANG_SIM_*`), resolved into one typed `Config`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use crate::layout::topology::Board;
use crate::sim::argparse::{self, Kind, Nargs, OptSpec, Outcome, Parsed, Parser, Value};
use crate::sim::config_file;
use crate::sim::knobs::SIM_OPTS;
use crate::sim::lengths::{self, OutputDist};
use crate::sim::model::{Params, Settings, Strategy};
use crate::sim::model_files::{self, Shape};
use crate::sim::parallel::{self, DeviceError, Layout, Parallel, PerLink};
use crate::sim::server_args::{self, Refusal};

pub const DEFAULT_VERSION: &str = "0.5.23";
/// SGLang supports Python 3.11 and later; 3.12 is what its images ship.
pub const DEFAULT_PYTHON: &str = "3.12";

/// The environment variable that sets a `--sim-*` option.
pub fn env_name(option: &str) -> String {
    format!(
        "SGLANG_{}",
        option
            .trim_start_matches("--")
            .replace('-', "_")
            .to_uppercase()
    )
}

fn sim_specs() -> Vec<OptSpec> {
    SIM_OPTS
        .iter()
        .map(|o| OptSpec {
            names: vec![o.name.to_string()],
            nargs: if o.flag { Nargs::Zero } else { Nargs::One },
            choices: Vec::new(),
            default: o.default.to_string(),
            kind: o.kind,
            required: false,
            help: format!(
                "{} Env: {}. (default: {})",
                o.help,
                env_name(o.name),
                o.default
            ),
        })
        .collect()
}

/// The version to emulate: `--sim-version V` / `--sim-version=V` on the command line, else
/// `SGLANG_SIM_VERSION`, else the default. It is read first because it picks the option table.
pub fn requested_version(args: &[String]) -> String {
    early_knob(args, "--sim-version", DEFAULT_VERSION)
}

/// A knob needed before parsing (it shapes the parser): the flag, else its environment
/// variable, else `default`.
fn early_knob(args: &[String], name: &str, default: &str) -> String {
    let mut it = args.iter();
    let inline = format!("{name}=");
    while let Some(a) = it.next() {
        if a == name {
            if let Some(v) = it.next() {
                return v.clone();
            }
        } else if let Some(v) = a.strip_prefix(&inline) {
            return v.to_string();
        }
    }
    std::env::var(env_name(name)).unwrap_or_else(|_| default.to_string())
}

/// The parser for a version: SGLang's options, then the sim's own group.
pub fn parser_for(version: &str, python: &str) -> Result<Parser, String> {
    let v = argparse::parse_version(version).ok_or_else(|| {
        format!("argument --sim-version: invalid version: '{version}' (expected e.g. 0.5.23)")
    })?;
    let (table, aliases) = argparse::table_for(v);
    let mut opts = argparse::load_table(table);
    if aliases {
        opts.extend(argparse::deprecated_aliases());
    }
    let python = argparse::parse_version(&format!("{python}.0")).ok_or_else(|| {
        format!("argument --sim-python: invalid version: '{python}' (expected e.g. 3.13)")
    })?;
    Ok(Parser {
        metavar_once: python >= (3, 13, 0),
        description: format!(
            "sglang-sim emulating SGLang {version}: a stand-in for `python -m \
             sglang.launch_server` that accepts exactly this version's options, serves its HTTP \
             API and simulates a hybrid model on one GPU. SGLang options the sim does not model \
             are accepted and ignored."
        ),
        groups: vec![
            ("options".to_string(), opts),
            ("sglang-sim options".to_string(), sim_specs()),
        ],
    })
}

/// Everything the sim needs, typed.
#[derive(Debug, Clone)]
pub struct Config {
    pub version: String,
    pub host: String,
    pub port: u16,
    pub model_path: String,
    pub served_model_name: String,
    pub api_key: Option<String>,
    pub enable_metrics: bool,
    pub time_scale: f64,
    pub startup_secs: f64,
    pub die_after: Option<u64>,
    pub fail_rate: f64,
    pub seed: u64,
    pub instant: bool,
    pub ignore_sigterm: bool,
    pub gpu_state_dir: PathBuf,
    /// The GPUs this node's ranks take, or why one cannot be had (found at load).
    pub local_gpus: Result<Vec<u32>, DeviceError>,
    pub layout: Layout,
    pub params: Params,
    pub settings: Settings,
    /// The server args as `/server_info` reports them (dest → value).
    pub server_args: Map<String, Json>,
    /// What SGLang logs while resolving the arguments (e.g. overlap turned off on 0.5.10).
    pub startup_warnings: Vec<String>,
    /// The arguments after `--config` was merged, joined: `/server_info`'s `launch_command`.
    pub launch_command: String,
}

/// Source of a `--sim-*` value: the flag, else its environment variable.
fn sim_raw(parsed: &Parsed, name: &str) -> Result<Option<(String, String)>, String> {
    let dest = name.trim_start_matches("--").replace('-', "_");
    if let Some(Value::One(v)) = parsed.given.get(&dest) {
        return Ok(Some((format!("argument {name}"), v.clone())));
    }
    if let Some(Value::Bool(b)) = parsed.given.get(&dest) {
        return Ok(Some((format!("argument {name}"), b.to_string())));
    }
    let env = env_name(name);
    match std::env::var(&env) {
        Ok(v) => Ok(Some((format!("environment variable {env}"), v))),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("environment variable {env}: not UTF-8"))
        }
    }
}

fn sim_f64(parsed: &Parsed, name: &str) -> Result<f64, String> {
    let default = SIM_OPTS.iter().find(|o| o.name == name).map(|o| o.default);
    match sim_raw(parsed, name)? {
        Some((src, v)) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("{src}: invalid non-negative number: '{v}'")),
        None => Ok(default.and_then(|d| d.parse().ok()).unwrap_or(0.0)),
    }
}

fn sim_u64(parsed: &Parsed, name: &str) -> Result<Option<u64>, String> {
    match sim_raw(parsed, name)? {
        Some((src, v)) => v
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| format!("{src}: invalid non-negative int value: '{v}'")),
        None => Ok(SIM_OPTS
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.default.parse().ok())),
    }
}

fn sim_output_dist(parsed: &Parsed) -> Result<OutputDist, String> {
    match sim_raw(parsed, "--sim-output-dist")? {
        Some((src, v)) => OutputDist::parse(&v)
            .ok_or_else(|| format!("{src}: invalid value '{v}': {}", lengths::EXPECTED)),
        None => Ok(OutputDist::Uniform),
    }
}

fn sim_bool(parsed: &Parsed, name: &str) -> Result<bool, String> {
    match sim_raw(parsed, name)? {
        Some((src, v)) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            _ => Err(format!("{src}: invalid boolean: '{v}' (use 1 or 0)")),
        },
        None => Ok(false),
    }
}

fn num<T: std::str::FromStr>(parsed: &Parsed, dest: &str) -> Option<T> {
    parsed.str(dest).and_then(|v| v.trim().parse().ok())
}

/// Python-repr default from the option table, as JSON.
fn default_json(default: &str) -> Json {
    match default {
        "None" | "?" => Json::Null,
        "True" => Json::Bool(true),
        "False" => Json::Bool(false),
        "[]" => Json::Array(Vec::new()),
        d => {
            if let Ok(i) = d.parse::<i64>() {
                Json::from(i)
            } else if let Ok(f) = d.parse::<f64>() {
                Json::from(f)
            } else {
                Json::String(d.to_string())
            }
        }
    }
}

fn given_json(spec: &OptSpec, v: &Value) -> Json {
    let one = |s: &str| match spec.kind {
        Kind::Int => s
            .trim()
            .parse::<i64>()
            .map(Json::from)
            .unwrap_or(Json::Null),
        Kind::Float => s
            .trim()
            .parse::<f64>()
            .map(Json::from)
            .unwrap_or(Json::Null),
        Kind::Str => Json::String(s.to_string()),
    };
    match v {
        Value::Bool(b) => Json::Bool(*b),
        Value::One(s) => one(s),
        Value::Many(vs) => Json::Array(vs.iter().map(|s| one(s)).collect()),
        Value::Missing => Json::Null,
    }
}

/// The layout flags, resolved (and refused) as SGLang's start-up does.
fn parallel_layout(parsed: &Parsed) -> Result<Layout, Refusal> {
    let int = |dest: &str, default: i64| num::<i64>(parsed, dest).unwrap_or(default);
    parallel::Layout::resolve(&parallel::Given {
        tp: int("tp_size", 1),
        dp: int("dp_size", 1),
        attn_dp: num(parsed, "attn_dp_size"),
        enable_dp_attention: parsed.flag("enable_dp_attention"),
        ep: int("ep_size", 1),
        nnodes: int("nnodes", 1),
        node_rank: int("node_rank", 0),
        base_gpu_id: int("base_gpu_id", 0),
        gpu_id_step: int("gpu_id_step", 1),
        dist_init_addr: parsed.str("dist_init_addr").map(str::to_string),
        dist_timeout_secs: num(parsed, "dist_timeout"),
    })
}

/// The board `FAKE_NVIDIA_SMI_TOPO` names (what the fake `nvidia-smi topo -m` prints), and a
/// warning when it is named but cannot be read.
fn read_board() -> (Option<Board>, Option<String>) {
    let Some(path) = std::env::var_os("FAKE_NVIDIA_SMI_TOPO") else {
        return (None, None);
    };
    let read = std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| Board::parse(&t).map_err(|e| e.to_string()));
    match read {
        Ok(b) => (Some(b), None),
        Err(e) => (
            None,
            Some(format!(
                "sglang-sim: cannot read the board {}: {e}; assuming PIX links",
                std::path::Path::new(&path).display()
            )),
        ),
    }
}

/// Why the sim does not start.
pub enum Refused {
    /// argparse's answer: `--help`, or a usage error (exit 2).
    Argparse(Option<Parser>, Outcome),
    /// SGLang's own validation after argparse (a traceback, exit 1).
    Startup(Refusal),
}

/// Parses a full command line (without argv[0]).
pub fn parse(args: &[String]) -> Result<Config, Refused> {
    let version = requested_version(args);
    let python = early_knob(args, "--sim-python", DEFAULT_PYTHON);
    let parser =
        parser_for(&version, &python).map_err(|e| Refused::Argparse(None, Outcome::Error(e)))?;
    let args = &config_file::merge(&parser, args).map_err(Refused::Startup)?;
    let parsed = match parser.parse(args) {
        Ok(p) => p,
        Err(o) => return Err(Refused::Argparse(Some(parser), o)),
    };
    match resolve(&parser, &parsed, version) {
        // srt/server_args.py `prepare_server_args`: what was asked for, after the merge.
        Ok(Ok(config)) => Ok(Config {
            launch_command: args.join(" "),
            ..config
        }),
        Ok(Err(refusal)) => Err(Refused::Startup(refusal)),
        Err(e) => Err(Refused::Argparse(Some(parser), Outcome::Error(e))),
    }
}

/// The typed config; the inner error is SGLang refusing the arguments after argparse.
fn resolve(
    parser: &Parser,
    parsed: &Parsed,
    version: String,
) -> Result<Result<Config, Refusal>, String> {
    let v = argparse::parse_version(&version).unwrap_or((0, 5, 23));
    let requested = parsed
        .str("mamba_radix_cache_strategy")
        .or_else(|| parsed.str("mamba_scheduler_strategy"));
    let given = server_args::Given {
        strategy: requested.and_then(Strategy::parse),
        disable_overlap_schedule: parsed.flag("disable_overlap_schedule"),
        disable_radix_cache: parsed.flag("disable_radix_cache"),
        page_size: num(parsed, "page_size"),
        attention_backend: parsed.str("attention_backend"),
    };
    let mamba = match server_args::resolve(v, &given) {
        Ok(r) => r,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let strategy = mamba.strategy;
    let gib = |name: &str| sim_f64(parsed, name).map(|g| g * 1024.0);
    let gpu_total_mib = match sim_raw(parsed, "--sim-gpu-mem-gib")? {
        Some(_) => gib("--sim-gpu-mem-gib")?.round(),
        None => Params::default().gpu_total_mib,
    };
    let model_path = parsed.str("model_path").unwrap_or_default().to_string();
    // The model directory's own shape, where it has one; a `--sim-*` flag given still wins.
    let shape = model_files::read(Path::new(&model_path)).transpose()?;
    // `None` where the flag (or its variable) was given, even unreadably: it then speaks.
    let from_dir = |name: &str, of: fn(&Shape) -> f64| -> Option<f64> {
        let given = !matches!(sim_raw(parsed, name), Ok(None));
        shape.as_ref().filter(|_| !given).map(of)
    };
    let params = Params {
        gpu_total_mib,
        weights_mib: match from_dir("--sim-weights-gib", |s| s.weights_mib) {
            Some(mib) => mib,
            None => gib("--sim-weights-gib")?,
        },
        mamba_slot_mib: sim_f64(parsed, "--sim-mamba-slot-mib")?.max(1e-3),
        kv_kib_per_token: match from_dir("--sim-kv-kib-per-token", |s| s.kv_kib_per_token) {
            Some(kib) => kib,
            None => sim_f64(parsed, "--sim-kv-kib-per-token")?,
        }
        .max(1e-3),
        overlap_reserve_mib: gib("--sim-overlap-reserve-gib")?,
        cuda_graph_mib: gib("--sim-cuda-graph-gib")?,
        reserved_mib: crate::sim::model::RESERVED_MIB,
        activation_kib_per_token: sim_f64(parsed, "--sim-activation-kib-per-token")?,
        model_context_len: match from_dir("--sim-model-context-length", |s| s.context_len as f64) {
            Some(n) => n as u64,
            None => sim_u64(parsed, "--sim-model-context-length")?.unwrap_or(262_144),
        },
        decode_base_ms: sim_f64(parsed, "--sim-decode-base-ms")?,
        decode_per_req_ms: sim_f64(parsed, "--sim-decode-per-req-ms")?,
        overlap_speedup: sim_f64(parsed, "--sim-overlap-speedup")?.max(1e-3),
        extra_buffer_copy_ms: sim_f64(parsed, "--sim-extra-buffer-copy-ms")?,
        prefill_base_ms: sim_f64(parsed, "--sim-prefill-base-ms")?,
        prefill_per_token_ms: sim_f64(parsed, "--sim-prefill-per-token-ms")?,
        mean_output_tokens: sim_u64(parsed, "--sim-mean-output-tokens")?.unwrap_or(988),
        mean_prompt_tokens: sim_u64(parsed, "--sim-mean-prompt-tokens")?.unwrap_or(96),
        output_dist: sim_output_dist(parsed)?,
        output_seed: sim_u64(parsed, "--sim-output-seed")?.unwrap_or(0),
        dense: match from_dir("--sim-dense", |s| f64::from(u8::from(s.dense))) {
            Some(dense) => dense > 0.0,
            None => sim_bool(parsed, "--sim-dense")?,
        },
        attention_heads: match from_dir("--sim-attention-heads", |s| s.attention_heads as f64) {
            Some(n) => n as u64,
            None => sim_u64(parsed, "--sim-attention-heads")?.unwrap_or(32),
        }
        .max(1),
        kv_heads: match from_dir("--sim-kv-heads", |s| s.kv_heads as f64) {
            Some(n) => n as u64,
            None => sim_u64(parsed, "--sim-kv-heads")?.unwrap_or(4),
        }
        .max(1),
        allreduce_mib_per_token: sim_f64(parsed, "--sim-allreduce-mib-per-token")?,
    };
    let settings = Settings {
        parallel: Parallel::default(),
        mem_fraction_static: num(parsed, "mem_fraction_static").unwrap_or(0.85),
        strategy,
        radix_cache_disabled: mamba.radix_cache_disabled,
        overlap_disabled: mamba.overlap_disabled,
        max_running_requests: num(parsed, "max_running_requests"),
        max_mamba_cache_size: num(parsed, "max_mamba_cache_size"),
        mamba_full_memory_ratio: num(parsed, "mamba_full_memory_ratio").unwrap_or(0.9),
        context_length: num(parsed, "context_length"),
        max_total_tokens: num(parsed, "max_total_tokens"),
        // Unset, 0.5.23 picks 8192 for a GPU of this size (memory_hook.py); -1 (any value
        // <= 0, managers/scheduler.py) turns it off.
        chunked_prefill_size: match num::<i64>(parsed, "chunked_prefill_size") {
            Some(n) if n <= 0 => None,
            Some(n) => Some(n as u64),
            None => Some(8192),
        },
        schedule_conservativeness: num(parsed, "schedule_conservativeness").unwrap_or(1.0),
        max_prefill_tokens: num(parsed, "max_prefill_tokens").unwrap_or(16384),
        stream_interval: num(parsed, "stream_interval").unwrap_or(1).max(1),
        cuda_graph_max_bs: (!parsed.flag("disable_cuda_graph")).then(|| {
            num(parsed, "cuda_graph_max_bs_decode")
                .or_else(|| num(parsed, "cuda_graph_max_bs"))
                .unwrap_or(crate::sim::model::DEFAULT_CUDA_GRAPH_MAX_BS)
        }),
        page_size: num(parsed, "page_size"),
    };
    let time_scale = sim_f64(parsed, "--sim-time-scale")?;
    if time_scale <= 0.0 {
        return Err("argument --sim-time-scale: must be greater than 0".into());
    }
    let fail_rate = sim_f64(parsed, "--sim-fail-rate")?;
    if fail_rate > 1.0 {
        return Err(format!(
            "argument --sim-fail-rate: must be between 0 and 1, got {fail_rate}"
        ));
    }
    let served_model_name = parsed
        .str("served_model_name")
        .map(str::to_string)
        .unwrap_or_else(|| model_path.clone());
    let port: u16 = match parsed.str("port") {
        Some(p) => p
            .trim()
            .parse()
            .map_err(|_| format!("argument --port: invalid port: '{p}'"))?,
        None => 30000,
    };
    let mut startup_warnings: Vec<String> = mamba.warnings.iter().map(|w| w.to_string()).collect();
    let layout = match parallel_layout(parsed) {
        Ok(l) => l,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let (board, board_warning) = read_board();
    startup_warnings.extend(board_warning);
    let visible_gpus = parallel::visible_gpus(
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        board.as_ref(),
        std::env::var("FAKE_NVIDIA_SMI_GPUS")
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(8),
    );
    let local_gpus = layout.local_gpus(&visible_gpus);
    let hop = layout.hop(board.as_ref(), local_gpus.as_deref().unwrap_or_default());
    let link = |name: &str| -> Result<PerLink, String> {
        let default = crate::sim::knobs::SIM_OPTS
            .iter()
            .find(|o| o.name == name)
            .map_or("", |o| o.default);
        let (src, v) = sim_raw(parsed, name)?.unwrap_or(("default".into(), default.into()));
        PerLink::parse(&v).map_err(|e| format!("{src}: invalid value '{v}': {e}"))
    };
    let mut settings = Settings {
        parallel: Parallel::new(
            &layout,
            hop,
            &link("--sim-link-gb-s")?,
            &link("--sim-link-latency-ms")?,
        ),
        ..settings
    };
    if layout.attn_dp > 1 {
        // srt/arg_groups/parallel_hook.py `handle_data_parallelism`: each attention-DP rank
        // prefills its share of the chunk, and admits more conservatively.
        settings.schedule_conservativeness *= 0.3;
        if let Some(chunk) = settings.chunked_prefill_size {
            let per_rank = chunk / layout.attn_dp;
            startup_warnings.push(format!(
                "DP attention is enabled. chunked prefill size is adjusted from {chunk} to {per_rank}."
            ));
            settings.chunked_prefill_size = Some(per_rank.max(1));
        }
    }
    let gpu_state_dir = match sim_raw(parsed, "--sim-gpu-state-dir")? {
        Some((_, d)) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/tmp/sglang-sim-gpus"),
    };

    let mut server_args = Map::new();
    for spec in parser.groups[0].1.iter() {
        let dest = spec.dest();
        // `--config` is consumed by `prepare_server_args` (its file merged into the argv): no
        // ServerArgs field holds it.
        if dest == "config" {
            continue;
        }
        let value = match parsed.given.get(&dest) {
            Some(v) => given_json(spec, v),
            None => default_json(&spec.default),
        };
        server_args.insert(dest, value);
    }
    let resolved: [(&str, Json); 9] = [
        ("served_model_name", Json::from(served_model_name.clone())),
        (
            "mem_fraction_static",
            Json::from(settings.mem_fraction_static),
        ),
        (
            "chunked_prefill_size",
            Json::from(settings.chunked_prefill_size.map_or(-1, |n| n as i64)),
        ),
        (
            "max_prefill_tokens",
            Json::from(settings.max_prefill_tokens),
        ),
        (
            "mamba_full_memory_ratio",
            Json::from(settings.mamba_full_memory_ratio),
        ),
        ("port", Json::from(port)),
        (
            "disable_overlap_schedule",
            Json::from(settings.overlap_disabled),
        ),
        (
            "disable_radix_cache",
            Json::from(settings.radix_cache_disabled),
        ),
        (
            if v >= (0, 5, 15) {
                "mamba_radix_cache_strategy"
            } else {
                "mamba_scheduler_strategy"
            },
            Json::from(strategy.name()),
        ),
    ];
    for (k, val) in resolved {
        server_args.insert(k.to_string(), val);
    }
    server_args.insert(
        "schedule_conservativeness".into(),
        Json::from(settings.schedule_conservativeness),
    );
    // parallel_hook.py `handle_deprecated_dp_attention` (versions with `--attn-dp-size`): the
    // attention-DP width moves to attn_dp_size, dp_size counts replicas.
    if server_args.contains_key("attn_dp_size") {
        server_args.insert("attn_dp_size".into(), Json::from(layout.attn_dp));
        server_args.insert("dp_size".into(), Json::from(layout.dp));
        server_args.insert("enable_dp_attention".into(), Json::from(false));
    }
    // In plain text, as 0.5.23 logs it and `/server_info` returns it: srt/entrypoints/engine.py
    // redacts only watermark secrets.
    if let Some(key) = parsed.str("api_key") {
        server_args.insert("api_key".into(), Json::from(key));
    }

    Ok(Ok(Config {
        version,
        host: parsed.str("host").unwrap_or("127.0.0.1").to_string(),
        port,
        model_path,
        served_model_name,
        api_key: parsed.str("api_key").map(str::to_string),
        enable_metrics: parsed.flag("enable_metrics"),
        time_scale,
        startup_secs: sim_f64(parsed, "--sim-startup-secs")?,
        die_after: sim_u64(parsed, "--sim-die-after")?,
        fail_rate,
        seed: sim_u64(parsed, "--sim-seed")?.unwrap_or(0),
        instant: sim_bool(parsed, "--sim-instant")?,
        ignore_sigterm: sim_bool(parsed, "--sim-ignore-sigterm")?,
        gpu_state_dir,
        local_gpus,
        layout,
        params,
        settings,
        server_args,
        startup_warnings,
        launch_command: String::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn ok(s: &str) -> Config {
        match parse(&args(s)) {
            Ok(c) => c,
            Err(Refused::Startup(r)) => panic!("refused at start: {}", r.error),
            Err(Refused::Argparse(_, o)) => panic!("argparse: {o:?}"),
        }
    }

    #[test]
    fn auto_resolves_by_version_and_flags_win_over_defaults() {
        let c = ok("--model /m --sim-version 0.5.10");
        assert_eq!(c.settings.strategy, Strategy::NoBuffer);
        assert_eq!(c.server_args["mamba_scheduler_strategy"], "no_buffer");
        assert_eq!(c.server_args["disable_overlap_schedule"], true);
        assert_eq!(c.startup_warnings.len(), 1);
        let c = ok("--model /m");
        assert_eq!(c.settings.strategy, Strategy::ExtraBuffer);
        assert_eq!(c.server_args["mamba_radix_cache_strategy"], "extra_buffer");
        let c = ok("--model /m --disable-overlap-schedule");
        assert_eq!(c.server_args["mamba_radix_cache_strategy"], "no_buffer");
        let c = ok(
            "--model /m --sim-version 0.5.16 --mamba-scheduler-strategy no_buffer --port 31001 \
             --sim-time-scale 50 --enable-metrics --served-model-name q --disable-overlap-schedule",
        );
        assert_eq!(c.settings.strategy, Strategy::NoBuffer);
        assert_eq!(
            (c.port, c.time_scale, c.enable_metrics),
            (31001, 50.0, true)
        );
        assert_eq!(c.server_args["port"], 31001);
        assert_eq!(c.server_args["max_running_requests"], Json::Null);
        assert_eq!(c.served_model_name, "q");
    }

    #[test]
    fn the_api_key_from_a_config_file_is_in_plain_text_as_in_0_5_23() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.yaml");
        std::fs::write(&path, "api-key: \"sk-plain\"\n").unwrap();
        let c = ok(&format!(
            "--model /m --config {} --port 31002",
            path.display()
        ));
        assert_eq!(c.api_key.as_deref(), Some("sk-plain"));
        assert_eq!(c.server_args["api_key"], "sk-plain");
        assert_eq!(c.port, 31002);
        assert_eq!(
            c.launch_command,
            "--api-key sk-plain --model /m --port 31002"
        );
    }

    #[test]
    fn sim_flags_are_validated() {
        let err = |s: &str| match parse(&args(s)) {
            Err(Refused::Argparse(_, Outcome::Error(e))) => e,
            _ => panic!("expected an argparse error for {s}"),
        };
        assert_eq!(
            err("--model /m --sim-time-scale x"),
            "argument --sim-time-scale: invalid float value: 'x'"
        );
        assert_eq!(
            err("--model /m --sim-fail-rate 2"),
            "argument --sim-fail-rate: must be between 0 and 1, got 2"
        );
        assert!(err("--model /m --sim-version banana").contains("invalid version"));
        assert_eq!(
            err("--model /m --sim-output-dist nope"),
            "argument --sim-output-dist: invalid value 'nope': expected uniform, uniform:LO:HI, \
             lognormal:MEDIAN:SIGMA or bimodal:SHORT:LONG:SHARE"
        );
        assert_eq!(
            err("--model /m --sim-output-seed x"),
            "argument --sim-output-seed: invalid int value: 'x'"
        );
        assert_eq!(
            err("--model /m --sim-output-seed -1"),
            "argument --sim-output-seed: invalid non-negative int value: '-1'"
        );
        let c = ok("--model /m --sim-output-dist lognormal:600:1.2 --sim-output-seed 9");
        assert_eq!(
            c.params.output_dist,
            OutputDist::parse("lognormal:600:1.2").unwrap()
        );
        assert_eq!(c.params.output_seed, 9);
        assert_eq!(ok("--model /m").params.output_dist, OutputDist::Uniform);
        // After argparse, SGLang's own validation refuses no_buffer with overlap on.
        match parse(&args("--model /m --mamba-radix-cache-strategy no_buffer")) {
            Err(Refused::Startup(r)) => assert!(r.error.contains("overlap schedule")),
            _ => panic!("no_buffer without --disable-overlap-schedule must be refused"),
        }
        assert_eq!(env_name("--sim-foo-bar"), "SGLANG_SIM_FOO_BAR");
    }
}

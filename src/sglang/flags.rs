//! Rendering a profile's logical server settings into `launch_server` arguments for the SGLang
//! a host has installed, checking an argument list against that host's `--help`, and masking
//! secrets for display.

use std::fmt;

use crate::config::{MambaStrategy, Profile};
use crate::sglang::help::{Arity, HelpSpec};

/// The mamba strategy flag from SGLang 0.5.15 on (the only one from 0.5.20).
pub const MAMBA_RADIX_CACHE_STRATEGY: &str = "--mamba-radix-cache-strategy";
/// The mamba strategy flag of SGLang 0.5.10 to 0.5.19 (a deprecated alias from 0.5.15).
pub const MAMBA_SCHEDULER_STRATEGY: &str = "--mamba-scheduler-strategy";

/// SGLang 0.5.15+ refuses an explicit no_buffer on a hybrid model while overlap scheduling is
/// on (srt/arg_groups/mamba_hook.py, `validate_mamba_no_buffer`); every version accepts it.
pub const DISABLE_OVERLAP_SCHEDULE: &str = "--disable-overlap-schedule";
/// With the radix cache off, SGLang neither resolves nor validates the mamba strategy.
pub const DISABLE_RADIX_CACHE: &str = "--disable-radix-cache";

/// Flags whose value is a secret: masked wherever an argv is shown or stored.
const SECRET_FLAGS: &[&str] = &["--api-key", "--admin-api-key"];
pub const MASK: &str = "********";

/// Where one server listens, and the secret it needs; the rest comes from the profile.
#[derive(Debug, Clone, Copy)]
pub struct Render<'a> {
    /// The target's `--help`; `None` when preflight is skipped (newest flag names are used).
    pub help: Option<&'a HelpSpec>,
    pub bind_host: &'a str,
    pub port: u16,
    /// The `--config` file that holds the secrets (the API key) on the target, when there are
    /// any: SGLang reads the key only from `--api-key` or a config file, and an argv is
    /// readable by every user of the host (`ps`).
    pub secrets_file: Option<&'a str>,
    /// This node's rank of a server over several nodes.
    pub node: Option<NodeRank<'a>>,
}

/// One node's part of a server over several: SGLang's rule is the same command on every node
/// with its own `--node-rank` and rank 0's `--dist-init-addr` (srt/server_args.py).
#[derive(Debug, Clone, Copy)]
pub struct NodeRank<'a> {
    pub rank: u32,
    /// `HOST:PORT` where rank 0's torch.distributed store listens.
    pub dist_init_addr: &'a str,
}

/// SGLang's `--config`: one per command line (srt/utils/server_args_config_parser.py).
pub const CONFIG: &str = "--config";

/// The `--config` YAML that gives SGLang the API key. The file's keys are flag names: SGLang
/// turns `api-key: v` into `--api-key v` and puts it before the command line's own arguments
/// (srt/utils/server_args_config_parser.py `_convert_config_to_args`), so the key is a string
/// in YAML's double-quoted form, which JSON's escapes are a subset of.
pub fn secrets_yaml(api_key: &str) -> String {
    let quoted = serde_json::to_string(api_key).expect("a string always serializes");
    format!("# Written by fleet: the server's secrets, read once at start.\napi-key: {quoted}\n")
}

/// Whether the profile's own arguments already pass a `--config` file (SGLang takes one only).
pub fn has_config(args: &[String]) -> bool {
    args.iter().any(|a| is_flag(a, CONFIG))
}

/// The arguments after the launcher for one server.
pub fn server_args(profile: &Profile, r: &Render<'_>) -> Vec<String> {
    let s = &profile.server;
    let mut args: Vec<String> = Vec::new();
    let mut push = |flag: &str, value: String| {
        args.push(flag.to_string());
        args.push(value);
    };
    push("--model-path", profile.model.clone());
    if let Some(name) = &profile.served_model_name {
        push("--served-model-name", name.clone());
    }
    push("--host", r.bind_host.to_string());
    push("--port", r.port.to_string());
    if let Some(v) = s.mem_fraction_static {
        push("--mem-fraction-static", v.to_string());
    }
    if let Some(v) = s.context_length {
        push("--context-length", v.to_string());
    }
    if let Some(v) = &s.attention_backend {
        push("--attention-backend", v.clone());
    }
    if let Some(v) = s.mamba_strategy {
        push(mamba_strategy_flag(r.help), v.as_str().to_string());
    }
    if let Some(v) = s.max_running_requests {
        push("--max-running-requests", v.to_string());
    }
    // The layout's flags only where they differ from SGLang's defaults, so that a one-GPU
    // server's command line (and fingerprint) is what it was before layouts.
    let parallel = &s.parallel;
    for (flag, n) in [
        ("--tp-size", parallel.tp),
        ("--dp-size", parallel.dp),
        ("--ep-size", parallel.ep),
    ] {
        if n > 1 {
            push(flag, n.to_string());
        }
    }
    if let Some(path) = r.secrets_file {
        push(CONFIG, path.to_string());
    }
    let listed = |flag: &str| s.extra_args.iter().any(|a| is_flag(a, flag));
    if s.mamba_strategy == Some(MambaStrategy::NoBuffer)
        && !listed(DISABLE_OVERLAP_SCHEDULE)
        && !listed(DISABLE_RADIX_CACHE)
    {
        args.push(DISABLE_OVERLAP_SCHEDULE.to_string());
    }
    if s.parallel.dp_attention {
        args.push("--enable-dp-attention".to_string());
    }
    if let Some(node) = r.node {
        for (flag, value) in [
            ("--nnodes", s.parallel.nnodes.to_string()),
            ("--node-rank", node.rank.to_string()),
            ("--dist-init-addr", node.dist_init_addr.to_string()),
        ] {
            args.push(flag.to_string());
            args.push(value);
        }
    }
    if s.enable_metrics {
        args.push("--enable-metrics".to_string());
    }
    args.extend(s.extra_args.iter().cloned());
    args
}

/// Whether `arg` is `flag`, alone or as `flag=value`.
fn is_flag(arg: &str, flag: &str) -> bool {
    arg.strip_prefix(flag)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('='))
}

/// The name the host's SGLang accepts for the logical `mamba_strategy` (DESIGN §6): the new
/// name when `--help` lists it, else the old one when listed, else the new one (preflight then
/// reports it on a host that lists neither).
pub fn mamba_strategy_flag(help: Option<&HelpSpec>) -> &'static str {
    match help {
        Some(h) if !h.has(MAMBA_RADIX_CACHE_STRATEGY) && h.has(MAMBA_SCHEDULER_STRATEGY) => {
            MAMBA_SCHEDULER_STRATEGY
        }
        _ => MAMBA_RADIX_CACHE_STRATEGY,
    }
}

/// A copy of `argv` with secret values replaced by [`MASK`], for logs, tables, JSON and files.
pub fn masked(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut hide_next = false;
    for arg in argv {
        if hide_next {
            out.push(MASK.to_string());
            hide_next = false;
            continue;
        }
        match arg.split_once('=') {
            Some((flag, _)) if SECRET_FLAGS.contains(&flag) => out.push(format!("{flag}={MASK}")),
            _ => {
                hide_next = SECRET_FLAGS.contains(&arg.as_str());
                out.push(arg.clone());
            }
        }
    }
    out
}

/// One argument the target's SGLang would reject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    Unknown {
        flag: String,
        nearest: Option<String>,
    },
    InvalidChoice {
        flag: String,
        value: String,
        choices: Vec<String>,
    },
    MissingValue {
        flag: String,
    },
    UnexpectedValue {
        flag: String,
        value: String,
    },
    Stray {
        value: String,
    },
    /// Accepted by argparse, refused by SGLang's own validation right after it.
    NoBuffer(NoBufferRule),
}

/// What `validate_mamba_no_buffer` (srt/arg_groups/mamba_hook.py, SGLang 0.5.15+) asserts for
/// an explicit no_buffer on a hybrid model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoBufferRule {
    /// "no_buffer only supports page_size=1."
    PageSize(String),
    /// "no_buffer do not support overlap schedule."
    OverlapOn,
    /// "no_buffer do not support trtllm_mha attention backend."
    TrtllmMha,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Unknown {
                flag,
                nearest: Some(n),
            } => {
                write!(f, "unrecognized argument {flag} (did you mean {n}?)")
            }
            Mismatch::Unknown {
                flag,
                nearest: None,
            } => write!(f, "unrecognized argument {flag}"),
            Mismatch::InvalidChoice {
                flag,
                value,
                choices,
            } => {
                write!(
                    f,
                    "{flag}: invalid choice '{value}' (choose from {})",
                    choices.join(", ")
                )
            }
            Mismatch::MissingValue { flag } => write!(f, "{flag}: expected a value"),
            Mismatch::UnexpectedValue { flag, value } => {
                write!(f, "{flag} takes no value, got '{value}'")
            }
            Mismatch::Stray { value } => write!(f, "unexpected argument '{value}'"),
            Mismatch::NoBuffer(rule) => {
                let (what, hint) = match rule {
                    NoBufferRule::PageSize(size) => (
                        format!("--page-size {size}: no_buffer only supports page_size=1"),
                        "drop --page-size or use mamba_strategy extra_buffer",
                    ),
                    NoBufferRule::OverlapOn => (
                        "no_buffer does not support the overlap schedule".to_string(),
                        "add --disable-overlap-schedule",
                    ),
                    NoBufferRule::TrtllmMha => (
                        "attention_backend trtllm_mha: no_buffer does not support it".to_string(),
                        "choose another attention_backend (e.g. flashinfer or triton)",
                    ),
                };
                write!(
                    f,
                    "{what} (SGLang's validate_mamba_no_buffer refuses it at start; {hint})"
                )
            }
        }
    }
}

/// Every argument of `args` (what follows the launcher) that `help` does not accept, in order,
/// then what SGLang's validation after argparse would refuse.
pub fn check(args: &[String], help: &HelpSpec) -> Vec<Mismatch> {
    let mut problems = check_argparse(args, help);
    // The strict no_buffer validation came with the new flag name (0.5.15); before it, SGLang
    // turned overlap off by itself.
    if help.has(MAMBA_RADIX_CACHE_STRATEGY) {
        problems.extend(
            no_buffer_rules(args, help)
                .into_iter()
                .map(Mismatch::NoBuffer),
        );
    }
    problems
}

/// The last value given for any of `flags` (argparse keeps the last), `--flag=value` included.
fn last_value<'a>(args: &'a [String], flags: &[&str]) -> Option<&'a str> {
    let mut found = None;
    for (i, arg) in args.iter().enumerate() {
        for flag in flags {
            if arg == flag {
                found = args.get(i + 1).map(String::as_str);
            } else if let Some(v) = arg.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                found = Some(v);
            }
        }
    }
    found
}

/// srt/arg_groups/mamba_hook.py, `validate_mamba_no_buffer`: what an explicit no_buffer needs,
/// unless the radix cache is off (then the strategy is not validated at all).
fn no_buffer_rules(args: &[String], help: &HelpSpec) -> Vec<NoBufferRule> {
    let has = |flag: &str| args.iter().any(|a| is_flag(a, flag));
    // A strategy flag this SGLang does not know is already reported as unrecognized.
    let names: Vec<&str> = [MAMBA_RADIX_CACHE_STRATEGY, MAMBA_SCHEDULER_STRATEGY]
        .into_iter()
        .filter(|f| help.has(f))
        .collect();
    let strategy = last_value(args, &names);
    if strategy != Some("no_buffer") || has(DISABLE_RADIX_CACHE) {
        return Vec::new();
    }
    let mut rules = Vec::new();
    if let Some(size) = last_value(args, &["--page-size"])
        && size.trim() != "1"
    {
        rules.push(NoBufferRule::PageSize(size.to_string()));
    }
    if !has(DISABLE_OVERLAP_SCHEDULE) {
        rules.push(NoBufferRule::OverlapOn);
    }
    if last_value(args, &["--attention-backend"]) == Some("trtllm_mha") {
        rules.push(NoBufferRule::TrtllmMha);
    }
    rules
}

fn check_argparse(args: &[String], help: &HelpSpec) -> Vec<Mismatch> {
    let mut problems = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if !looks_like_option(arg) {
            problems.push(Mismatch::Stray {
                value: masked_value(args, i - 1),
            });
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let Some(option) = help.get(flag) else {
            problems.push(Mismatch::Unknown {
                flag: flag.to_string(),
                nearest: help.nearest(flag).map(str::to_string),
            });
            // Skip what is plainly this unknown flag's value, so it is not reported twice.
            while i < args.len() && !looks_like_option(&args[i]) {
                i += 1;
            }
            continue;
        };
        let mut values: Vec<String> = inline.into_iter().collect();
        let inline_given = !values.is_empty();
        if !inline_given {
            let max = match option.arity {
                Arity::Flag => 0,
                Arity::One | Arity::Optional => 1,
                Arity::ZeroOrMore | Arity::OneOrMore => usize::MAX,
            };
            while values.len() < max && i < args.len() && !looks_like_option(&args[i]) {
                values.push(args[i].clone());
                i += 1;
            }
        }
        match option.arity {
            Arity::Flag if inline_given => problems.push(Mismatch::UnexpectedValue {
                flag: flag.to_string(),
                value: values.remove(0),
            }),
            Arity::One | Arity::OneOrMore if values.is_empty() => {
                problems.push(Mismatch::MissingValue {
                    flag: flag.to_string(),
                })
            }
            _ => {}
        }
        if let Some(choices) = &option.choices {
            for value in values.iter().filter(|v| !choices.contains(v)) {
                problems.push(Mismatch::InvalidChoice {
                    flag: flag.to_string(),
                    value: value.clone(),
                    choices: choices.clone(),
                });
            }
        }
    }
    problems
}

/// argparse's rule: a dash-led token is an option unless it reads as a negative number.
fn looks_like_option(arg: &str) -> bool {
    arg.starts_with('-') && arg.len() > 1 && arg.parse::<f64>().is_err()
}

fn masked_value(args: &[String], index: usize) -> String {
    masked(&args[..=index]).pop().unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::config::{HealthSettings, ServerSettings};

    const HELP_0_5_23: &str = include_str!("../../tests/fixtures/sglang/help-0.5.23.txt");
    const HELP_0_5_10: &str = include_str!("../../tests/fixtures/sglang/help-0.5.10.txt");

    pub(crate) fn profile() -> Profile {
        Profile {
            name: "p".into(),
            path: "profiles/p.yaml".into(),
            model: "/models/Qwen3.6-27B".into(),
            served_model_name: Some("qwen3.6-27b".into()),
            launcher: vec![
                "/venv/bin/python".into(),
                "-m".into(),
                "sglang.launch_server".into(),
            ],
            port_base: 30000,
            server: ServerSettings {
                mem_fraction_static: Some(0.85),
                context_length: Some(8192),
                attention_backend: Some("flashinfer".into()),
                mamba_strategy: Some(MambaStrategy::NoBuffer),
                max_running_requests: None,
                parallel: Default::default(),
                enable_metrics: true,
                host: None,
                extra_args: vec!["--trust-remote-code".into()],
            },
            env: BTreeMap::new(),
            health: HealthSettings {
                startup_timeout: Duration::from_secs(1200),
                poll: Duration::from_secs(1),
            },
            api_key_env: None,
            expected: None,
            router: None,
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn render(profile: &Profile, help: &HelpSpec, secrets_file: Option<&str>) -> Vec<String> {
        server_args(
            profile,
            &Render {
                help: Some(help),
                bind_host: "127.0.0.1",
                port: 30005,
                secrets_file,
                node: None,
            },
        )
    }

    #[test]
    fn renders_the_seed_profile_for_both_versions() {
        let p = profile();
        let new = render(&p, &HelpSpec::parse(HELP_0_5_23), None);
        assert_eq!(
            new,
            s(&[
                "--model-path",
                "/models/Qwen3.6-27B",
                "--served-model-name",
                "qwen3.6-27b",
                "--host",
                "127.0.0.1",
                "--port",
                "30005",
                "--mem-fraction-static",
                "0.85",
                "--context-length",
                "8192",
                "--attention-backend",
                "flashinfer",
                "--mamba-radix-cache-strategy",
                "no_buffer",
                "--disable-overlap-schedule",
                "--enable-metrics",
                "--trust-remote-code",
            ])
        );
        let old = render(&p, &HelpSpec::parse(HELP_0_5_10), None);
        assert_eq!(old[14], "--mamba-scheduler-strategy");
        assert!(check(&new, &HelpSpec::parse(HELP_0_5_23)).is_empty());
        assert!(check(&old, &HelpSpec::parse(HELP_0_5_10)).is_empty());
    }

    #[test]
    fn a_layout_renders_sglangs_flags_only_where_not_default() {
        let mut p = profile();
        let help = HelpSpec::parse(HELP_0_5_23);
        let single = render(&p, &help, None);
        assert!(!single.iter().any(|a| a.contains("-size")), "{single:?}");
        p.server.parallel = crate::layout::Parallel {
            tp: 4,
            dp: 2,
            ep: 4,
            dp_attention: true,
            nnodes: 1,
        };
        let args = render(&p, &help, None);
        let at = args.iter().position(|a| a == "--tp-size").unwrap();
        assert_eq!(
            args[at..at + 6],
            s(&["--tp-size", "4", "--dp-size", "2", "--ep-size", "4"])[..]
        );
        assert!(args.contains(&"--enable-dp-attention".to_string()));
    }

    #[test]
    fn optional_settings_and_metrics_off() {
        let mut p = profile();
        p.served_model_name = None;
        p.server = ServerSettings {
            mem_fraction_static: None,
            context_length: None,
            attention_backend: None,
            mamba_strategy: None,
            max_running_requests: Some(72),
            parallel: Default::default(),
            enable_metrics: false,
            host: None,
            extra_args: vec![],
        };
        let help = HelpSpec::parse(HELP_0_5_23);
        let args = render(&p, &help, Some("/run/fleet/30005/secrets.yaml"));
        assert_eq!(
            args,
            s(&[
                "--model-path",
                "/models/Qwen3.6-27B",
                "--host",
                "127.0.0.1",
                "--port",
                "30005",
                "--max-running-requests",
                "72",
                "--config",
                "/run/fleet/30005/secrets.yaml",
            ])
        );
        assert!(check(&args, &help).is_empty());
        assert!(has_config(&args));
        assert!(!has_config(&args[..8]));
    }

    #[test]
    fn the_secrets_file_is_yaml_sglang_turns_into_the_api_key_flag() {
        assert_eq!(
            secrets_yaml("sk-1 \"q\" \\ é"),
            "# Written by fleet: the server's secrets, read once at start.\n\
             api-key: \"sk-1 \\\"q\\\" \\\\ é\"\n"
        );
    }

    #[test]
    fn masks_secret_values_in_every_spelling() {
        let argv = s(&[
            "--api-key",
            "k1",
            "--admin-api-key=k2",
            "--port",
            "1",
            "--api-key",
        ]);
        assert_eq!(
            masked(&argv),
            s(&[
                "--api-key",
                MASK,
                "--admin-api-key=********",
                "--port",
                "1",
                "--api-key"
            ])
        );
    }

    #[test]
    fn lazy_strategy_on_an_old_host_lists_the_choices() {
        let mut p = profile();
        p.server.mamba_strategy = Some(MambaStrategy::ExtraBufferLazy);
        let help = HelpSpec::parse(HELP_0_5_10);
        let problems = check(&render(&p, &help, None), &help);
        assert_eq!(
            problems,
            vec![Mismatch::InvalidChoice {
                flag: "--mamba-scheduler-strategy".into(),
                value: "extra_buffer_lazy".into(),
                choices: s(&["auto", "no_buffer", "extra_buffer"]),
            }]
        );
        assert_eq!(
            problems[0].to_string(),
            "--mamba-scheduler-strategy: invalid choice 'extra_buffer_lazy' (choose from auto, no_buffer, extra_buffer)"
        );
    }

    #[test]
    fn reports_every_problem_at_once() {
        let help = HelpSpec::parse(HELP_0_5_23);
        let args = s(&[
            "--mem-fraction-statc",
            "0.8",
            "--trust-remote-code=yes",
            "--context-length",
            "--dtype",
            "bf17",
            "stray",
            "--numa-node",
            "0",
            "1",
            "--cuda-graph-max-bs",
            "8",
            "--port=30001",
            "--max-total-tokens",
            "-1",
        ]);
        assert_eq!(
            check(&args, &help),
            vec![
                Mismatch::Unknown {
                    flag: "--mem-fraction-statc".into(),
                    nearest: Some("--mem-fraction-static".into())
                },
                Mismatch::UnexpectedValue {
                    flag: "--trust-remote-code".into(),
                    value: "yes".into()
                },
                Mismatch::MissingValue {
                    flag: "--context-length".into()
                },
                Mismatch::InvalidChoice {
                    flag: "--dtype".into(),
                    value: "bf17".into(),
                    choices: s(&["auto", "half", "float16", "bfloat16", "float", "float32"]),
                },
                Mismatch::Stray {
                    value: "stray".into()
                },
                Mismatch::Unknown {
                    flag: "--cuda-graph-max-bs".into(),
                    nearest: Some("--cuda-graph-max-bs-decode".into())
                },
            ]
        );
    }

    #[test]
    fn old_flag_name_on_a_new_host_suggests_something() {
        let help = HelpSpec::parse(HELP_0_5_23);
        let problems = check(&s(&["--mamba-scheduler-strategy", "no_buffer"]), &help);
        assert!(
            matches!(&problems[..], [Mismatch::Unknown { flag, nearest: Some(_) }] if flag == "--mamba-scheduler-strategy"),
            "{problems:?}"
        );
    }

    #[test]
    fn no_buffer_renders_overlap_off_once_and_not_without_the_radix_cache() {
        let help = HelpSpec::parse(HELP_0_5_23);
        let count = |args: &[String]| {
            args.iter()
                .filter(|a| *a == DISABLE_OVERLAP_SCHEDULE)
                .count()
        };
        let mut p = profile();
        assert_eq!(count(&render(&p, &help, None)), 1);
        p.server.extra_args = s(&["--disable-overlap-schedule"]);
        let args = render(&p, &help, None);
        assert_eq!(count(&args), 1, "listed in extra_args: rendered once");
        assert!(check(&args, &help).is_empty());
        p.server.extra_args = s(&["--disable-radix-cache"]);
        assert_eq!(count(&render(&p, &help, None)), 0);
        p.server.extra_args = vec![];
        p.server.mamba_strategy = Some(MambaStrategy::ExtraBuffer);
        assert_eq!(count(&render(&p, &help, None)), 0);
        // 0.5.10 turns overlap off itself but accepts the flag too.
        p.server.mamba_strategy = Some(MambaStrategy::NoBuffer);
        let old = HelpSpec::parse(HELP_0_5_10);
        let args = render(&p, &old, None);
        assert_eq!(count(&args), 1);
        assert!(check(&args, &old).is_empty());
    }

    #[test]
    fn no_buffer_rules_are_reported_before_anything_starts() {
        let help = HelpSpec::parse(HELP_0_5_23);
        let mut p = profile();
        p.server.attention_backend = Some("trtllm_mha".into());
        p.server.extra_args = s(&["--page-size", "16"]);
        let problems = check(&render(&p, &help, None), &help);
        assert_eq!(
            problems,
            vec![
                Mismatch::NoBuffer(NoBufferRule::PageSize("16".into())),
                Mismatch::NoBuffer(NoBufferRule::TrtllmMha),
            ]
        );
        assert_eq!(
            problems[0].to_string(),
            "--page-size 16: no_buffer only supports page_size=1 (SGLang's validate_mamba_no_buffer \
             refuses it at start; drop --page-size or use mamba_strategy extra_buffer)"
        );
        let overlap_on = s(&[
            "--model-path",
            "m",
            "--mamba-radix-cache-strategy=no_buffer",
        ]);
        assert_eq!(
            check(&overlap_on, &help),
            vec![Mismatch::NoBuffer(NoBufferRule::OverlapOn)]
        );
        // Without the radix cache nothing is validated, and 0.5.10 has no such rule.
        p.server.extra_args = s(&["--page-size", "16", "--disable-radix-cache"]);
        assert!(check(&render(&p, &help, None), &help).is_empty());
        let old = HelpSpec::parse(HELP_0_5_10);
        p.server.extra_args = s(&["--page-size", "16"]);
        assert!(check(&render(&p, &old, None), &old).is_empty());
    }

    #[test]
    fn without_help_the_newest_name_is_used() {
        assert_eq!(mamba_strategy_flag(None), MAMBA_RADIX_CACHE_STRATEGY);
    }
}

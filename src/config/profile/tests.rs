//! Profiles as users write them: loading, `extends`, the schema's checks with their locations,
//! `--set` overrides and `profile show`'s YAML.

use super::*;
use crate::config::{Expected, MambaStrategy, ServerSettings};
use std::io::Write;
use std::time::Duration;

const BASE: &str = "model: /models/Qwen3.6-27B
served_model_name: qwen3.6-27b
launcher: [/workspace/venv/bin/python, -m, sglang.launch_server]
port_base: 30000
server:
  mem_fraction_static: 0.85
  context_length: 8192
  attention_backend: flashinfer
  mamba_strategy: no_buffer
  max_running_requests: null
  extra_args: [--trust-remote-code]
env: {HF_HUB_OFFLINE: \"1\"}
health: {startup_timeout: 20m, poll: 1s}
api_key_env: FLEET_API_KEY
";

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        fs::File::create(dir.path().join(name))
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    dir
}

fn problems(r: Result<Profile, ConfigError>) -> Vec<Problem> {
    match r {
        Err(ConfigError::Invalid(p)) => p,
        other => panic!("expected problems, got {other:?}"),
    }
}

#[test]
fn the_design_example_loads_with_its_values() {
    let dir = dir_with(&[("base.yaml", BASE)]);
    let p = load_profile("base", dir.path()).unwrap();
    assert_eq!(p.name, "base");
    assert_eq!(
        p.launcher,
        ["/workspace/venv/bin/python", "-m", "sglang.launch_server"]
    );
    assert_eq!(p.server.mem_fraction_static, Some(0.85));
    assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::NoBuffer));
    assert_eq!(p.server.max_running_requests, None);
    assert!(p.server.enable_metrics);
    assert_eq!(p.env["HF_HUB_OFFLINE"], "1");
    assert_eq!(p.health.startup_timeout, Duration::from_secs(1200));
    assert_eq!(p.api_key_env.as_deref(), Some("FLEET_API_KEY"));
}

#[test]
fn extends_overrides_nested_keys_and_keeps_the_rest() {
    let child =
        "extends: base\nserver:\n  mamba_strategy: extra_buffer\nenv:\n  NCCL_DEBUG: WARN\n";
    let dir = dir_with(&[("base.yaml", BASE), ("child.yaml", child)]);
    let p = load_profile("child", dir.path()).unwrap();
    assert_eq!(p.name, "child");
    assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::ExtraBuffer));
    assert_eq!(p.server.context_length, Some(8192));
    assert_eq!(p.env.len(), 2);
}

#[test]
fn problems_in_the_extended_file_name_that_file() {
    let dir = dir_with(&[
        ("base.yaml", "model: m\nlauncher: [x]\nport_base: 0\n"),
        ("child.yaml", "extends: base\n"),
    ]);
    let p = problems(load_profile("child", dir.path()));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].file.ends_with("base.yaml"), "{p:?}");
    assert_eq!(
        (p[0].line, p[0].column, p[0].field.as_str()),
        (3, 12, "port_base")
    );
}

#[test]
fn a_cycle_names_the_chain() {
    let dir = dir_with(&[
        ("a.yaml", "extends: b\nmodel: m\n"),
        ("b.yaml", "extends: a\n"),
    ]);
    let p = problems(load_profile("a", dir.path()));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].message.contains("a.yaml → ") && p[0].message.contains("b.yaml → "),
        "{}",
        p[0].message
    );
    assert!(p[0].file.ends_with("b.yaml"));
}

#[test]
fn overrides_apply_after_extends_and_before_validation() {
    let dir = dir_with(&[("base.yaml", BASE)]);
    let set = |k: &str, v: &str| Override {
        key: k.into(),
        value: v.into(),
    };
    let p = load_profile_with(
        "base",
        dir.path(),
        &[
            set("server.mamba_strategy", "extra_buffer"),
            set("server.max_running_requests", "64"),
            set("env.X", "1"),
        ],
    )
    .unwrap();
    assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::ExtraBuffer));
    assert_eq!(p.server.max_running_requests, Some(64));
    assert_eq!(p.env["X"], "1");

    let p = problems(load_profile_with(
        "base",
        dir.path(),
        &[
            set("server.mem_fraction_statc", "0.9"),
            set("server.mem_fraction_static", "2"),
        ],
    ));
    let shown: Vec<String> = p.iter().map(Problem::to_string).collect();
    assert_eq!(
        shown,
        [
            "--set server.mem_fraction_statc=0.9: server.mem_fraction_statc: unknown key (did you mean `server.mem_fraction_static`?)",
            "--set server.mem_fraction_static=2: server.mem_fraction_static: 2.0 is out of range (must be between 0 and 1 (exclusive), e.g. 0.85)",
        ]
    );
}

#[test]
fn to_yaml_reloads_to_the_same_profile() {
    let dir = dir_with(&[("base.yaml", BASE)]);
    let p = load_profile("base", dir.path()).unwrap();
    let again = profile_from_str(&p.to_yaml(), &dir.path().join("base.yaml"), dir.path()).unwrap();
    assert_eq!(again, p, "{}", p.to_yaml());
}

#[test]
fn a_derived_profile_loads_with_its_overrides_and_measurements() {
    let dir = dir_with(&[("base.yaml", BASE)]);
    let expected = Expected {
        output_tok_s_per_gpu: 1180.5,
        max_running_requests: 72,
        output_tokens: None,
    };
    let text = derived_profile_yaml(
        "base",
        &[Override {
            key: "server.mamba_strategy".into(),
            value: "extra_buffer".into(),
        }],
        Some(&expected),
        "winner of fleet sweep\n\nmeasured 2026-11-29",
    );
    assert_eq!(
        text,
        "# winner of fleet sweep\n#\n# measured 2026-11-29\nextends: base\nserver:\n  \
             mamba_strategy: extra_buffer\nexpected:\n  output_tok_s_per_gpu: 1180.5\n  \
             max_running_requests: 72\n"
    );
    fs::write(dir.path().join("won.yaml"), &text).unwrap();
    let p = load_profile("won", dir.path()).unwrap();
    assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::ExtraBuffer));
    assert_eq!(p.expected, Some(expected.clone()));
    assert_eq!(p.model, "/models/Qwen3.6-27B");

    // With the length distribution the sweep measured: written, and read back the same.
    let with_lengths = Expected {
        output_tokens: Some(crate::eta::LengthPrior {
            max_tokens: 4096,
            sample: 412,
            seen_to: 1776,
            mean: Some(988.0),
            survival: vec![(200, 0.998), (279, 0.95), (1776, 0.0)],
        }),
        ..expected
    };
    let text = derived_profile_yaml("base", &[], Some(&with_lengths), "measured");
    assert!(text.contains("output_tokens:"), "{text}");
    fs::write(dir.path().join("won2.yaml"), &text).unwrap();
    let p = load_profile("won2", dir.path()).unwrap();
    assert_eq!(p.expected, Some(with_lengths), "{text}");
    // A broken one is named with its place and a hint.
    fs::write(
        dir.path().join("bad.yaml"),
        text.replace("sample: 412", "sample: many"),
    )
    .unwrap();
    let err = load_profile("bad", dir.path()).unwrap_err().to_string();
    assert!(err.contains("expected.output_tokens"), "{err}");
}

#[test]
fn names_and_paths_resolve_and_a_miss_lists_what_exists() {
    let dir = dir_with(&[("blackwell.yaml", BASE)]);
    assert_eq!(
        resolve_profile_path("blackwell", dir.path()).unwrap(),
        dir.path().join("blackwell.yaml")
    );
    let path = dir.path().join("blackwell.yaml");
    assert_eq!(
        resolve_profile_path(path.to_str().unwrap(), Path::new("/nonexistent")).unwrap(),
        path
    );
    let e = resolve_profile_path("blackwel", dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("did you mean `blackwell`?") && e.contains("available: blackwell"),
        "{e}"
    );
}

#[test]
fn ports_above_65535_are_refused() {
    let dir = dir_with(&[("p.yaml", "model: m\nlauncher: [x]\nport_base: 65530\n")]);
    let p = load_profile("p", dir.path()).unwrap();
    assert_eq!(p.port_for_gpu("h", 5).unwrap(), 65535);
    let e = p.port_for_gpu("h", 7).unwrap_err().to_string();
    assert!(
        e.contains("port 65537 (65530 + 7), above 65535") && e.contains("at most 65528"),
        "{e}"
    );
}

#[test]
fn the_shipped_blackwell_profiles_match_the_seed_setup() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let no = load_profile("blackwell-no-buffer", &dir).unwrap();
    let extra = load_profile("blackwell-extra-buffer", &dir).unwrap();
    assert_eq!(no.model, "/models/Qwen3.6-27B");
    assert_eq!(no.port_base, 30000);
    assert_eq!(no.server.mem_fraction_static, Some(0.85));
    assert_eq!(no.server.attention_backend.as_deref(), Some("flashinfer"));
    assert_eq!(no.server.extra_args, ["--trust-remote-code"]);
    assert_eq!(no.health.startup_timeout, Duration::from_secs(20 * 60));
    assert_eq!(no.server.mamba_strategy, Some(MambaStrategy::NoBuffer));
    assert_eq!(
        extra.server.mamba_strategy,
        Some(MambaStrategy::ExtraBuffer)
    );
    let same_otherwise = Profile {
        name: no.name.clone(),
        path: no.path.clone(),
        server: ServerSettings {
            mamba_strategy: no.server.mamba_strategy,
            ..extra.server.clone()
        },
        ..extra
    };
    assert_eq!(same_otherwise, no);
}

#[test]
fn to_yaml_keeps_strings_that_look_like_other_things() {
    let text = r#"model: "/models/a: b # c"
launcher: ["python", "-c", "print('x'); $(id)", "yes", "no", "null", "~", "1.10", "multi
  line"]
env: {A: "true", B: "0x10", C: "-", D: ""}
"#;
    let dir = dir_with(&[]);
    let p = profile_from_str(text, &dir.path().join("odd.yaml"), dir.path()).unwrap();
    assert_eq!(p.launcher[2], "print('x'); $(id)");
    assert_eq!(p.launcher[8], "multi line");
    let again = profile_from_str(&p.to_yaml(), &dir.path().join("odd.yaml"), dir.path()).unwrap();
    assert_eq!(again, p, "{}", p.to_yaml());
}

#[test]
fn override_keys_outside_the_schema_are_named() {
    let dir = dir_with(&[("base.yaml", BASE)]);
    let hints: Vec<Option<String>> = [
        "mem_fraction_static",
        "server",
        "extends",
        "server.tp",
        "gpu.x",
        "env.1X",
    ]
    .iter()
    .map(|k| {
        let o = Override {
            key: k.to_string(),
            value: "1".into(),
        };
        let p = problems(load_profile_with("base", dir.path(), &[o]));
        assert_eq!(
            (p[0].field.as_str(), p[0].message.as_str(), p[0].line),
            (*k, "unknown key", 0)
        );
        assert_eq!(p[0].file, PathBuf::from(format!("--set {k}=1")));
        p[0].hint.clone()
    })
    .collect();
    assert_eq!(
        hints[0].as_deref(),
        Some("did you mean `server.mem_fraction_static`?")
    );
    assert!(
        hints[1]
            .as_deref()
            .unwrap()
            .contains("`server` is a section")
    );
    assert!(hints[2].as_deref().unwrap().contains("cannot be set"));
    assert_eq!(hints[3].as_deref(), Some("did you mean `server.tp_size`?"));
    assert!(hints[4].as_deref().unwrap().starts_with("settable:"));
    assert!(
        hints[5]
            .as_deref()
            .unwrap()
            .contains("environment variable")
    );
}

#[test]
fn poll_must_be_shorter_than_the_startup_timeout() {
    let dir = dir_with(&[(
        "p.yaml",
        "model: m\nlauncher: [x]\nhealth: {startup_timeout: 30s, poll: 1m}\n",
    )]);
    let p = problems(load_profile("p", dir.path()));
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(
        (p[0].line, p[0].column, p[0].field.as_str()),
        (3, 38, "health.poll")
    );
    assert_eq!(
        p[0].hint.as_deref(),
        Some("startup_timeout is 30s, poll is 1m")
    );
}

#[test]
fn layout_keys_read_as_one_layout_and_sglangs_rules_name_the_key() {
    let dir = dir_with(&[(
        "tp.yaml",
        "model: m\nlauncher: [x]\nserver:\n  tp_size: 4\n  dp_size: 2\n  ep_size: 4\n",
    )]);
    let p = load_profile("tp", dir.path()).unwrap();
    assert_eq!(p.server.parallel.gpus(), 8);
    assert_eq!(p.server.parallel.to_string(), "tp4×dp2 ep4");
    let again = profile_from_str(&p.to_yaml(), &dir.path().join("tp.yaml"), dir.path()).unwrap();
    assert_eq!(again, p, "{}", p.to_yaml());
    let bad = dir_with(&[(
        "bad.yaml",
        "model: m\nlauncher: [x]\nserver:\n  tp_size: 4\n  dp_size: 3\n  enable_dp_attention: true\n  ep_size: 8\n  nnodes: 3\n  extra_args: [--tp-size, '2']\n",
    )]);
    let shown: Vec<String> = problems(load_profile("bad", bad.path()))
        .iter()
        .map(Problem::to_string)
        .collect();
    assert_eq!(shown.len(), 4, "{shown:#?}");
    let expected = [
        "bad.yaml:5:12: server.dp_size: with enable_dp_attention",
        "bad.yaml:7:12: server.ep_size: ep_size 8 must divide tp_size 4",
        "bad.yaml:8:11: server.nnodes: a server's 4 GPUs do not divide over nnodes 3",
        "bad.yaml:9:16: server.extra_args[0]: `--tp-size` is set by fleet (use `server.tp_size` instead)",
    ];
    for (line, want) in shown.iter().zip(expected) {
        assert!(line.contains(want), "{want}\nin {shown:#?}");
    }
}

#[test]
fn a_router_block_loads_with_defaults_and_shows_back() {
    let text = format!("{BASE}router:\n  launcher: [smg, launch]\n  host: ct200\n");
    let dir = dir_with(&[("r.yaml", &text), ("base.yaml", BASE)]);
    let p = load_profile("r", dir.path()).unwrap();
    let r = p.router.clone().expect("a router");
    assert_eq!(r.launcher, ["smg", "launch"]);
    assert_eq!(
        (r.port, r.policy.as_str(), r.dp_aware),
        (30080, "cache_aware", false)
    );
    assert_eq!(r.host.as_deref(), Some("ct200"));
    let yaml = p.to_yaml();
    assert!(
        yaml.contains("router:") && yaml.contains("policy: cache_aware"),
        "{yaml}"
    );
    assert_eq!(load_profile("base", dir.path()).unwrap().router, None);
}

#[test]
fn a_router_block_refuses_what_fleet_sets_a_servers_port_and_no_launcher() {
    let text = format!(
        "{BASE}router:\n  port: 30003\n  extra_args: [--worker-urls, http://x:1, --api-key=k]\n"
    );
    let dir = dir_with(&[("r.yaml", &text)]);
    let p = problems(load_profile("r", dir.path()));
    let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "router.launcher",
            "router.port",
            "router.extra_args[0]",
            "router.extra_args[2]"
        ],
        "{p:?}"
    );
    assert!(p[1].message.contains("among the servers' ports"), "{p:?}");
    assert!(
        p[3].message.contains("`--api-key` is set by fleet"),
        "{p:?}"
    );
}

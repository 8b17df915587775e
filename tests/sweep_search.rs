//! `fleet sweep` searching ranges end to end on `sglang-sim`: the adaptive search over two
//! strategies × the static fraction × the decode graph bound finds a config within 3% of the
//! space's best without crowning an OOM, and a flag axis the host's SGLang does not know by
//! that exact name is refused before anything starts.

mod common;
mod sweep_common;

use sweep_common::{Fleet, serial};

/// 1 s of warm-up and a 4 s window, short prompts.
const TRIALS: &[&str] = &[
    "--input-len",
    "32",
    "--output-len",
    "24",
    "--warmup",
    "1s",
    "--duration",
    "4s",
];

#[test]
fn the_adaptive_search_finds_the_best_of_a_ranged_space_without_crowning_an_oom() {
    let _g = serial();
    let f = Fleet::new(4, &["mem_fraction_static: 0.85"], &[]);
    let mut args = vec![
        "--strategies",
        "no_buffer,extra_buffer",
        "--set",
        "server.mem_fraction_static=0.80..0.94",
        "--set",
        "flag.cuda-graph-max-bs-decode=16..512",
        "--trials",
        "16",
    ];
    args.extend_from_slice(TRIALS);
    let (code, r, err) = f.sweep_json(&args);
    assert_eq!(code, 0, "{err}");
    let file = f.file();
    assert_eq!(file["spec"]["search"]["strategy"], "adaptive", "{file:#}");
    assert_eq!(file["search"]["stopped"], "trials");
    let trials = file["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 16);
    // The profile's own values lead: its static fraction, the middle of the rest.
    let first = file["search"]["proposed"][0]["id"].as_str().unwrap();
    assert!(
        first.contains("server.mem_fraction_static=0.850"),
        "{first}"
    );
    // Graphs up to 512 do not fit beside a 0.94 static pool: some candidates fail to start.
    let winner = r["winner"].as_str().expect("a winner").to_string();
    let won = trials
        .iter()
        .find(|t| t["candidate"]["id"] == winner.as_str() || label(t) == winner)
        .unwrap_or_else(|| panic!("{winner} in {file:#}"));
    assert_eq!(won["outcome"]["state"], "ok", "an OOM is never crowned");
    // The space's best: no_buffer at the top static fraction, with the default bound (256),
    // above the cap and small enough to fit.
    let best = f.ideal(&[
        ("server.mamba_strategy", "no_buffer"),
        ("server.mem_fraction_static", "0.94"),
    ]);
    let setting = |key: &str| {
        won["candidate"]["settings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s[0] == key)
            .map(|s| s[1].as_str().unwrap().to_string())
            .unwrap()
    };
    let bs = setting("flag.cuda-graph-max-bs-decode");
    let extra = format!("[--cuda-graph-max-bs-decode, \"{bs}\"]");
    let found = f.ideal(&[
        ("server.mamba_strategy", &setting("server.mamba_strategy")),
        (
            "server.mem_fraction_static",
            &setting("server.mem_fraction_static"),
        ),
        ("server.extra_args", &extra),
    ]);
    let summary = trials
        .iter()
        .map(|t| {
            format!(
                "{} {} {}",
                label(t),
                t["outcome"]["state"],
                t["outcome"]["output_tok_s_per_gpu"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        found >= 0.97 * best,
        "{winner}: {found:.0} tok/s against the best {best:.0}; trials:\n{summary}"
    );
    assert!(f.records().is_empty(), "nothing left running");
}

fn label(t: &serde_json::Value) -> String {
    t["candidate"]["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let (k, v) = (s[0].as_str().unwrap(), s[1].as_str().unwrap());
            match k.strip_prefix("server.").unwrap_or(k) {
                "mamba_strategy" => v.to_string(),
                short => format!("{short}={v}"),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_flag_axis_is_checked_against_the_host_s_help_before_anything_starts() {
    let _g = serial();
    let f = Fleet::new(1, &[], &[]);
    let (code, _, err) = f.fleet(&[
        "sweep",
        "--profile",
        "base",
        "--set",
        "flag.cuda-graph-max-bs=8..64",
        "--set",
        "flag.schedule-conservativness=0.5,1.5",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--cuda-graph-max-bs-decode") && err.contains("--cuda-graph-max-bs-prefill"),
        "{err}"
    );
    assert!(
        err.contains("did you mean --schedule-conservativeness?"),
        "{err}"
    );
    assert_eq!(f.busy_gpus(), 0, "nothing started");
}

//! `fleet sweep` end to end: the real `fleet` binary against `sglang-sim` servers on a local
//! simulated fleet (and one case through sshd + a fake `pct`): the seed scenario, a scenario
//! the overlap strategy wins, an axis value that runs out of memory, interrupt and resume,
//! `--write-profile` round trip and `--apply`.

mod common;
mod sweep_common;

use std::time::Duration;

use serde_json::Value;
use sweep_common::{Fleet, SHORT_TRIALS, row, serial, short, tok_per_gpu};

#[test]
fn seed_scenario_no_buffer_wins_by_far_and_the_winner_round_trips_as_a_profile() {
    let _g = serial();
    let f = Fleet::new(
        2,
        &["mem_fraction_static: 0.85", "mamba_strategy: extra_buffer"],
        &[],
    );
    f.prompts(500);
    let (code, r, err) = f.sweep_json(&[
        "--strategies",
        "extra_buffer,no_buffer",
        "--prompts",
        "prompts.jsonl",
        "--sample",
        "100",
        "--warmup",
        "2s",
        "--duration",
        "4s",
        "--write-profile",
        "profiles/winner.yaml",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["mode"], "parallel");
    assert_eq!(r["winner"], "no_buffer", "{r:#}");
    let (nb, eb) = (row(&r, "no_buffer"), row(&r, "extra_buffer"));
    assert_eq!(nb["rank"], 1);
    assert_eq!(nb["trial"]["outcome"]["cap"], 72);
    assert_eq!(eb["trial"]["outcome"]["cap"], 37);
    // The strategy each server resolved, read back from /server_info.
    assert_eq!(nb["trial"]["outcome"]["strategy"], "no_buffer");
    assert_eq!(eb["trial"]["outcome"]["strategy"], "extra_buffer");
    let ratio = tok_per_gpu(nb) / tok_per_gpu(eb);
    assert!(
        ratio > 5.0,
        "no_buffer should win by a wide margin, got {ratio:.2}x"
    );
    assert!(eb["ratio"].as_f64().unwrap() < 0.2);
    assert!(
        r["deciding_factor"]
            .as_str()
            .unwrap()
            .starts_with("no_buffer: cap 72 vs 37"),
        "{r:#}"
    );
    // The ETA is for every line of --prompts on every GPU, at the measured mean output.
    assert_eq!(r["dataset"]["prompts"], 500);
    assert_eq!(r["dataset"]["gpus"], 2);
    let (eta_nb, eta_eb) = (
        nb["eta_hours"].as_f64().unwrap(),
        eb["eta_hours"].as_f64().unwrap(),
    );
    assert!(eta_eb > 5.0 * eta_nb, "{eta_eb} vs {eta_nb}");
    // Each candidate ran on its own GPU; the servers are gone afterwards.
    assert_ne!(nb["trial"]["gpus"], eb["trial"]["gpus"]);
    assert!(f.records().is_empty(), "{:?}", f.records());
    assert_eq!(f.busy_gpus(), 0);
    assert_eq!(f.file()["trials"].as_array().unwrap().len(), 2);

    let (code, shown, err) = f.fleet(&["profile", "show", "profiles/winner.yaml"]);
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("mamba_strategy: no_buffer"), "{shown}");
    assert!(shown.contains("max_running_requests: 72"), "{shown}");
    // Written rounded to one decimal (half away from zero, unlike `{:.1}`).
    let written_tok: f64 = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("output_tok_s_per_gpu: "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no output_tok_s_per_gpu in\n{shown}"));
    assert!(
        (written_tok - tok_per_gpu(nb)).abs() <= 0.05 + 1e-9,
        "{written_tok} vs measured {}",
        tok_per_gpu(nb)
    );
    let written = std::fs::read_to_string(f.path().join("profiles/winner.yaml")).unwrap();
    assert!(written.contains("extends: base"), "{written}");

    // The output lengths every trial saw, pooled, are the projection's and the winner's prior:
    // a job on a fleet started from that profile begins from them, and says so.
    assert_eq!(
        r["dataset"]["output_tokens_source"], "sweep",
        "{:#}",
        r["dataset"]
    );
    assert!(written.contains("output_tokens:"), "{written}");
    let (code, _, err) = f.fleet(&["up", "--profile", "winner"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = f.fleet(&[
        "generate",
        "--prompts",
        "prompts.jsonl",
        "--out",
        "out",
        "--limit",
        "60",
    ]);
    assert_eq!(code, 0, "{err}");
    let progress: Value =
        serde_json::from_slice(&std::fs::read(f.path().join("out/progress.json")).unwrap())
            .unwrap();
    assert_eq!(progress["completed"], 60);
    assert_eq!(
        progress["length_estimate"]["source"], "sweep+job",
        "{progress:#}"
    );
    let (code, _, err) = f.fleet(&["down", "--grace", "2s"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn extra_buffer_wins_when_state_copies_are_free_and_apply_runs_it_everywhere() {
    let _g = serial();
    // Equal caps (32 each), no copy cost, and overlap worth 1.6x: the overlap strategy wins.
    let f = Fleet::new(
        2,
        &["mem_fraction_static: 0.85", "max_running_requests: 32"],
        &[
            ("SGLANG_SIM_EXTRA_BUFFER_COPY_MS", "0"),
            ("SGLANG_SIM_OVERLAP_RESERVE_GIB", "0"),
            ("SGLANG_SIM_OVERLAP_SPEEDUP", "1.6"),
        ],
    );
    let (code, r, err) = f.sweep_json(&[
        "--strategies",
        "no_buffer,extra_buffer",
        "--input-len",
        "32",
        "--output-len",
        "24",
        "--warmup",
        "2s",
        "--duration",
        "4s",
        "--total",
        "100000",
        "--apply",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["winner"], "extra_buffer", "{r:#}");
    let (eb, nb) = (row(&r, "extra_buffer"), row(&r, "no_buffer"));
    assert_eq!(eb["trial"]["outcome"]["cap"], 32);
    assert_eq!(nb["trial"]["outcome"]["cap"], 32);
    let ratio = tok_per_gpu(eb) / tok_per_gpu(nb);
    assert!(ratio > 1.25, "expected about 1.6x, got {ratio:.2}x");
    assert!(
        r["deciding_factor"]
            .as_str()
            .unwrap_or("")
            .contains("inter-token latency"),
        "{r:#}"
    );
    assert_eq!(r["dataset"]["prompts"], 100000);
    // --apply: the winner on every GPU.
    let records = f.records();
    assert_eq!(records.len(), 2, "{records:?}");
    for rec in &records {
        let argv: Vec<&str> = rec["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let i = argv
            .iter()
            .position(|a| a.starts_with("--mamba-"))
            .expect("a strategy flag");
        assert_eq!(argv[i + 1], "extra_buffer", "{argv:?}");
    }
    let (code, _, err) = f.fleet(&["down", "--grace", "2s"]);
    assert_eq!(code, 0, "{err}");
    assert!(f.records().is_empty());
}

#[test]
fn an_axis_value_that_runs_out_of_memory_is_a_failed_row_and_the_sweep_goes_on() {
    let _g = serial();
    let f = Fleet::new(2, &["mamba_strategy: no_buffer"], &[]);
    let (code, r, err) = f.sweep_json(&short(&[
        "--set",
        "server.mem_fraction_static=0.30,0.85",
        // Through the OpenAI chat endpoint, streamed with usage in the last chunk.
        "--endpoint",
        "chat",
    ]));
    assert_eq!(code, 1, "a failed trial makes the exit code 1: {err}");
    assert_eq!(r["winner"], "mem_fraction_static=0.85");
    let bad = row(&r, "mem_fraction_static=0.30");
    assert_eq!(bad["trial"]["outcome"]["state"], "failed");
    assert!(
        bad["trial"]["outcome"]["reason"]
            .as_str()
            .unwrap()
            .contains("exited during startup"),
        "{bad:#}"
    );
    let tail: Vec<&str> = bad["trial"]["outcome"]["log_tail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        tail.iter().any(|l| l.contains("Not enough memory")),
        "{tail:?}"
    );
    let good = &row(&r, "mem_fraction_static=0.85")["trial"]["outcome"];
    assert!(
        good["output_tok_s_per_gpu"].as_f64().unwrap() > 100.0,
        "{good:#}"
    );
    assert!(good["completed"].as_u64().unwrap() > 0, "{good:#}");
    let mean = good["mean_output_tokens"].as_f64().unwrap();
    assert!(
        mean > 1.0 && mean <= 24.0,
        "chat usage gives the output tokens: {mean}"
    );
    // The text report shows the failure and its log.
    let (_, text, _) = f.fleet(&short(&[
        "sweep",
        "--profile",
        "base",
        "--set",
        "server.mem_fraction_static=0.30,0.85",
        "--endpoint",
        "chat",
        "--resume",
    ]));
    assert!(text.contains("failed: mem_fraction_static=0.30:"), "{text}");
    assert!(text.contains("    | "), "{text}");
    assert!(f.records().is_empty());
}

#[test]
fn a_server_that_dies_mid_trial_is_a_failed_row_with_its_log() {
    let _g = serial();
    let f = Fleet::new(2, &["mamba_strategy: no_buffer"], &[]);
    let (code, r, err) = f.sweep_json(&short(&["--set", "env.SGLANG_SIM_DIE_AFTER=1000000,20"]));
    assert_eq!(code, 1, "{err}");
    let dead = row(&r, "env.SGLANG_SIM_DIE_AFTER=20");
    let reason = dead["trial"]["outcome"]["reason"].as_str().unwrap();
    assert!(reason.contains("stopped answering mid-trial"), "{dead:#}");
    assert!(
        !dead["trial"]["outcome"]["log_tail"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{dead:#}"
    );
    assert_eq!(r["winner"], "env.SGLANG_SIM_DIE_AFTER=1000000");
    assert!(f.records().is_empty(), "{:?}", f.records());
}

#[test]
fn a_flag_value_preflight_rejects_is_a_failed_row_and_nothing_of_it_starts() {
    let _g = serial();
    let f = Fleet::new(2, &["mamba_strategy: no_buffer"], &[]);
    let (code, r, err) = f.sweep_json(&short(&[
        "--set",
        "server.attention_backend=flashinfer,flashinfr",
    ]));
    assert_eq!(code, 1, "{err}");
    let bad = &row(&r, "attention_backend=flashinfr")["trial"]["outcome"];
    assert_eq!(bad["state"], "failed");
    let reason = bad["reason"].as_str().unwrap();
    assert!(reason.starts_with("preflight:"), "{reason}");
    assert!(reason.contains("flashinfr"), "{reason}");
    assert_eq!(r["winner"], "attention_backend=flashinfer");
    // Its GPU never ran a server: only the good candidate's run directory exists (beside
    // `up`'s lock files).
    let dirs = std::fs::read_dir(f.local.run_dir())
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count();
    assert_eq!(dirs, 1);
}

#[test]
fn an_interrupted_sweep_stops_its_servers_and_resume_runs_only_the_missing_trials() {
    let _g = serial();
    let f = Fleet::new(1, &["mem_fraction_static: 0.85"], &[]);
    let args = short(&[
        "sweep",
        "--profile",
        "base",
        "--strategies",
        "no_buffer,extra_buffer_lazy,extra_buffer",
        "--json",
        "--write-profile",
        "winner.yaml",
    ]);
    let mut sweep = f.spawn(&args);
    f.wait_trials(1);
    // Mid-sweep: the second candidate is being measured.
    sweep.wait_for_line("measuring extra_buffer_lazy");
    let (code, err) = sweep.interrupt();
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("--resume"), "{err}");
    assert!(
        !f.path().join("winner.yaml").exists(),
        "no winner before every candidate is measured"
    );
    assert!(
        f.records().is_empty(),
        "the interrupted sweep left servers: {:?}",
        f.records()
    );
    let before = f.file();
    let finished = before["trials"].as_array().unwrap().clone();
    assert!((1..3).contains(&finished.len()), "{before:#}");
    assert_eq!(
        finished[0]["candidate"]["id"],
        "server.mamba_strategy=no_buffer"
    );

    let mut resumed: Vec<&str> = args.to_vec();
    resumed.push("--resume");
    let (code, out, err) = f.fleet(&resumed);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!(
            "resuming: {} of 3 trials already finished",
            finished.len()
        )),
        "{err}"
    );
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["rows"].as_array().unwrap().len(), 3);
    assert!(r["pending"].as_array().unwrap().is_empty());
    let after = f.file();
    let trials = after["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 3);
    assert!(f.path().join("winner.yaml").exists());
    // Finished trials were not run again: their measurements are unchanged.
    assert_eq!(trials[..finished.len()], finished[..]);
    // A fresh sweep does not overwrite them.
    let (code, _, err) = f.fleet(&args);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--resume"), "{err}");
}

#[test]
fn dry_run_lists_candidates_and_their_gpus_and_bad_axes_are_usage_errors() {
    let f = Fleet::new(8, &["mem_fraction_static: 0.85"], &[]);
    let (code, out, err) = f.fleet(&[
        "sweep",
        "--profile",
        "base",
        "--strategies",
        "extra_buffer,no_buffer",
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("2 candidates, parallel"), "{out}");
    assert!(out.contains("local:0,2,4,6"), "{out}");
    assert!(out.contains("local:1,3,5,7"), "{out}");
    assert_eq!(f.busy_gpus(), 0);
    let (code, out, err) = f.fleet(&[
        "--json",
        "sweep",
        "--profile",
        "base",
        "--strategies",
        "no_buffer",
        "--sequential",
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "sequential");
    assert_eq!(
        v["candidates"][0]["gpus"].as_array().unwrap().len(),
        f.gpus as usize
    );

    let (code, _, err) = f.fleet(&["sweep", "--profile", "base", "--strategies", "no_bufer"]);
    assert_eq!(code, 2);
    assert!(err.contains("no_bufer"), "{err}");
    let (code, _, err) = f.fleet(&[
        "sweep",
        "--profile",
        "base",
        "--set",
        "server.mem_fraction_static",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("expected KEY=V1,V2"), "{err}");
}

#[test]
fn a_sweep_through_ssh_and_pct() {
    let _g = serial();
    let sshd = common::Sshd::start_with_env(&[("FAKE_PCT_RUNNING", "200")]);
    let home = sshd.home("pve");
    let f = Fleet::new(2, &["mem_fraction_static: 0.85"], &[]);
    let inventory = home.write_inventory(
        "hosts:\n  - name: ct200\n    ssh: pve\n    container: 200\n    address: 127.0.0.1\n    gpus: [0, 1]\n",
    );
    let profiles = f.path().join("profiles");
    let out = home
        .fleet()
        .args(["--config"])
        .arg(&inventory)
        .arg("--profiles-dir")
        .arg(&profiles)
        .args(short(&[
            "--json",
            "sweep",
            "--profile",
            "base",
            "--strategies",
            "extra_buffer,no_buffer",
        ]))
        // The default run dir, /tmp/fleet, inside the container's own /tmp.
        .env_remove("FLEET_RUN_DIR")
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}\nsshd:\n{}", sshd.log());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["winner"], "no_buffer", "{r:#}");
    assert_eq!(row(&r, "no_buffer")["trial"]["gpus"][0]["host"], "ct200");
    assert!(tok_per_gpu(row(&r, "no_buffer")) > 3.0 * tok_per_gpu(row(&r, "extra_buffer")));
    // The servers ran in the container (their logs are there) and were all stopped.
    let run_dir = sshd.container_path(200, "/tmp/fleet");
    let servers: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", run_dir.display()))
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    assert!(
        !servers.is_empty() && servers.iter().all(|d| d.join("server.log").exists()),
        "{servers:?}"
    );
    let running: Vec<_> = servers
        .iter()
        .filter(|d| d.join("instance.json").exists())
        .collect();
    assert!(running.is_empty(), "still recorded as running: {running:?}");
}

/// DESIGN §1 as typed: `fleet up --profile P`, then `fleet sweep --strategies ...` measures
/// from P without being told.
#[test]
fn without_profile_the_sweep_measures_from_the_fleet_that_is_up() {
    let _g = serial();
    let f = Fleet::new(4, &["mem_fraction_static: 0.85"], &[]);
    let (code, _, err) = f.fleet(&["sweep", "--strategies", "extra_buffer,no_buffer"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no --profile given, and no fleet is up") && err.contains("pass --profile"),
        "{err}"
    );

    let (code, _, err) = f.fleet(&["up", "--profile", "base"]);
    assert_eq!(code, 0, "{err}");
    let mut args = vec!["--json", "sweep", "--strategies", "extra_buffer,no_buffer"];
    args.extend_from_slice(SHORT_TRIALS);
    let (code, out, err) = f.fleet(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("measuring from profile base, the one the running fleet was started with"),
        "{err}"
    );
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["rows"].as_array().unwrap().len(), 2, "{report:#}");
    assert_eq!(f.file()["spec"]["profile"], "base");
    assert!(f.records().is_empty(), "the sweep stopped what it measured");
}

#[test]
fn without_profile_several_profiles_up_are_named_and_nothing_starts() {
    let f = Fleet::new(2, &[], &[]);
    let other = std::fs::read_to_string(f.path().join("profiles/base.yaml"))
        .unwrap()
        .replace("context_length: 8192", "context_length: 4096");
    f.local.write_profile("other", &other);
    assert_eq!(f.fleet(&["up", "--profile", "base", "--gpus", "0"]).0, 0);
    assert_eq!(f.fleet(&["up", "--profile", "other", "--gpus", "1"]).0, 0);
    let (code, _, err) = f.fleet(&["sweep", "--strategies", "extra_buffer,no_buffer"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("the running fleet runs 2 profiles: base (on local:0), other (on local:1)")
            && err.contains("pass --profile"),
        "{err}"
    );
    assert_eq!(f.records().len(), 2, "the sweep touched nothing");
}

#[test]
fn a_set_value_with_a_comma_is_quoted_or_escaped() {
    let f = Fleet::new(2, &[], &[]);
    let (code, out, err) = f.fleet(&[
        "--json",
        "sweep",
        "--profile",
        "base",
        "--set",
        r#"env.SGLANG_SIM_NOTE="a,b",c\,d"#,
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let labels: Vec<&str> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        [r#"env.SGLANG_SIM_NOTE="a,b""#, "env.SGLANG_SIM_NOTE=c,d"]
    );
    let (code, _, err) = f.fleet(&[
        "sweep",
        "--profile",
        "base",
        "--set",
        "server.mem_fraction_static=0.8,0.80",
        "--dry-run",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains(r#""0.80" is the same value as "0.8""#),
        "{err}"
    );
}

//! `fleet sweep` with more candidates than GPUs, end to end on `sglang-sim`: rounds that fill
//! the GPUs, successive halving (clear losers stopped after a first window, a close race and the
//! true best never), `--no-prune`, an out-of-memory candidate in a round, the `--dry-run` plan of
//! rounds, and an interrupted multi-round sweep resumed with only its missing candidates.

mod common;
mod sweep_common;

use serde_json::Value;
use sweep_common::{Fleet, row, serial, tok_per_gpu};

/// 1 s of warm-up and a 4 s window: a first window of 1 s in 8 bins of 125 ms.
const ROUND_TRIALS: &[&str] = &[
    "--input-len",
    "32",
    "--output-len",
    "24",
    "--warmup",
    "1s",
    "--duration",
    "4s",
];

fn rounds<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [args, ROUND_TRIALS].concat()
}

fn state(row: &Value) -> &str {
    row["trial"]["outcome"]["state"].as_str().unwrap()
}

fn labels_in(report: &Value, wanted: &str) -> Vec<String> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| state(r) == wanted)
        .map(|r| r["label"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn clear_losers_are_pruned_after_the_first_window_and_twins_with_the_best_ideal_run_it_all() {
    let _g = serial();
    let f = Fleet::new(2, &["mem_fraction_static: 0.85"], &[]);
    // Two no_buffer twins (a max_running_requests above the cap of 72 changes nothing) and two
    // extra_buffer twins, on 2 GPUs: the no_buffer pair runs first, then the extra_buffer pair
    // is judged against it.
    let args = rounds(&[
        "--strategies",
        "no_buffer,extra_buffer",
        "--set",
        "server.max_running_requests=200,300",
    ]);
    let (code, r, err) = f.sweep_json(&args);
    assert_eq!(code, 0, "a pruned candidate is no failure: {err}");
    assert_eq!(r["mode"], "rounds");
    assert_eq!(r["first_window_s"], 1.0);
    let nb_ideal = f.ideal(&[("server.mamba_strategy", "no_buffer")]);
    let eb_ideal = f.ideal(&[("server.mamba_strategy", "extra_buffer")]);
    assert!(nb_ideal > 5.0 * eb_ideal, "{nb_ideal} vs {eb_ideal}");

    let mut pruned = labels_in(&r, "pruned");
    pruned.sort();
    assert_eq!(
        pruned,
        [
            "extra_buffer max_running_requests=200",
            "extra_buffer max_running_requests=300"
        ],
        "{r:#}"
    );
    // The twins of the best ideal are a close race: neither stops the other.
    let mut full = labels_in(&r, "ok");
    full.sort();
    assert_eq!(
        full,
        [
            "no_buffer max_running_requests=200",
            "no_buffer max_running_requests=300"
        ]
    );
    let winner = r["winner"].as_str().unwrap();
    assert!(winner.starts_with("no_buffer"), "{r:#}");
    for label in &pruned {
        let p = row(&r, label);
        let outcome = &p["trial"]["outcome"];
        assert!(
            outcome["leader_label"]
                .as_str()
                .unwrap()
                .starts_with("no_buffer")
        );
        let own = &p["trial"]["first_window"]["estimate"];
        let leader = &outcome["leader_estimate"];
        assert!(own["high"].as_f64().unwrap() < leader["low"].as_f64().unwrap());
        assert_eq!(p["trial"]["first_window"]["after_s"], 1.0);
        // Its figure so far is the first window's, far below the winner's.
        assert!(tok_per_gpu(p) < 0.3 * tok_per_gpu(row(&r, winner)), "{p:#}");
        assert_eq!(p["trial"]["gpus"].as_array().unwrap().len(), 1);
    }
    // The survivors' measured window is the full one, with an interval of its own.
    let w = &row(&r, winner)["trial"];
    assert_eq!(w["outcome"]["estimate"]["samples"], 32);
    assert!(w["first_window"]["estimate"]["mean"].as_f64().unwrap() > 0.0);
    // sweep.json holds the same, and nothing is left running.
    let file = f.file();
    assert_eq!(file["format"], 3);
    assert_eq!(file["spec"]["mode"], "rounds");
    // The search it ran: the grid's axes, every candidate proposed, and why it stopped.
    assert_eq!(file["spec"]["search"]["strategy"], "grid");
    assert_eq!(file["search"]["proposed"].as_array().unwrap().len(), 4);
    assert_eq!(file["search"]["stopped"], "exhausted");
    assert!(
        file["search"]["elapsed_s"].as_f64().unwrap() > 4.0,
        "{file:#}"
    );
    let states: Vec<&str> = file["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["outcome"]["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.iter().filter(|s| **s == "pruned").count(), 2);
    assert!(f.records().is_empty(), "{:?}", f.records());
    assert_eq!(f.busy_gpus(), 0);

    // The table says the same.
    let mut text_args = vec!["sweep", "--profile", "base", "--resume"];
    text_args.extend_from_slice(&args);
    let (code, text, err) = f.fleet(&text_args);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("1s, pruned"), "{text}");
    assert!(text.contains("pruned after a first window of 1s"), "{text}");

    // --no-prune: every candidate gets the whole window.
    let mut all = args.clone();
    all.extend(["--no-prune", "--out", "unpruned.json"]);
    let (code, r, err) = f.sweep_json(&all);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["mode"], "rounds");
    assert!(r["first_window_s"].is_null(), "{r:#}");
    assert_eq!(labels_in(&r, "ok").len(), 4, "{r:#}");
    assert!(r["winner"].as_str().unwrap().starts_with("no_buffer"));
}

#[test]
fn an_out_of_memory_candidate_is_a_failed_row_and_its_gpu_goes_to_the_next() {
    let _g = serial();
    let f = Fleet::new(1, &["mamba_strategy: no_buffer"], &[]);
    let (code, r, err) = f.sweep_json(&rounds(&[
        "--set",
        "server.mem_fraction_static=0.30,0.85,0.70",
    ]));
    assert_eq!(code, 1, "a failed trial makes the exit code 1: {err}");
    assert_eq!(r["mode"], "rounds");
    let bad = row(&r, "mem_fraction_static=0.30");
    assert_eq!(state(bad), "failed");
    let reason = bad["trial"]["outcome"]["reason"].as_str().unwrap();
    assert!(reason.contains("exited during startup"), "{bad:#}");
    let tail = bad["trial"]["outcome"]["log_tail"].to_string();
    assert!(tail.contains("Not enough memory"), "{tail}");
    // Both others ran after it, on the one GPU it gave back.
    for label in ["mem_fraction_static=0.85", "mem_fraction_static=0.70"] {
        let t = &row(&r, label)["trial"];
        assert_ne!(t["outcome"]["state"], "failed", "{t:#}");
        assert_eq!(t["gpus"][0]["gpu"], 0);
    }
    let best = if f.ideal(&[("server.mem_fraction_static", "0.85")])
        > f.ideal(&[("server.mem_fraction_static", "0.70")])
    {
        "mem_fraction_static=0.85"
    } else {
        "mem_fraction_static=0.70"
    };
    assert_eq!(r["winner"], best, "{r:#}");
    assert!(f.records().is_empty(), "{:?}", f.records());
}

#[test]
fn dry_run_shows_each_round_with_its_candidates_gpus() {
    let f = Fleet::new(8, &["mem_fraction_static: 0.85"], &[]);
    // The team's 18 candidates on 8 GPUs.
    let args = [
        "--json",
        "sweep",
        "--profile",
        "base",
        "--strategies",
        "extra_buffer,no_buffer,extra_buffer_lazy",
        "--set",
        "server.mem_fraction_static=0.8,0.85,0.88",
        "--set",
        "server.max_running_requests=48,96",
        "--dry-run",
    ];
    let (code, out, err) = f.fleet(&args);
    assert_eq!(code, 0, "{err}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["mode"], "rounds");
    assert_eq!(
        (plan["gpus"].as_u64(), plan["rounds"].as_u64()),
        (Some(8), Some(3))
    );
    assert_eq!(plan["first_window_s"], 15.0, "a quarter of the default 60s");
    let candidates = plan["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 18);
    for (i, c) in candidates.iter().enumerate() {
        assert_eq!(c["round"], i / 8 + 1, "{c:#}");
        assert_eq!(
            c["gpus"],
            serde_json::json!([{"host": "local", "gpu": i % 8}])
        );
        assert!(c["problem"].is_null(), "{c:#}");
    }
    let (code, text, err) = f.fleet(&args[1..]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.starts_with("18 candidates on 8 GPUs, in 3 rounds"),
        "{text}"
    );
    assert!(text.contains("successive halving"), "{text}");
    assert!(!text.contains("sequential"), "{text}");
    let mut unpruned = args[1..].to_vec();
    unpruned.push("--no-prune");
    let (code, text, _) = f.fleet(&unpruned);
    assert_eq!(code, 0);
    assert!(
        text.contains("no pruning: every candidate runs the full 1m"),
        "{text}"
    );
    assert_eq!(f.busy_gpus(), 0);
}

#[test]
fn an_interrupted_multi_round_sweep_resumes_with_only_the_missing_candidates() {
    let _g = serial();
    let f = Fleet::new(1, &["mem_fraction_static: 0.85"], &[]);
    // One GPU, three rounds: no_buffer runs its full window, then extra_buffer is pruned
    // against it; the sweep is interrupted while extra_buffer_lazy, the last, runs.
    let args = rounds(&[
        "--json",
        "sweep",
        "--profile",
        "base",
        "--strategies",
        "no_buffer,extra_buffer,extra_buffer_lazy",
    ]);
    let sweep = f.spawn(&args);
    f.wait_trials(2);
    let (code, err) = sweep.interrupt();
    assert_eq!(code, Some(130), "{err}");
    assert!(f.records().is_empty(), "left running: {:?}", f.records());
    let before = f.file()["trials"].as_array().unwrap().clone();
    assert_eq!(before.len(), 2, "{before:#?}");
    assert_eq!(before[0]["outcome"]["state"], "ok");
    assert_eq!(before[1]["outcome"]["state"], "pruned");

    // The search goes on where it stopped: everything proposed, nothing stopped it yet.
    let file = f.file();
    assert_eq!(file["search"]["proposed"].as_array().unwrap().len(), 3);
    assert!(file["search"]["stopped"].is_null(), "{file:#}");

    // The file as fleet wrote it before sweeps had a search state (format 2: the candidate
    // list in the spec) resumes the same.
    let mut old = file.clone();
    old["format"] = 2.into();
    old["spec"]["candidates"] = file["search"]["proposed"].clone();
    let spec = old["spec"].as_object_mut().unwrap();
    spec.remove("search");
    old.as_object_mut().unwrap().remove("search");
    std::fs::write(f.path().join("sweep.json"), old.to_string()).unwrap();
    let mut resumed = args.clone();
    resumed.push("--resume");
    let (code, out, err) = f.fleet(&resumed);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("resuming: 2 of 3 trials already finished"),
        "{err}"
    );
    assert_eq!(f.file()["format"], 3);
    let r: Value = serde_json::from_str(&out).unwrap();
    let trials = f.file()["trials"].as_array().unwrap().clone();
    assert_eq!(trials.len(), 3);
    // The finished ones were not run again, and the pruned one stays pruned.
    assert_eq!(trials[..2], before[..]);
    // The last is judged against the leader on file.
    let lazy = row(&r, "extra_buffer_lazy");
    assert_eq!(state(lazy), "pruned", "{lazy:#}");
    assert_eq!(lazy["trial"]["outcome"]["leader_label"], "no_buffer");
    assert_eq!(r["winner"], "no_buffer");
    // Pruning is part of what the sweep is: resuming it without is another sweep.
    let mut unpruned = resumed.clone();
    unpruned.push("--no-prune");
    let (code, _, err) = f.fleet(&unpruned);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("pruning (--no-prune) differs"), "{err}");
}

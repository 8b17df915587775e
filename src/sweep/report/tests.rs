//! The sweep report's text and plan, from ranked trials.

use super::*;
use crate::sweep::rank::{Measured, output_tokens};

fn slot(gpu: u32) -> Slot {
    Slot {
        host: "local".into(),
        gpu,
    }
}

fn cand(s: &str) -> Candidate {
    Candidate::new(
        format!("server.mamba_strategy={s}"),
        vec![("server.mamba_strategy".into(), s.into())],
    )
}

fn ok(s: &str, tok: f64, cap: u32, metrics: f64) -> Trial {
    Trial {
        candidate: cand(s),
        gpus: vec![slot(0), slot(2)],
        outcome: Outcome::Ok(Measured {
            gpus: 2,
            server_gpus: 1,
            output_tok_s: tok * 2.0,
            output_tok_s_per_gpu: tok,
            req_s: 1.0,
            completed: 10,
            errors: 0,
            mean_output_tokens: 988.0,
            ttft_s: Some(Percentiles { p50: 0.2, p99: 0.9 }),
            itl_s: Some(Percentiles {
                p50: 0.061,
                p99: 0.08,
            }),
            cap,
            in_flight: cap * 5 / 4,
            kv_tokens: 278_118,
            strategy: Some("no_buffer".into()),
            startup_s: Some(31.0),
            completed_output_tok_s: 1000.0,
            metrics_output_tok_s: Some(metrics),
            estimate: None,
            lengths: Default::default(),
        }),
        first_window: None,
        cache: None,
        prediction: None,
    }
}

fn spec(mode: Mode, first_window_s: Option<f64>) -> SweepSpec {
    SweepSpec {
        profile: "blackwell".into(),
        search: crate::sweep::search::SearchSpec::Grid { axes: vec![] },
        mode,
        workload: WorkloadSpec::Synthetic {
            input_len: 1,
            output_len: 2,
        },
        warmup_s: 15.0,
        duration_s: 60.0,
        first_window_s,
        slo: Default::default(),
    }
}

fn est(mean: f64, half: f64) -> Estimate {
    Estimate::around(mean, half)
}

#[test]
fn the_seed_report_names_winner_factor_etas_and_failures() {
    let trials = vec![
        ok("extra_buffer", 107.0, 37, 1000.0),
        Trial {
            candidate: cand("extra_buffer_lazy"),
            gpus: vec![slot(1)],
            outcome: Outcome::Failed {
                kind: crate::sweep::rank::Failure::OutOfMemory,
                reason: "local gpu1 :30001: the server process exited during startup".into(),
                log_tail: vec!["CUDA out of memory.".into()],
            },
            first_window: None,
            cache: None,
            prediction: None,
        },
        ok("no_buffer", 1180.0, 72, 1200.0),
    ];
    let all = [
        cand("extra_buffer"),
        cand("no_buffer"),
        cand("extra_buffer_lazy"),
        cand("auto"),
    ];
    let tokens = output_tokens(&trials, None, 4096, 654_676).unwrap();
    assert_eq!(tokens.tokens.point, 988.0);
    let d = Dataset::new(654_676, tokens, 8);
    let r = build(&spec(Mode::Parallel, None), &all, &trials, Some(d));
    assert_eq!(r.winner.as_deref(), Some("no_buffer"));
    assert_eq!(r.pending, vec!["auto".to_string()]);
    let t = text(&r);
    assert!(t.contains("no_buffer *"), "{t}");
    assert!(
        t.contains("winner: no_buffer (1180.0 output tok/s per GPU, 11.03x extra_buffer)"),
        "{t}"
    );
    assert!(
        t.contains("deciding factor: no_buffer: cap 72 vs 37"),
        "{t}"
    );
    assert!(t.contains("ETA for 654676 prompts x 988 output tokens on 8 GPUs: no_buffer: 19 h, extra_buffer: 210 h"), "{t}");
    assert!(t.contains("0.09x"), "{t}");
    assert!(t.contains("200/900"), "TTFT p50/p99 in ms: {t}");
    assert_eq!(hours(0.5), "30 min");
    assert_eq!(hours(0.001), "4 s");
    assert_eq!(hours(2.25), "2.2 h");
    assert!(
        t.contains("failed: extra_buffer_lazy: local gpu1 :30001: the server process exited"),
        "{t}"
    );
    assert!(t.contains("    | CUDA out of memory."), "{t}");
    assert!(
        t.contains("warning: no_buffer: the servers' sglang:generation_tokens_total says 1200.0"),
        "{t}"
    );
    assert!(!t.contains("warning: extra_buffer:"), "{t}");
    assert!(t.contains("not measured yet: auto"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["rows"][0]["label"], "no_buffer");
    assert_eq!(json["rows"][0]["trial"]["outcome"]["state"], "ok");
    assert_eq!(json["rows"][2]["trial"]["outcome"]["state"], "failed");
}

#[test]
fn what_the_workload_did_is_said_once_under_the_table() {
    let mut nb = ok("no_buffer", 1180.0, 72, 1000.0);
    nb.cache = Some(rank::CacheUse {
        cached_tokens: 250,
        prompt_tokens: 1000,
    });
    let trials = vec![nb, ok("extra_buffer", 107.0, 37, 1000.0)];
    let all = [cand("extra_buffer"), cand("no_buffer")];
    let mut r = build(&spec(Mode::Parallel, None), &all, &trials, None);
    assert!(!text(&r).contains("do not fit") && !text(&r).contains("drew"));
    r.unfit = Some(Unfit {
        prompts: 3,
        example: "the prompt is 9000 tokens; the context length is 8192".into(),
    });
    r.repeated = Some(Repeated {
        drawn: 900,
        sample: 100,
        usable: Some(500),
    });
    let t = text(&r);
    assert!(t.contains("cached"), "{t}");
    assert!(t.contains("25.0%"), "{t}");
    assert!(
        t.contains("3 prompts of the sample do not fit the context: the prompt is 9000 tokens; the context length is 8192 (left out of every candidate's figures"),
        "{t}"
    );
    assert!(
        t.contains(
            "warning: a trial drew 900 requests from a sample of 100 prompts, so prompts repeated"
        ) && t.contains("raise --sample (the file has 500 usable prompts)"),
        "{t}"
    );
    r.repeated = Some(Repeated {
        drawn: 900,
        sample: 500,
        usable: Some(500),
    });
    assert!(text(&r).contains("the file has only 500 usable prompts"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["unfit"]["prompts"], 3);
    assert_eq!(json["repeated"]["drawn"], 900);
    assert_eq!(json["rows"][0]["trial"]["cache"]["cached_tokens"], 250);
}

#[test]
fn pruned_rows_show_their_first_window_and_whom_they_lost_to() {
    let mut eb = ok("extra_buffer", 107.0, 37, 214.0);
    let Outcome::Ok(measured) = eb.outcome else {
        unreachable!()
    };
    eb.outcome = Outcome::Pruned(rank::Pruned {
        measured,
        leader: cand("no_buffer").id,
        leader_label: "no_buffer".into(),
        leader_estimate: est(1180.0, 20.0),
    });
    eb.first_window = Some(rank::FirstWindow {
        after_s: 15.0,
        estimate: est(107.0, 9.5),
    });
    let all = [cand("no_buffer"), cand("extra_buffer")];
    let d = Dataset {
        prompts: 654_676,
        output_tokens_per_prompt: 988.0,
        output_tokens_interval: None,
        output_tokens_source: None,
        longest_output_tokens: None,
        gpus: 8,
    };
    let trials = [ok("no_buffer", 1180.0, 72, 2360.0), eb];
    let r = build(&spec(Mode::Rounds, Some(15.0)), &all, &trials, Some(d));
    assert_eq!(r.winner.as_deref(), Some("no_buffer"));
    let t = text(&r);
    assert!(t.contains("window"), "{t}");
    assert!(t.contains("15s, pruned"), "{t}");
    assert!(t.contains(" 1m "), "the winner ran the full minute: {t}");
    assert!(
        t.contains("pruned after a first window of 15s (output tok/s per GPU, 95% interval wholly below the leader's; `--no-prune` runs every candidate the full 1m):\n  extra_buffer: 107.0 [97.5, 116.5] vs no_buffer: 1180.0 [1160.0, 1200.0]\n"),
        "{t}"
    );
    assert!(t.contains("extra_buffer: 210 h (pruned)"), "{t}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["first_window_s"], 15.0);
    assert_eq!(json["rows"][1]["trial"]["outcome"]["state"], "pruned");
    assert_eq!(
        json["rows"][1]["trial"]["first_window"]["estimate"]["high"],
        116.5
    );
}

fn planned(label: &str, round: usize, gpus: Vec<Slot>) -> PlannedCandidate {
    PlannedCandidate {
        id: label.into(),
        label: label.into(),
        round,
        gpus,
        argv: vec![],
        problem: None,
    }
}

#[test]
fn dry_run_lists_candidates_and_their_gpus() {
    let p = Plan {
        mode: Mode::Parallel,
        gpus: 3,
        rounds: 1,
        warmup_s: 15.0,
        duration_s: 60.0,
        first_window_s: None,
        candidates: vec![planned(
            "no_buffer",
            1,
            vec![
                slot(0),
                slot(2),
                Slot {
                    host: "b".into(),
                    gpu: 1,
                },
            ],
        )],
    };
    let t = plan_text(&p);
    assert!(t.contains("local:0,2 b:1"), "{t}");
    assert!(t.starts_with("1 candidates, parallel"), "{t}");
    assert!(!t.contains("round"), "{t}");
}

#[test]
fn dry_run_of_rounds_shows_each_round_and_the_first_window() {
    let mut p = Plan {
        mode: Mode::Rounds,
        gpus: 2,
        rounds: 2,
        warmup_s: 15.0,
        duration_s: 60.0,
        first_window_s: Some(15.0),
        candidates: vec![
            planned("a", 1, vec![slot(0)]),
            planned("b", 1, vec![slot(1)]),
            planned("c", 2, vec![slot(0)]),
        ],
    };
    let t = plan_text(&p);
    assert!(t.starts_with("3 candidates on 2 GPUs, in 2 rounds"), "{t}");
    assert!(
        t.contains("after its 15s warm-up each candidate is measured for a first 15s"),
        "{t}"
    );
    assert!(
        t.contains("the others run the full 1m (--no-prune: all do)"),
        "{t}"
    );
    let round_2: Vec<&str> = t
        .lines()
        .filter(|l| l.trim_start().starts_with("2 "))
        .collect();
    assert_eq!(round_2.len(), 1, "{t}");
    assert!(round_2[0].contains("local:0"), "{t}");
    assert!(t.contains("whichever GPU is freed first"), "{t}");
    p.first_window_s = None;
    assert!(plan_text(&p).contains("no pruning: every candidate runs the full 1m"));
}

//! The adaptive search on made-up spaces, through a scheduler in made-up time.

use std::time::Duration;

use super::*;
use crate::sweep::assign::Slot;
use crate::sweep::range::dims;
use crate::sweep::rank::Measured;
use crate::sweep::search::SearchState;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn slots(n: u32) -> Vec<Slot> {
    (0..n)
        .map(|gpu| Slot {
            host: "h".into(),
            gpu,
        })
        .collect()
}

/// The space: 2 strategies × the static fraction × the decode graph bound.
fn space() -> Vec<Dim> {
    dims(
        &s(&["extra_buffer", "no_buffer"]),
        &s(&[
            "server.mem_fraction_static=0.80..0.94",
            "flag.cuda-graph-max-bs-decode=16..512",
        ]),
    )
    .unwrap()
}

/// A space shaped as the sim's: the cap grows with the static fraction; decode batches above
/// the graph bound run eagerly, slower; the graphs' memory and the static pool together run
/// out past an edge. Its best lies just below that edge with the bound just above the cap.
/// `None`: out of memory.
fn objective(c: &Candidate) -> Option<f64> {
    let get = |k: &str| {
        c.settings
            .iter()
            .find(|(key, _)| key.ends_with(k))
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let mfs: f64 = get("mem_fraction_static").parse().unwrap();
    let bs: f64 = get("cuda-graph-max-bs-decode").parse().unwrap();
    if mfs + bs * 0.00012 > 0.955 {
        return None;
    }
    let cap = (mfs - 0.75) * 1000.0;
    let eager = if bs >= cap { 1.0 } else { 0.6 + 0.4 * bs / cap };
    let strategy = if get("mamba_strategy") == "no_buffer" {
        1.0
    } else {
        0.3
    };
    Some(cap * eager * strategy)
}

fn measured(v: f64) -> Measured {
    Measured {
        gpus: 1,
        output_tok_s: v,
        output_tok_s_per_gpu: v,
        req_s: 1.0,
        completed: 10,
        errors: 0,
        mean_output_tokens: 20.0,
        ttft_s: None,
        itl_s: None,
        cap: 8,
        in_flight: 10,
        kv_tokens: 1000,
        strategy: None,
        startup_s: None,
        completed_output_tok_s: v,
        metrics_output_tok_s: None,
        estimate: None,
    }
}

fn trial(c: &Candidate, gpu: &Slot) -> Trial {
    Trial {
        candidate: c.clone(),
        gpus: vec![gpu.clone()],
        outcome: match objective(c) {
            Some(v) => Outcome::Ok(measured(v)),
            None => Outcome::Failed {
                reason: "out of memory".into(),
                log_tail: vec![],
            },
        },
        first_window: None,
        cache: None,
    }
}

fn limits(trials: usize) -> Limits {
    Limits {
        trials,
        budget_s: None,
    }
}

/// The GPUs of the sweep [`search`] makes.
const GPUS: usize = 8;

fn search(trials: usize, state: &SearchState, done: &[Trial]) -> Adaptive {
    let seed = vec![None, Some("0.85".into()), None];
    Adaptive::new(
        space(),
        seed,
        limits(trials),
        Need::AnyGpu,
        GPUS,
        &state.proposed,
        done,
    )
}

/// Rounds on `gpus` GPUs, every candidate of a round ending together, each round a minute:
/// the trials, the rounds, why it stopped. `cut`: interrupted after this many rounds.
fn play(
    a: &mut Adaptive,
    state: &mut SearchState,
    trials: &mut Vec<Trial>,
    gpus: u32,
    cut: usize,
) -> (usize, Option<Stop>) {
    let free = slots(gpus);
    for round in 0..cut {
        let next = a.propose(&View {
            trials,
            proposed: &state.proposed,
            free: &free,
            elapsed: Duration::from_secs(60 * round as u64),
        });
        state.propose(next.run.iter().map(|p| p.candidate.clone()));
        assert!(next.run.len() <= free.len(), "a round fits the GPUs");
        for (p, gpu) in next.run.iter().zip(&free) {
            let t = trial(&p.candidate, gpu);
            a.observe(&t);
            trials.push(t);
        }
        if next.stop.is_some() {
            return (round + usize::from(!next.run.is_empty()), next.stop);
        }
    }
    (cut, None)
}

fn best(trials: &[Trial]) -> (f64, &Trial) {
    trials
        .iter()
        .filter_map(|t| Some((score(t)?, t)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap()
}

/// The space's best, over a fine grid of it.
fn optimum() -> f64 {
    let a = search(1, &SearchState::new(Model::Adaptive { step: 0.25 }), &[]);
    let mut top: f64 = 0.0;
    for st in [0.25, 0.75] {
        for i in 0..=280 {
            for j in 0..=496 {
                let c = a.candidate(&[st, i as f64 / 280.0, j as f64 / 496.0]);
                top = top.max(objective(&c).unwrap_or(0.0));
            }
        }
    }
    top
}

#[test]
fn it_finds_the_best_within_three_percent_in_four_rounds_of_eight_gpus() {
    let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = search(32, &state, &[]);
    let mut trials = Vec::new();
    let (rounds, stop) = play(&mut a, &mut state, &mut trials, 8, usize::MAX);
    assert_eq!(stop, Some(Stop::Trials));
    assert_eq!((rounds, trials.len()), (4, 32));
    let (found, t) = best(&trials);
    let top = optimum();
    assert!(found >= 0.97 * top, "found {found:.1} of {top:.1}");
    assert!(
        objective(&t.candidate).is_some(),
        "an OOM is never the best"
    );
    let ooms = trials
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Failed { .. }))
        .count();
    assert!(ooms <= 8, "the edge is learnt: {ooms} OOMs");
    // The profile's own values lead the sample.
    assert_eq!(
        state.proposed[0].id,
        "server.mamba_strategy=no_buffer;server.mem_fraction_static=0.850;\
         flag.cuda-graph-max-bs-decode=264"
    );
}

#[test]
fn a_resumed_search_proposes_what_an_uninterrupted_one_would() {
    let whole = {
        let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
        let mut trials = Vec::new();
        play(
            &mut search(24, &state, &[]),
            &mut state,
            &mut trials,
            GPUS as u32,
            usize::MAX,
        );
        state.proposed
    };
    for cut in 1..4 {
        let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
        let mut trials = Vec::new();
        play(
            &mut search(24, &state, &[]),
            &mut state,
            &mut trials,
            GPUS as u32,
            cut,
        );
        let state: SearchState =
            serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
        let mut state = state;
        let trials_back: Vec<Trial> =
            serde_json::from_str(&serde_json::to_string(&trials).unwrap()).unwrap();
        let mut trials = trials_back;
        let mut resumed = search(24, &state, &trials);
        play(
            &mut resumed,
            &mut state,
            &mut trials,
            GPUS as u32,
            usize::MAX,
        );
        assert_eq!(state.proposed, whole, "cut after {cut} rounds");
    }
}

#[test]
fn nothing_near_a_failure_nor_past_its_memory_edge_is_proposed() {
    let a = search(32, &SearchState::new(Model::Adaptive { step: 0.25 }), &[]);
    let failed = vec![vec![0.75, 0.5, 0.5]];
    assert!(
        a.infeasible(&[0.75, 0.55, 0.45], &failed, 0.25),
        "too close"
    );
    assert!(
        a.infeasible(&[0.75, 0.9, 0.5], &failed, 0.25),
        "more memory"
    );
    assert!(
        a.infeasible(&[0.75, 0.9, 0.9], &failed, 0.25),
        "more of both"
    );
    assert!(
        !a.infeasible(&[0.75, 0.2, 0.9], &failed, 0.25),
        "less static pool"
    );
    assert!(
        !a.infeasible(&[0.25, 0.9, 0.9], &failed, 0.25),
        "another strategy"
    );
    assert!(
        !a.infeasible(&[0.75, 0.55, 0.45], &failed, 0.0625),
        "a finer step"
    );
}

#[test]
fn it_stops_at_its_budget_and_when_its_space_is_exhausted() {
    let state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = Adaptive::new(
        space(),
        vec![None; 3],
        Limits {
            trials: 100,
            budget_s: Some(120.0),
        },
        Need::AnyGpu,
        2,
        &[],
        &[],
    );
    let free = slots(2);
    let next = a.propose(&View {
        trials: &[],
        proposed: &state.proposed,
        free: &free,
        elapsed: Duration::from_secs(120),
    });
    assert_eq!((next.run.len(), next.stop), (0, Some(Stop::Budget)));
    // One list of two values: the space has two points and is soon exhausted.
    let tiny = dims(&s(&["a", "b"]), &[]).unwrap();
    let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = Adaptive::new(tiny, vec![None], limits(10), Need::AnyGpu, 2, &[], &[]);
    let mut trials: Vec<Trial> = Vec::new();
    for round in 0..4 {
        let next = a.propose(&View {
            trials: &trials,
            proposed: &state.proposed,
            free: &free,
            elapsed: Duration::ZERO,
        });
        state.propose(next.run.iter().map(|p| p.candidate.clone()));
        for (i, p) in next.run.iter().enumerate() {
            trials.push(Trial {
                candidate: p.candidate.clone(),
                gpus: vec![free[i].clone()],
                outcome: Outcome::Ok(measured(100.0 + i as f64)),
                first_window: None,
                cache: None,
            });
        }
        if let Some(stop) = next.stop {
            assert_eq!(stop, Stop::Exhausted, "round {round}");
            assert_eq!(state.proposed.len(), 2);
            return;
        }
    }
    panic!("a space of two points never stopped");
}

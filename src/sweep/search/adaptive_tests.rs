//! The adaptive search on made-up spaces, through a scheduler in made-up time.

use std::time::Duration;

use super::*;
use crate::sim::best;
use crate::sim::{Params, Settings, Strategy as SimStrategy};
use crate::sweep::assign::Slot;
use crate::sweep::range::dims;
use crate::sweep::rank::{Failure, Measured, Percentiles};
use crate::sweep::search::SearchState;
use crate::sweep::slo::Slo;
use crate::sweep::stats::Estimate;

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

/// The issue's space: 2 strategies × the static fraction × the decode graph bound.
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

/// The sim's own model (`crate::sim::best`): the cap grows with the static fraction; decode
/// batches above the graph bound run eagerly, slower; the graphs, activations and the static
/// pool together run out past an edge. Its best lies just below that edge with the bound just
/// above the cap. `None`: out of memory.
fn point(c: &Candidate) -> Option<best::Point> {
    point_with(&Params::default(), c)
}

/// [`point`] on the sim with `params`.
fn point_with(params: &Params, c: &Candidate) -> Option<best::Point> {
    let get = |k: &str| {
        c.settings
            .iter()
            .find(|(key, _)| key.ends_with(k))
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let mfs: f64 = get("mem_fraction_static").parse().unwrap();
    let bs: u64 = get("cuda-graph-max-bs-decode").parse().unwrap();
    let strategy = SimStrategy::parse(&get("mamba_strategy")).unwrap();
    best::at(params, &base(), strategy, mfs, bs)
}

fn base() -> Settings {
    Settings {
        context_length: Some(8192),
        ..Settings::default()
    }
}

fn objective(c: &Candidate) -> Option<f64> {
    point(c).map(|p| p.tok_s)
}

fn measured(v: f64) -> Measured {
    Measured {
        gpus: 1,
        server_gpus: 1,
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
        lengths: Default::default(),
    }
}

/// The model's figures as a window would measure them: its throughput, and its decode step as
/// every inter-token latency.
fn trial(c: &Candidate, gpu: &Slot) -> Trial {
    Trial {
        candidate: c.clone(),
        gpus: vec![gpu.clone()],
        outcome: match point(c) {
            Some(p) => Outcome::Ok(Measured {
                itl_s: Some(Percentiles {
                    p50: p.step_s,
                    p99: p.step_s,
                }),
                ..measured(p.tok_s)
            }),
            None => Outcome::Failed {
                kind: crate::sweep::rank::Failure::OutOfMemory,
                reason: "out of memory".into(),
                log_tail: vec![],
            },
        },
        first_window: None,
        cache: None,
        prediction: None,
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
    search_within(trials, Slo::default(), state, done)
}

fn search_within(trials: usize, slo: Slo, state: &SearchState, done: &[Trial]) -> Adaptive {
    let seed = vec![None, Some("0.85".into()), None];
    Adaptive::new(
        Setup {
            dims: space(),
            seed,
            limits: limits(trials),
            slo,
            need: Need::Any(1),
            gpus: GPUS,
        },
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
    play_with(a, state, trials, gpus, cut, |c, gpu, _| trial(c, gpu))
}

/// [`play`] with `measure` giving each candidate's trial, told which round it ran in.
fn play_with(
    a: &mut Adaptive,
    state: &mut SearchState,
    trials: &mut Vec<Trial>,
    gpus: u32,
    cut: usize,
    mut measure: impl FnMut(&Candidate, &Slot, usize) -> Trial,
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
            let t = measure(&p.candidate, gpu, round);
            a.observe(&t);
            trials.push(t);
        }
        if next.stop.is_some() {
            return (round + usize::from(!next.run.is_empty()), next.stop);
        }
    }
    (cut, None)
}

/// The best measured trial that keeps `slo`, with its figure.
fn best_kept<'t>(trials: &'t [Trial], slo: &Slo) -> (f64, &'t Trial) {
    trials
        .iter()
        .filter_map(|t| match &t.outcome {
            Outcome::Ok(m) if slo.keeps(m) => Some((m.output_tok_s_per_gpu, t)),
            _ => None,
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap()
}

/// The space's best by the model, under a limit on the decode step.
fn optimum(max_step_s: Option<f64>) -> best::Point {
    best::best(
        &Params::default(),
        &base(),
        &best::Space::issue(),
        max_step_s,
    )
    .unwrap()
}

#[test]
fn it_finds_the_best_within_three_percent_in_four_rounds_of_eight_gpus() {
    let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = search(32, &state, &[]);
    let mut trials = Vec::new();
    let (rounds, stop) = play(&mut a, &mut state, &mut trials, 8, usize::MAX);
    assert_eq!(stop, Some(Stop::Trials));
    // Four rounds explore; a fifth runs the close leaders again, each once.
    assert_eq!(rounds, 5);
    let (explored, again): (Vec<&Trial>, Vec<&Trial>) =
        trials.iter().partition(|t| t.candidate.repeat == 0);
    assert_eq!(explored.len(), 32);
    assert!((2..=8).contains(&again.len()), "{}", again.len());
    for t in &again {
        let first = explored
            .iter()
            .find(|e| e.candidate.settings == t.candidate.settings)
            .expect("a second window of an explored config");
        assert!(matches!(first.outcome, Outcome::Ok(_)));
    }
    let (found, t) = best_kept(&trials, &Slo::default());
    let top = optimum(None).tok_s;
    assert!(found >= 0.97 * top, "found {found:.1} of {top:.1}");
    assert!(
        objective(&t.candidate).is_some(),
        "an OOM is never the best"
    );
    let crowned = crate::sweep::rank::rank(&trials, None);
    let winner = crowned.iter().find(|r| r.winner).unwrap();
    assert_eq!(winner.windows, 2, "the winner was confirmed");
    let ooms = trials
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Failed { .. }))
        .count();
    // Half the space does not load (the graphs outgrow what the static pool leaves); the
    // edge is learnt: fewer than a third of the trials find it again.
    assert!(ooms <= 10, "the edge is learnt: {ooms} OOMs");
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
fn under_an_slo_it_crowns_the_best_that_keeps_it_never_the_fastest() {
    let free = optimum(None);
    let limit = free.step_s * 0.85;
    let held = optimum(Some(limit));
    let slo = crate::sweep::slo::parse(&format!("itl_p99<={:.3}ms", limit * 1000.0)).unwrap();
    let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = search_within(32, slo.clone(), &state, &[]);
    let mut trials = Vec::new();
    play(&mut a, &mut state, &mut trials, 8, usize::MAX);
    let (found, _) = best_kept(&trials, &slo);
    assert!(
        found >= 0.97 * held.tok_s,
        "found {found:.1} of {:.1} within the limit",
        held.tok_s
    );
    let crowned = crate::sweep::rank::rank_within(&trials, None, &slo);
    let winner = crowned.iter().find(|r| r.winner).unwrap();
    let crowned_figure = winner
        .trial
        .outcome
        .measured()
        .unwrap()
        .output_tok_s_per_gpu;
    assert_eq!(crowned_figure, found, "the fastest of those that keep it");
    assert!(winner.breaches.is_empty());
    // Faster candidates that break the limit ran, and are ranked below the winner.
    let faster = crowned
        .iter()
        .filter(|r| !r.breaches.is_empty())
        .filter(|r| r.trial.outcome.measured().unwrap().output_tok_s_per_gpu > found)
        .count();
    assert!(faster > 0, "the search tried past the limit");
}

#[test]
fn a_resumed_search_runs_what_it_proposed_and_never_finished_first() {
    let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = search(24, &state, &[]);
    let free = slots(GPUS as u32);
    let next = a.propose(&View {
        trials: &[],
        proposed: &state.proposed,
        free: &free,
        elapsed: Duration::ZERO,
    });
    state.propose(next.run.iter().map(|p| p.candidate.clone()));
    // Interrupted with two of the round finished.
    let done: Vec<Trial> = next.run[..2]
        .iter()
        .map(|p| trial(&p.candidate, &free[0]))
        .collect();
    let mut resumed = search(24, &state, &done);
    let again = resumed.propose(&View {
        trials: &done,
        proposed: &state.proposed,
        free: &free,
        elapsed: Duration::ZERO,
    });
    let ids = |run: &[Proposal]| {
        run.iter()
            .map(|p| p.candidate.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&again.run), ids(&next.run[2..]));
    assert_eq!(again.stop, None);
}

#[test]
fn nothing_near_a_failure_nor_past_its_memory_edge_is_proposed() {
    let a = search(32, &SearchState::new(Model::Adaptive { step: 0.25 }), &[]);
    let failed = vec![(vec![0.75, 0.5, 0.5], Failure::OutOfMemory)];
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
    // A static pool too small for the weights: less of it fails too, whatever the graphs.
    let small = vec![(vec![0.75, 0.5, 0.5], Failure::NotEnoughMemory)];
    assert!(a.infeasible(&[0.75, 0.3, 0.9], &small, 0.25), "less pool");
    assert!(!a.infeasible(&[0.75, 0.9, 0.5], &small, 0.25), "more pool");
    // A server that died for another reason marks only its neighbourhood.
    let died = vec![(vec![0.75, 0.5, 0.5], Failure::Other)];
    assert!(a.infeasible(&[0.75, 0.55, 0.45], &died, 0.25));
    assert!(!a.infeasible(&[0.75, 0.9, 0.9], &died, 0.25));
}

#[test]
fn it_stops_at_its_budget_and_when_its_space_is_exhausted() {
    let state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = Adaptive::new(
        Setup {
            dims: space(),
            seed: vec![None; 3],
            limits: Limits {
                trials: 100,
                budget_s: Some(120.0),
            },
            slo: Slo::default(),
            need: Need::Any(1),
            gpus: 2,
        },
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
    let mut a = Adaptive::new(
        Setup {
            dims: tiny,
            seed: vec![None],
            limits: limits(10),
            slo: Slo::default(),
            need: Need::Any(1),
            gpus: 2,
        },
        &[],
        &[],
    );
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
                prediction: None,
            });
        }
        if let Some(stop) = next.stop {
            assert_eq!(stop, Stop::Exhausted, "round {round}");
            // Both points, then both again: 100 and 101 are too close for one window each.
            assert_eq!(state.proposed.len(), 4);
            assert_eq!(next.run.len(), 2);
            assert!(next.run.iter().all(|p| p.candidate.repeat == 1));
            // Asked with one GPU free, as the last round's servers stop, it waits: both start
            // together, so that neither runs its window beside fewer servers than the other.
            let mut waits = Adaptive::new(
                Setup {
                    dims: dims(&s(&["a", "b"]), &[]).unwrap(),
                    seed: vec![None],
                    limits: limits(10),
                    slo: Slo::default(),
                    need: Need::Any(1),
                    gpus: 2,
                },
                &[],
                &trials[..2],
            );
            let early = waits.propose(&View {
                trials: &trials[..2],
                proposed: &state.proposed[..2],
                free: &free[..1],
                elapsed: Duration::ZERO,
            });
            assert_eq!((early.run.len(), early.stop), (0, None));
            return;
        }
    }
    panic!("a space of two points never stopped");
}

/// A window's figure with relative noise: a seeded normal draw (Box–Muller over a 64-bit
/// linear congruential generator), so that every play is the same.
struct Noise {
    state: u64,
    sigma: f64,
}

impl Noise {
    fn uniform(&mut self) -> f64 {
        self.state = self
            .state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn factor(&mut self) -> f64 {
        let (a, b) = (self.uniform(), self.uniform());
        1.0 + self.sigma * (-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()
    }
}

/// The benchmark's search (24 trials on 8 GPUs) on the sim with `params`, each window off by
/// `noise`: the crowned config's distance to the space's best (`top` tok/s), by the model.
fn noisy_search(params: &Params, top: f64, noise: &mut Noise) -> f64 {
    let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = search(24, &state, &[]);
    let mut trials = Vec::new();
    play_with(
        &mut a,
        &mut state,
        &mut trials,
        8,
        usize::MAX,
        |c, gpu, _| {
            let mut t = trial(c, gpu);
            t.outcome = match point_with(params, c) {
                Some(p) => Outcome::Ok(measured(p.tok_s * noise.factor())),
                None => t.outcome,
            };
            t
        },
    );
    let ranked = crate::sweep::rank::rank(&trials, None);
    let winner = ranked.iter().find(|r| r.winner).expect("a winner");
    let found = point_with(params, &winner.trial.candidate).expect("an OOM is never crowned");
    1.0 - found.tok_s / top
}

#[test]
fn under_a_window_s_noise_it_still_crowns_within_three_percent() {
    // Eight copies of one config, measured side by side on the sim, differ by about 0.8%;
    // 1% is taken here. Near the edge, configs 1-2% apart then measure in either order: the
    // confirmation windows keep such a lead from being crowned on one window's luck.
    for output in [988, 40] {
        let params = Params {
            mean_output_tokens: output,
            ..Params::default()
        };
        let top = best::best(&params, &base(), &best::Space::issue(), None)
            .unwrap()
            .tok_s;
        let mut distances: Vec<f64> = (0..100)
            .map(|seed| {
                noisy_search(
                    &params,
                    top,
                    &mut Noise {
                        state: seed,
                        sigma: 0.01,
                    },
                )
            })
            .collect();
        distances.sort_by(f64::total_cmp);
        // A lead inside the noise goes to the leaner config, which may be a little slower: the
        // issue's bar is the median within 3% and the worst within 5%.
        let over = distances.iter().filter(|&&d| d > 0.03).count();
        assert!(
            over <= 10 && distances[50] < 0.015 && distances[99] <= 0.05,
            "{output}-token answers: {over} of 100 beyond 3%, median {:.2}%, worst {:.2}%",
            distances[50] * 100.0,
            distances[99] * 100.0
        );
    }
}

/// The search (`trials`, 8 GPUs) on the sim model drawn from `seed` (`best::drawn`), as the
/// hosts' shared CPUs bend it: each window off by 1% of noise and carrying a 95% interval of
/// ±2%, and each round's windows faster by a share of up to `load` drawn for the round (the
/// servers beside it, what else the hosts ran). The crowned config's distance to the space's
/// best, by the model.
fn loaded_search(seed: u64, trials_n: usize, load: f64) -> f64 {
    let (params, _) = best::drawn(seed, 40);
    let top = best::best(&params, &base(), &best::Space::issue(), None).expect("a best");
    let mut noise = Noise {
        state: seed,
        sigma: 0.01,
    };
    let mut rounds = Noise {
        state: seed ^ 0x5eed,
        sigma: 0.0,
    };
    let loads: Vec<f64> = (0..64).map(|_| 1.0 + load * rounds.uniform()).collect();
    let mut state = SearchState::new(Model::Adaptive { step: 0.25 });
    let mut a = search(trials_n, &state, &[]);
    let mut trials = Vec::new();
    play_with(
        &mut a,
        &mut state,
        &mut trials,
        8,
        usize::MAX,
        |c, gpu, round| {
            let mut t = trial(c, gpu);
            t.outcome = match point_with(&params, c) {
                Some(p) => {
                    let v = p.tok_s * noise.factor() * loads[round.min(63)];
                    Outcome::Ok(Measured {
                        estimate: Some(Estimate::around(v, 0.02 * v)),
                        ..measured(v)
                    })
                }
                None => Outcome::Failed {
                    kind: Failure::OutOfMemory,
                    reason: "out of memory".into(),
                    log_tail: vec![],
                },
            };
            t
        },
    );
    let ranked = crate::sweep::rank::rank(&trials, None);
    let winner = ranked.iter().find(|r| r.winner).expect("a winner");
    assert!(winner.windows > 1, "only a confirmed config is crowned");
    let found = point_with(&params, &winner.trial.candidate).expect("an OOM is never crowned");
    1.0 - found.tok_s / top.tok_s
}

#[test]
fn on_models_it_was_not_tuned_on_and_under_uneven_load_it_crowns_within_three_percent() {
    // Rounds whose windows read up to 6% apart (a window with few servers beside it on shared
    // CPUs reads fast): the leaders are confirmed side by side, and a lead inside the noise
    // goes to the leaner config, which may cost a little of the best's throughput.
    for load in [0.0, 0.06] {
        let mut d: Vec<f64> = (1..=20).map(|seed| loaded_search(seed, 24, load)).collect();
        d.sort_by(f64::total_cmp);
        let (median, worst) = (d[10], d[19]);
        assert!(
            median <= 0.03 && worst <= 0.05,
            "load {load}: median {:.2}%, worst {:.2}%: {d:?}",
            median * 100.0,
            worst * 100.0
        );
    }
}

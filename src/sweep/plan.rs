//! Planning a sweep before anything starts: the search from the command line's axes, the mode
//! and the GPUs each candidate needs, successive halving's first window, the spec `sweep.json`
//! records, the strategy (fresh, or continuing the trials on file), and the `--dry-run` plan:
//! a fresh strategy's first proposals played out round by round. Pure, given the profiles.

use std::time::Duration;

use super::adaptive::{Adaptive, Setup};
use super::assign::{self, AssignError, Assignment, Mode, Need};
use super::file::SweepSpec;
use super::grid::Grid;
use super::load::WorkloadSpec;
use super::profiles::Profiles;
use super::prune;
use super::range;
use super::rank::Trial;
use super::report::{Plan, PlannedCandidate};
use super::schedule;
use super::search::{Limits, Model, SearchSpec, SearchState, Strategy, View};
use super::servers::{self, facts_by_host, plan_candidate};
use super::slo::Slo;
use super::space::{self, SpaceError};
use crate::config::{HostSpec, Profile};
use crate::launch::plan::HostFacts;
use crate::launch::preflight;

/// The search the command line asks for: value lists make a grid; a range makes the adaptive
/// search, which `adaptive` (`--search`: `Some(true)` adaptive, `Some(false)` grid) can also
/// ask for over lists. Its seed is filled in later, from the base profile ([`seed`]).
pub fn search(
    strategies: &[String],
    sets: &[String],
    adaptive: Option<bool>,
    limits: Limits,
) -> Result<SearchSpec, SpaceError> {
    let ranged = range::has_range(sets);
    if adaptive == Some(false) && ranged {
        let raw = sets
            .iter()
            .find(|s| range::has_range(std::slice::from_ref(s)))
            .cloned()
            .unwrap_or_default();
        return Err(SpaceError::RangeInGrid(raw));
    }
    if adaptive.unwrap_or(ranged) {
        let dims = range::dims(strategies, sets)?;
        return Ok(SearchSpec::Adaptive {
            seed: vec![None; dims.len()],
            dims,
            limits,
        });
    }
    Ok(SearchSpec::Grid {
        axes: space::axes(strategies, sets)?,
    })
}

/// Seeds an adaptive search with `base`'s own values: its server settings for `server.KEY`,
/// its `extra_args` for `flag.NAME` (a bare flag is `true`).
pub fn seed(search: &mut SearchSpec, base: &Profile) {
    let SearchSpec::Adaptive { dims, seed, .. } = search else {
        return;
    };
    let server = serde_json::to_value(&base.server).unwrap_or_default();
    let extra = &base.server.extra_args;
    *seed = dims
        .iter()
        .map(|d| {
            let value = if let Some(key) = d.key.strip_prefix("server.") {
                match server.get(key)? {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Null => return None,
                    v => v.to_string(),
                }
            } else if let Some(name) = d.key.strip_prefix(range::FLAG_PREFIX) {
                let flag = format!("--{name}");
                let at = extra
                    .iter()
                    .rposition(|a| *a == flag || a.starts_with(&format!("{flag}=")))?;
                match extra[at].split_once('=') {
                    Some((_, v)) => v.to_string(),
                    None => match extra.get(at + 1) {
                        Some(v) if !v.starts_with("--") => v.clone(),
                        _ => "true".into(),
                    },
                }
            } else {
                return None;
            };
            d.unit(&value).map(|_| value)
        })
        .collect();
}

/// What the command line asks of the sweep, beyond its search.
#[derive(Debug, Clone)]
pub struct Request {
    /// The base profile as `--profile` named it.
    pub profile: String,
    pub search: SearchSpec,
    pub sequential: bool,
    /// `false` with `--no-prune`.
    pub prune: bool,
    pub workload: WorkloadSpec,
    pub warmup: Duration,
    pub duration: Duration,
    /// `--slo`.
    pub slo: Slo,
}

/// The sweep as planned: its spec, every GPU with what each of the space's candidates needs,
/// and successive halving's first window.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub spec: SweepSpec,
    pub assignment: Assignment,
    pub first_window: Option<Duration>,
}

/// Plans `request` on `gpus` (each host's GPUs, in inventory order); `sizes`: the GPUs one
/// server of each candidate of the space spans (see [`servers::sizes`]).
pub fn plan(
    request: Request,
    gpus: &[(String, Vec<u32>)],
    sizes: &[u32],
) -> Result<Planned, AssignError> {
    let total: usize = gpus.iter().map(|(_, g)| g.len()).sum();
    let mode = match request.search {
        // Its candidates come a round at a time, each on the first free GPUs.
        SearchSpec::Adaptive { .. } if !request.sequential => Mode::Rounds,
        _ => assign::choose_mode(sizes, total, request.sequential),
    };
    let assignment = assign::assign(gpus, sizes, mode)?;
    // Pruning saves time only where a freed GPU has a next candidate to take it.
    let first_window =
        (mode == Mode::Rounds && request.prune).then(|| prune::first_window(request.duration));
    let spec = SweepSpec {
        profile: request.profile,
        search: request.search,
        mode,
        workload: request.workload,
        warmup_s: request.warmup.as_secs_f64(),
        duration_s: request.duration.as_secs_f64(),
        first_window_s: first_window.map(|d| d.as_secs_f64()),
        slo: request.slo,
    };
    Ok(Planned {
        spec,
        assignment,
        first_window,
    })
}

/// The planned search's strategy, continuing from its `state` and `trials` on file (a fresh
/// search: its spec's start, and none).
pub fn strategy(planned: &Planned, state: &SearchState, trials: &[Trial]) -> Box<dyn Strategy> {
    match (&planned.spec.search, &state.model) {
        (search @ SearchSpec::Grid { .. }, Model::Grid) => Box::new(Grid::new(
            search.space(),
            planned.assignment.needs.clone(),
            trials,
        )),
        (SearchSpec::Adaptive { dims, seed, limits }, _) => {
            // Its layout is the base's: every candidate needs what the space's first does.
            let size = planned.assignment.needs.first().map_or(1, Need::size) as u32;
            let need = match planned.spec.mode {
                Mode::Sequential => Need::Gpus(planned.assignment.slots.clone()),
                Mode::Rounds | Mode::Parallel => Need::Any(size.max(1)),
            };
            let setup = Setup {
                dims: dims.clone(),
                seed: seed.clone(),
                limits: *limits,
                slo: planned.spec.slo.clone(),
                need,
                gpus: planned.assignment.slots.len(),
            };
            Box::new(Adaptive::new(setup, &state.proposed, trials))
        }
        // A spec and a model that disagree are refused when sweep.json is opened.
        (search @ SearchSpec::Grid { .. }, Model::Adaptive { .. }) => Box::new(Grid::new(
            search.space(),
            planned.assignment.needs.clone(),
            trials,
        )),
    }
}

/// What `--dry-run` shows: a fresh strategy's first proposals in the rounds they would run in
/// if every candidate of a round ended at once, each with its first server's argv and what
/// preflight says of it.
pub fn dry_run(
    planned: &Planned,
    profiles: &Profiles,
    hosts: &[(HostSpec, HostFacts)],
    key: Option<&str>,
    root: &str,
) -> Plan {
    let slots = &planned.assignment.slots;
    let fresh = planned.spec.search.start();
    let first = strategy(planned, &fresh, &[]).propose(&View {
        trials: &[],
        proposed: &[],
        free: slots,
        elapsed: Duration::ZERO,
    });
    let queue = first
        .run
        .into_iter()
        .map(|p| (p.candidate, p.need))
        .collect();
    let rounds = schedule::rounds(queue, slots.clone(), servers::boards(hosts));
    let facts = facts_by_host(hosts);
    let mut candidates: Vec<PlannedCandidate> = Vec::new();
    for (round, members) in rounds.iter().enumerate() {
        for (candidate, gpus) in members {
            let (argv, problem) = match plan_candidate(profiles, candidate, hosts, gpus, key, root)
            {
                Ok(i) => (
                    i.first().map(|i| i.display_argv()).unwrap_or_default(),
                    preflight::preflight(&i, &facts)
                        .err()
                        .map(|e| e.to_string()),
                ),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            candidates.push(PlannedCandidate {
                id: candidate.id.clone(),
                label: candidate.label(),
                round: round + 1,
                gpus: gpus.clone(),
                argv,
                problem,
            });
        }
    }
    let spec = &planned.spec;
    Plan {
        mode: spec.mode,
        gpus: slots.len(),
        rounds: match spec.mode {
            Mode::Rounds => rounds.len(),
            Mode::Parallel | Mode::Sequential => 1,
        },
        warmup_s: spec.warmup_s,
        duration_s: spec.duration_s,
        first_window_s: spec.first_window_s,
        candidates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuSelection;
    use crate::sweep::assign::{Need, Slot};

    const LIMITS: Limits = Limits {
        trials: 32,
        budget_s: None,
    };

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn request(strategies: &[&str], sets: &[&str]) -> Request {
        Request {
            profile: "base".into(),
            search: search(&s(strategies), &s(sets), None, LIMITS).unwrap(),
            sequential: false,
            prune: true,
            workload: WorkloadSpec::Synthetic {
                input_len: 32,
                output_len: 24,
            },
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(60),
            slo: Slo::default(),
        }
    }

    fn gpus(n: u32) -> Vec<(String, Vec<u32>)> {
        vec![("local".into(), (0..n).collect())]
    }

    #[test]
    fn few_candidates_run_side_by_side_and_many_in_rounds_with_a_first_window() {
        let two = plan(request(&["a", "b"], &[]), &gpus(8), &[1; 2]).unwrap();
        assert_eq!(two.spec.mode, Mode::Parallel);
        assert_eq!(two.first_window, None, "nothing waits for a freed GPU");
        assert_eq!(two.assignment.needs.len(), 2);
        let many = request(&["a", "b", "c"], &["server.m=1,2,3"]);
        let nine = plan(many.clone(), &gpus(8), &[1; 9]).unwrap();
        assert_eq!(nine.spec.mode, Mode::Rounds);
        assert_eq!(nine.first_window, Some(Duration::from_secs(15)));
        assert_eq!(nine.spec.first_window_s, Some(15.0));
        assert_eq!(nine.assignment.needs, vec![Need::Any(1); 9]);
        let unpruned = plan(
            Request {
                prune: false,
                ..many.clone()
            },
            &gpus(8),
            &[1; 9],
        )
        .unwrap();
        assert_eq!(unpruned.first_window, None);
        let sequential = Request {
            sequential: true,
            ..request(&["a", "b"], &[])
        };
        assert_eq!(
            plan(sequential, &gpus(2), &[1; 2]).unwrap().spec.mode,
            Mode::Sequential
        );
        assert_eq!(plan(many, &[], &[1; 9]), Err(AssignError::NoGpus));
        assert_eq!(
            search(&[], &s(&["server.m"]), None, LIMITS),
            Err(SpaceError::Syntax("server.m".into()))
        );
    }

    #[test]
    fn a_resumed_strategy_proposes_only_what_has_no_trial() {
        let planned = plan(request(&["a", "b", "c"], &[]), &gpus(2), &[1; 3]).unwrap();
        let space = planned.spec.search.space();
        let done = Trial {
            candidate: space[1].clone(),
            gpus: vec![],
            outcome: crate::sweep::rank::Outcome::Failed {
                kind: crate::sweep::rank::Failure::OutOfMemory,
                reason: "oom".into(),
                log_tail: vec![],
            },
            first_window: None,
            cache: None,
            prediction: None,
        };
        let trials = [done];
        let mut state = planned.spec.search.start();
        state.propose(space.clone());
        let next = strategy(&planned, &state, &trials).propose(&View {
            trials: &trials,
            proposed: &state.proposed,
            free: &planned.assignment.slots,
            elapsed: Duration::from_secs(30),
        });
        let ids: Vec<&str> = next.run.iter().map(|p| p.candidate.id.as_str()).collect();
        assert_eq!(ids, [space[0].id.as_str(), space[2].id.as_str()]);
    }

    #[test]
    fn the_dry_run_shows_each_round_with_its_gpus_argv_and_preflight() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("base.yaml"),
            "model: /models/m\nlauncher: [python3]\nport_base: 31000\nserver:\n  mem_fraction_static: 0.85\n",
        )
        .unwrap();
        let planned = plan(
            request(
                &["extra_buffer", "no_buffer"],
                &["server.mem_fraction_static=0.8,0.9"],
            ),
            &gpus(3),
            &[1; 4],
        )
        .unwrap();
        let profiles = Profiles::load("base", dir.path(), &planned.spec.search.space()).unwrap();
        let hosts = vec![(
            crate::launch::plan::tests::host("local", GpuSelection::List(vec![0, 1, 2])),
            HostFacts {
                help: None,
                version: None,
                address: "127.0.0.1".into(),
                gpus_present: vec![0, 1, 2],
                places: Vec::new(),
                topology: crate::launch::plan::Topology::NotRead,
            },
        )];
        let p = dry_run(&planned, &profiles, &hosts, None, "/tmp/fleet");
        assert_eq!((p.mode, p.gpus, p.rounds), (Mode::Rounds, 3, 2));
        assert_eq!(p.first_window_s, Some(15.0));
        let rows: Vec<(usize, &str, u32)> = p
            .candidates
            .iter()
            .map(|c| (c.round, c.label.as_str(), c.gpus[0].gpu))
            .collect();
        assert_eq!(
            rows,
            [
                (1, "extra_buffer mem_fraction_static=0.8", 0),
                (1, "extra_buffer mem_fraction_static=0.9", 1),
                (1, "no_buffer mem_fraction_static=0.8", 2),
                (2, "no_buffer mem_fraction_static=0.9", 0),
            ]
        );
        let first = &p.candidates[0];
        assert_eq!(first.problem, None);
        assert!(first.argv.iter().any(|a| a == "31000"), "{:?}", first.argv);
        assert_eq!(
            p.candidates[3].gpus,
            [Slot {
                host: "local".into(),
                gpu: 0
            }]
        );
    }
}

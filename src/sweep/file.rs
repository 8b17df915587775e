//! `sweep.json`: what the sweep is (its spec), the search's own state and every finished trial,
//! rewritten atomically after each trial and each proposal so that an interrupted sweep
//! continues its search with `--resume`. Files of formats 1 and 2 (a spec with the candidate
//! list, before the search had a state) read as the grid search they were.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::assign::Mode;
use super::load::WorkloadSpec;
use super::rank::Trial;
use super::search::{Model, SearchSpec, SearchState};
use super::slo::Slo;
use super::space::{self, Axis, Candidate};

/// 3: the search's spec and state instead of the candidate list. 2: rounds, pruned trials,
/// first windows and throughput intervals (a format 1 file reads as a sweep without them).
pub const FORMAT: u32 = 3;

/// What makes two sweeps the same sweep: a resumed one must match it exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSpec {
    /// The base profile as given to `--profile`.
    pub profile: String,
    pub search: SearchSpec,
    pub mode: Mode,
    pub workload: WorkloadSpec,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// Successive halving's first window; `None` when no candidate is stopped early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_window_s: Option<f64>,
    /// `--slo`: the limits a winner must keep (none: any).
    #[serde(default, skip_serializing_if = "Slo::is_empty")]
    pub slo: Slo,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepFile {
    pub format: u32,
    pub spec: SweepSpec,
    pub search: SearchState,
    /// Finished trials (measured, pruned or failed), in the order they finished.
    pub trials: Vec<Trial>,
}

/// The spec of formats 1 and 2: the grid's candidates themselves.
#[derive(Debug, Deserialize)]
struct LegacySpec {
    profile: String,
    candidates: Vec<Candidate>,
    mode: Mode,
    workload: WorkloadSpec,
    warmup_s: f64,
    duration_s: f64,
    #[serde(default)]
    first_window_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct LegacyFile {
    spec: LegacySpec,
    trials: Vec<Trial>,
}

#[derive(Debug, Deserialize)]
struct Version {
    format: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a sweep file: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "{}: its candidates are not the product of axes, as a sweep file of format {format} \
         holds; pass another --out",
        path.display()
    )]
    NotAGrid { path: PathBuf, format: u32 },
    #[error(
        "{} is a sweep file of format {format}, newer than this fleet reads (up to {FORMAT}); \
         use the fleet that wrote it, or pass another --out",
        path.display()
    )]
    Newer { path: PathBuf, format: u32 },
    #[error(
        "{} already holds {trials} trial(s) of a sweep; continue it with --resume, or pass another --out",
        path.display()
    )]
    Exists { path: PathBuf, trials: usize },
    #[error(
        "{} was written by a different sweep ({what} differs); run the same command to --resume it, or pass another --out",
        path.display()
    )]
    Mismatch { path: PathBuf, what: &'static str },
}

/// The first field in which a resumed sweep differs from the one on file.
fn difference(a: &SweepSpec, b: &SweepSpec) -> Option<&'static str> {
    if a.profile != b.profile {
        Some("--profile")
    } else if a.search != b.search {
        Some("the search space (--strategies/--set)")
    } else if a.mode != b.mode {
        Some("the mode (--parallel/--sequential)")
    } else if a.workload != b.workload {
        Some("the workload (--prompts/--sample/--seed/--input-len/--output-len/--max-tokens)")
    } else if a.warmup_s != b.warmup_s || a.duration_s != b.duration_s {
        Some("--warmup/--duration")
    } else if a.first_window_s != b.first_window_s {
        Some("pruning (--no-prune)")
    } else if a.slo != b.slo {
        Some("--slo")
    } else {
        None
    }
}

/// The axes whose product is `candidates`, in the order of the product (first axis slowest):
/// each axis's values in the order they first appear. `None` when they are no product.
fn grid_axes(candidates: &[Candidate]) -> Option<Vec<Axis>> {
    let first = candidates.first()?;
    let axes: Vec<Axis> = first
        .settings
        .iter()
        .enumerate()
        .map(|(i, (key, _))| {
            let mut values: Vec<String> = Vec::new();
            for c in candidates {
                let v = &c.settings.get(i)?.1;
                if !values.contains(v) {
                    values.push(v.clone());
                }
            }
            Some(Axis {
                key: key.clone(),
                values,
            })
        })
        .collect::<Option<_>>()?;
    (space::candidates(&axes) == candidates).then_some(axes)
}

/// Reads a sweep file of any format this fleet knows.
fn parse(path: &Path, text: &str) -> Result<SweepFile, FileError> {
    let parse_err = |source| FileError::Parse {
        path: path.to_path_buf(),
        source,
    };
    let Version { format } = serde_json::from_str(text).map_err(parse_err)?;
    if format > FORMAT {
        return Err(FileError::Newer {
            path: path.to_path_buf(),
            format,
        });
    }
    if format == FORMAT {
        return serde_json::from_str(text).map_err(parse_err);
    }
    let old: LegacyFile = serde_json::from_str(text).map_err(parse_err)?;
    let axes = grid_axes(&old.spec.candidates).ok_or_else(|| FileError::NotAGrid {
        path: path.to_path_buf(),
        format,
    })?;
    // Those sweeps proposed every candidate at once, as the grid does.
    let mut search = SearchState::new(Model::Grid);
    search.propose(old.spec.candidates);
    Ok(SweepFile {
        format: FORMAT,
        spec: SweepSpec {
            profile: old.spec.profile,
            search: SearchSpec::Grid { axes },
            mode: old.spec.mode,
            workload: old.spec.workload,
            warmup_s: old.spec.warmup_s,
            duration_s: old.spec.duration_s,
            first_window_s: old.spec.first_window_s,
            slo: Slo::default(),
        },
        search,
        trials: old.trials,
    })
}

/// Reads a sweep's file (finished or not) of any format this fleet knows, for `fleet report`.
pub fn read(path: &Path) -> Result<SweepFile, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// Where the sweep's results live and what is already in there.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    file: SweepFile,
}

impl Store {
    /// A fresh sweep refuses a file with trials in it; `--resume` requires the same spec and
    /// keeps its search state and trials. A missing file starts afresh either way.
    pub fn open(path: &Path, spec: SweepSpec, resume: bool) -> Result<Store, FileError> {
        let fresh = SweepFile {
            format: FORMAT,
            search: spec.search.start(),
            spec: spec.clone(),
            trials: Vec::new(),
        };
        let store = |file| Store {
            path: path.to_path_buf(),
            file,
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(store(fresh)),
            Err(source) => {
                return Err(FileError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let old = parse(path, &text)?;
        if !resume {
            if old.trials.is_empty() {
                return Ok(store(fresh));
            }
            return Err(FileError::Exists {
                path: path.to_path_buf(),
                trials: old.trials.len(),
            });
        }
        if let Some(what) = difference(&old.spec, &spec) {
            return Err(FileError::Mismatch {
                path: path.to_path_buf(),
                what,
            });
        }
        Ok(store(old))
    }

    pub fn trials(&self) -> &[Trial] {
        &self.file.trials
    }

    pub fn search(&self) -> &SearchState {
        &self.file.search
    }

    pub fn search_mut(&mut self) -> &mut SearchState {
        &mut self.file.search
    }

    pub fn is_done(&self, candidate_id: &str) -> bool {
        self.file
            .trials
            .iter()
            .any(|t| t.candidate.id == candidate_id)
    }

    /// Records a finished trial and rewrites the file (temp file, fsync, rename).
    pub fn record(&mut self, trial: Trial) -> Result<(), FileError> {
        self.file
            .trials
            .retain(|t| t.candidate.id != trial.candidate.id);
        self.file.trials.push(trial);
        self.save()
    }

    pub fn save(&self) -> Result<(), FileError> {
        let err = |source| FileError::Write {
            path: self.path.clone(),
            source,
        };
        let mut tmp_name = self.path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = PathBuf::from(tmp_name);
        let json = serde_json::to_string_pretty(&self.file).expect("a sweep file serializes");
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(json.as_bytes()).map_err(err)?;
        f.write_all(b"\n").map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::rank::Outcome;
    use crate::sweep::space::axes;

    fn spec(strategies: &[&str]) -> SweepSpec {
        let s: Vec<String> = strategies.iter().map(|s| s.to_string()).collect();
        SweepSpec {
            profile: "base".into(),
            search: SearchSpec::Grid {
                axes: axes(&s, &["server.m=1,2".into()]).unwrap(),
            },
            mode: Mode::Sequential,
            workload: WorkloadSpec::Synthetic {
                input_len: 10,
                output_len: 20,
            },
            warmup_s: 1.0,
            duration_s: 2.0,
            first_window_s: None,
            slo: Slo::default(),
        }
    }

    fn failed(c: &Candidate) -> Trial {
        Trial {
            candidate: c.clone(),
            gpus: vec![],
            outcome: Outcome::Failed {
                kind: crate::sweep::rank::Failure::OutOfMemory,
                reason: "oom".into(),
                log_tail: vec!["CUDA out of memory".into()],
            },
            first_window: None,
            cache: None,
            prediction: None,
        }
    }

    #[test]
    fn a_resume_with_other_pruning_is_another_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.json");
        let mut s = spec(&["a", "b"]);
        s.mode = Mode::Rounds;
        s.first_window_s = Some(0.5);
        let mut store = Store::open(&path, s.clone(), false).unwrap();
        store.record(failed(&s.search.space()[0])).unwrap();
        let mut unpruned = s.clone();
        unpruned.first_window_s = None;
        let err = Store::open(&path, unpruned, true).unwrap_err();
        assert!(
            err.to_string().contains("pruning (--no-prune) differs"),
            "{err}"
        );
        assert!(Store::open(&path, s, true).is_ok());
    }

    #[test]
    fn the_search_and_its_trials_survive_a_resume_and_a_fresh_sweep_refuses_to_overwrite_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.json");
        let s = spec(&["a", "b"]);
        let space = s.search.space();
        let mut store = Store::open(&path, s.clone(), false).unwrap();
        assert!(store.search().proposed.is_empty());
        store.search_mut().propose(space.clone());
        store.search_mut().elapsed_s = 12.5;
        store.record(failed(&space[0])).unwrap();
        assert!(!dir.path().join("sweep.json.tmp").exists());

        let again = Store::open(&path, s.clone(), true).unwrap();
        assert!(again.is_done(&space[0].id));
        assert!(!again.is_done(&space[1].id));
        assert_eq!(again.trials(), store.trials());
        assert_eq!(again.search(), store.search());
        let file: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(file["format"], 3);
        assert_eq!(file["spec"]["search"]["strategy"], "grid");
        assert_eq!(file["search"]["elapsed_s"], 12.5);
        assert_eq!(file["search"]["proposed"].as_array().unwrap().len(), 4);

        let err = Store::open(&path, s.clone(), false).unwrap_err();
        assert!(err.to_string().contains("holds 1 trial(s)"), "{err}");
        let err = Store::open(&path, spec(&["a", "c"]), true).unwrap_err();
        assert!(err.to_string().contains("the search space"), "{err}");

        std::fs::write(&path, "{").unwrap();
        assert!(matches!(
            Store::open(&path, s, true),
            Err(FileError::Parse { .. })
        ));
    }

    /// A sweep file as fleet wrote it before the search had a state.
    fn legacy(format: u32, candidates: &[Candidate], trials: &[Trial]) -> String {
        let mut v = serde_json::json!({
            "format": format,
            "spec": {
                "profile": "base",
                "candidates": candidates,
                "mode": "sequential",
                "workload": {"kind": "synthetic", "input_len": 10, "output_len": 20},
                "warmup_s": 1.0,
                "duration_s": 2.0,
            },
            "trials": trials,
        });
        if format == 2 {
            v["spec"]["first_window_s"] = serde_json::Value::Null;
        }
        v.to_string()
    }

    #[test]
    fn files_of_formats_1_and_2_resume_as_the_grid_they_were_and_newer_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.json");
        let s = spec(&["a", "b"]);
        let space = s.search.space();
        for format in [1, 2] {
            std::fs::write(&path, legacy(format, &space, &[failed(&space[2])])).unwrap();
            let store = Store::open(&path, s.clone(), true).unwrap();
            assert!(store.is_done(&space[2].id));
            assert_eq!(store.search().proposed, space, "format {format}");
            assert_eq!(store.search().model, Model::Grid);
            let err = Store::open(&path, spec(&["a"]), true).unwrap_err();
            assert!(err.to_string().contains("the search space"), "{err}");
            // Written back, it is a file of this format.
            store.save().unwrap();
            assert_eq!(
                Store::open(&path, s.clone(), true).unwrap().file,
                store.file
            );
        }
        // The base profile alone is a grid of no axes.
        let base = SearchSpec::Grid { axes: vec![] }.space();
        assert_eq!(grid_axes(&base), Some(vec![]));
        // Candidates that are no product cannot be a grid.
        std::fs::write(&path, legacy(2, &space[..3], &[])).unwrap();
        let err = Store::open(&path, s.clone(), true).unwrap_err();
        assert!(
            matches!(err, FileError::NotAGrid { format: 2, .. }),
            "{err}"
        );
        std::fs::write(&path, r#"{"format": 4}"#).unwrap();
        let err = Store::open(&path, s, true).unwrap_err();
        assert!(
            err.to_string()
                .contains("format 4, newer than this fleet reads (up to 3)"),
            "{err}"
        );
    }
}

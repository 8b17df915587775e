//! `sweep.json`: what the sweep is (its spec) and every finished trial, rewritten atomically
//! after each trial so that an interrupted sweep resumes with `--resume`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::assign::Mode;
use super::load::WorkloadSpec;
use super::rank::Trial;
use super::space::Candidate;

/// 2: rounds, pruned trials, first windows and throughput intervals (a format 1 file reads
/// as a sweep without them).
pub const FORMAT: u32 = 2;

/// What makes two sweeps the same sweep: a resumed one must match it exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSpec {
    /// The base profile as given to `--profile`.
    pub profile: String,
    pub candidates: Vec<Candidate>,
    pub mode: Mode,
    pub workload: WorkloadSpec,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// Successive halving's first window; `None` when no candidate is stopped early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_window_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepFile {
    pub format: u32,
    pub spec: SweepSpec,
    /// Finished trials (measured or failed), in the order they finished.
    pub trials: Vec<Trial>,
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
    #[error("{}: not a sweep file: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
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
    } else if a.candidates != b.candidates {
        Some("the candidates (--strategies/--set)")
    } else if a.mode != b.mode {
        Some("the mode (--parallel/--sequential)")
    } else if a.workload != b.workload {
        Some("the workload (--prompts/--sample/--seed/--input-len/--output-len/--max-tokens)")
    } else if a.warmup_s != b.warmup_s || a.duration_s != b.duration_s {
        Some("--warmup/--duration")
    } else if a.first_window_s != b.first_window_s {
        Some("pruning (--no-prune)")
    } else {
        None
    }
}

/// Where the sweep's results live and what is already in there.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    file: SweepFile,
}

impl Store {
    /// A fresh sweep refuses a file with trials in it; `--resume` requires the same spec and
    /// keeps its trials. A missing file starts empty either way.
    pub fn open(path: &Path, spec: SweepSpec, resume: bool) -> Result<Store, FileError> {
        let fresh = SweepFile {
            format: FORMAT,
            spec: spec.clone(),
            trials: Vec::new(),
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Store {
                    path: path.to_path_buf(),
                    file: fresh,
                });
            }
            Err(source) => {
                return Err(FileError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let old: SweepFile = serde_json::from_str(&text).map_err(|e| FileError::Parse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if !resume {
            if old.trials.is_empty() {
                return Ok(Store {
                    path: path.to_path_buf(),
                    file: fresh,
                });
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
        Ok(Store {
            path: path.to_path_buf(),
            file: old,
        })
    }

    pub fn trials(&self) -> &[Trial] {
        &self.file.trials
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
    use crate::sweep::space::{axes, candidates};

    fn spec(strategies: &[&str]) -> SweepSpec {
        let s: Vec<String> = strategies.iter().map(|s| s.to_string()).collect();
        SweepSpec {
            profile: "base".into(),
            candidates: candidates(&axes(&s, &[]).unwrap()),
            mode: Mode::Sequential,
            workload: WorkloadSpec::Synthetic {
                input_len: 10,
                output_len: 20,
            },
            warmup_s: 1.0,
            duration_s: 2.0,
            first_window_s: None,
        }
    }

    fn failed(c: &Candidate) -> Trial {
        Trial {
            candidate: c.clone(),
            gpus: vec![],
            outcome: Outcome::Failed {
                reason: "oom".into(),
                log_tail: vec!["CUDA out of memory".into()],
            },
            first_window: None,
            cache: None,
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
        store.record(failed(&s.candidates[0])).unwrap();
        let mut unpruned = s.clone();
        unpruned.first_window_s = None;
        let err = Store::open(&path, unpruned, true).unwrap_err();
        assert!(
            err.to_string().contains("pruning (--no-prune) differs"),
            "{err}"
        );
        assert!(Store::open(&path, s, true).is_ok());
        // A file of format 1 has no first window: it reads as a sweep without pruning.
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["spec"].as_object_mut().unwrap().remove("first_window_s");
        v["format"] = 1.into();
        let old: SweepFile = serde_json::from_value(v).unwrap();
        assert_eq!(old.spec.first_window_s, None);
    }

    #[test]
    fn trials_survive_a_resume_and_a_fresh_sweep_refuses_to_overwrite_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.json");
        let s = spec(&["a", "b"]);
        let mut store = Store::open(&path, s.clone(), false).unwrap();
        store.record(failed(&s.candidates[0])).unwrap();
        assert!(!dir.path().join("sweep.json.tmp").exists());

        let again = Store::open(&path, s.clone(), true).unwrap();
        assert!(again.is_done(&s.candidates[0].id));
        assert!(!again.is_done(&s.candidates[1].id));
        assert_eq!(again.trials(), store.trials());

        let err = Store::open(&path, s.clone(), false).unwrap_err();
        assert!(err.to_string().contains("holds 1 trial(s)"), "{err}");
        let err = Store::open(&path, spec(&["a", "c"]), true).unwrap_err();
        assert!(err.to_string().contains("the candidates"), "{err}");

        std::fs::write(&path, "{").unwrap();
        assert!(matches!(
            Store::open(&path, s, true),
            Err(FileError::Parse { .. })
        ));
    }
}

//! Which GPUs each candidate runs on: disjoint groups for a parallel sweep, like for like on
//! every host, or every GPU for each candidate in turn for a sequential one.

use serde::{Deserialize, Serialize};

/// A GPU slot: inventory host name and GPU index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Slot {
    pub host: String,
    pub gpu: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Parallel,
    Sequential,
}

/// The GPUs of each candidate, in candidate order, and the order trials run in: in parallel
/// mode one round with every candidate; in sequential mode one round per candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    pub mode: Mode,
    pub gpus: Vec<Vec<Slot>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    #[error(
        "{candidates} candidates need at least {candidates} GPUs to run in parallel, but the inventory has {gpus}; use --sequential or fewer values"
    )]
    TooFewGpus { candidates: usize, gpus: usize },
    #[error("the inventory has no GPUs to sweep on")]
    NoGpus,
}

/// Parallel when `k` candidates fit the GPUs (or when asked), sequential otherwise/when asked.
pub fn choose_mode(k: usize, total_gpus: usize, parallel: bool, sequential: bool) -> Mode {
    if sequential || (!parallel && k > total_gpus) {
        Mode::Sequential
    } else {
        Mode::Parallel
    }
}

/// `hosts`: each host's GPUs in inventory order. Parallel mode deals every host's GPUs out to
/// the candidates in turn, so each host compares candidates on its own identical GPUs and
/// spare GPUs become replicas; the starting candidate rotates across hosts so that leftovers
/// spread evenly.
pub fn assign(
    hosts: &[(String, Vec<u32>)],
    k: usize,
    mode: Mode,
) -> Result<Assignment, AssignError> {
    let all: Vec<Slot> = hosts
        .iter()
        .flat_map(|(h, gpus)| {
            gpus.iter().map(move |&gpu| Slot {
                host: h.clone(),
                gpu,
            })
        })
        .collect();
    if all.is_empty() {
        return Err(AssignError::NoGpus);
    }
    let gpus = match mode {
        Mode::Sequential => vec![all; k],
        Mode::Parallel => {
            if k > all.len() {
                return Err(AssignError::TooFewGpus {
                    candidates: k,
                    gpus: all.len(),
                });
            }
            let mut groups = vec![Vec::new(); k];
            let mut next = 0;
            for (host, host_gpus) in hosts {
                for &gpu in host_gpus {
                    groups[next % k].push(Slot {
                        host: host.clone(),
                        gpu,
                    });
                    next += 1;
                }
            }
            groups
        }
    };
    Ok(Assignment { mode, gpus })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, n: u32) -> (String, Vec<u32>) {
        (name.to_string(), (0..n).collect())
    }

    #[test]
    fn two_candidates_on_eight_gpus_get_four_each_interleaved() {
        let a = assign(&[host("ct200", 8)], 2, Mode::Parallel).unwrap();
        let gpus: Vec<Vec<u32>> = a
            .gpus
            .iter()
            .map(|g| g.iter().map(|s| s.gpu).collect())
            .collect();
        assert_eq!(gpus, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
    }

    #[test]
    fn leftovers_rotate_across_hosts_and_each_host_runs_every_candidate() {
        let a = assign(&[host("a", 4), host("b", 4)], 3, Mode::Parallel).unwrap();
        let sizes: Vec<usize> = a.gpus.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![3, 3, 2]);
        for g in &a.gpus {
            assert!(
                g.iter().any(|s| s.host == "a") && g.iter().any(|s| s.host == "b"),
                "{g:?}"
            );
        }
    }

    #[test]
    fn sequential_gives_every_candidate_every_gpu() {
        let a = assign(&[host("ct200", 8)], 3, Mode::Sequential).unwrap();
        assert!(a.gpus.iter().all(|g| g.len() == 8));
    }

    #[test]
    fn too_many_candidates_for_parallel_is_explained() {
        assert_eq!(
            assign(&[host("ct200", 2)], 3, Mode::Parallel),
            Err(AssignError::TooFewGpus {
                candidates: 3,
                gpus: 2
            })
        );
        assert_eq!(choose_mode(3, 2, false, false), Mode::Sequential);
        assert_eq!(choose_mode(2, 8, false, false), Mode::Parallel);
        assert_eq!(choose_mode(2, 8, false, true), Mode::Sequential);
    }
}

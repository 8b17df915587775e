//! What a server is made of: its parallel layout (tensor, data and expert parallel sizes, DP
//! attention, nodes), sized with SGLang's own rules, and the GPU groups a host's board gives it.
//! Pure: the config, the plan, the backends and the sweep all read this one type.

pub mod groups;
pub mod nodes;
pub mod predict;
pub mod topology;

use std::fmt;

pub use groups::Group;
pub use topology::{Board, Link, TopologyError};

/// A server's parallel layout, as the profile's `server.tp_size`, `dp_size`, `ep_size`,
/// `enable_dp_attention` and `nnodes` give it. The default is one GPU per server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Parallel {
    pub tp: u32,
    pub dp: u32,
    pub ep: u32,
    pub dp_attention: bool,
    pub nnodes: u32,
}

impl Default for Parallel {
    fn default() -> Self {
        Parallel {
            tp: 1,
            dp: 1,
            ep: 1,
            dp_attention: false,
            nnodes: 1,
        }
    }
}

/// A layout SGLang would refuse at start-up, found before anything starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParallelError {
    #[error(
        "with enable_dp_attention the data-parallel ranks split the tensor-parallel GPUs: \
         tp_size {tp} is not divisible by dp_size {dp}"
    )]
    DpAttentionSplit { tp: u32, dp: u32 },
    #[error("ep_size {ep} must divide tp_size {tp}: each expert spans tp_size ÷ ep_size GPUs")]
    Experts { ep: u32, tp: u32 },
    #[error("a server's {gpus} GPUs do not divide over nnodes {nnodes}")]
    Nodes { gpus: u32, nnodes: u32 },
}

impl Parallel {
    /// GPUs per server, by SGLang's rule (`srt/server_args.py`): plain data parallel runs dp
    /// replicas of a tp group; with DP attention the dp ranks share the tp GPUs.
    pub fn gpus(&self) -> u32 {
        if self.dp_attention {
            self.tp
        } else {
            self.tp * self.dp
        }
    }

    /// GPUs each of the server's nodes gives it.
    pub fn gpus_per_node(&self) -> u32 {
        self.gpus() / self.nnodes.max(1)
    }

    /// Whether a server is one GPU of one node, as before layouts.
    pub fn is_single(&self) -> bool {
        self.gpus() == 1 && self.nnodes == 1
    }

    /// Every rule of SGLang's that the sizes alone can break.
    pub fn check(&self) -> Vec<ParallelError> {
        let mut out = Vec::new();
        if self.dp_attention && !self.tp.is_multiple_of(self.dp) {
            out.push(ParallelError::DpAttentionSplit {
                tp: self.tp,
                dp: self.dp,
            });
        }
        if self.ep > 1 && (self.ep > self.tp || !self.tp.is_multiple_of(self.ep)) {
            out.push(ParallelError::Experts {
                ep: self.ep,
                tp: self.tp,
            });
        }
        if !self.gpus().is_multiple_of(self.nnodes.max(1)) {
            out.push(ParallelError::Nodes {
                gpus: self.gpus(),
                nnodes: self.nnodes,
            });
        }
        out
    }
}

impl fmt::Display for Parallel {
    /// `tp2`, `tp2×dp4`, `tp8 dp-attn dp8 ep8`, `tp16 over 2 nodes`: short, for tables.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp{}", self.tp)?;
        if self.dp > 1 {
            if self.dp_attention {
                write!(f, " dp-attn dp{}", self.dp)?;
            } else {
                write!(f, "×dp{}", self.dp)?;
            }
        }
        if self.ep > 1 {
            write!(f, " ep{}", self.ep)?;
        }
        if self.nnodes > 1 {
            write!(f, " over {} nodes", self.nnodes)?;
        }
        Ok(())
    }
}

/// Why a host's selected GPUs cannot hold whole servers of a layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error(
        "host `{host}`: a {parallel} server needs {need} GPUs on each node, and the selection \
         has {have} ({gpus})"
    )]
    TooFew {
        host: String,
        parallel: Parallel,
        need: u32,
        have: usize,
        gpus: String,
    },
    #[error(
        "host `{host}`: its {have} selected GPUs ({gpus}) do not split into whole servers of \
         {need} GPUs ({parallel}); select a multiple of {need} with the inventory's `gpus:` or \
         --gpus"
    )]
    Remainder {
        host: String,
        parallel: Parallel,
        need: u32,
        have: usize,
        gpus: String,
    },
    #[error(
        "host `{host}`: a {parallel} server runs {share} GPUs on each of its nodes, and the \
         allocation has {have}"
    )]
    Nodes {
        host: String,
        parallel: Parallel,
        share: u32,
        /// Each node with its GPUs, as `n1: 8, n2: 6`.
        have: String,
    },
}

/// The groups of one host: `gpus` is its selection, `board` its topology when one was read.
pub fn place(
    host: &str,
    parallel: &Parallel,
    gpus: &[u32],
    board: Option<&Board>,
) -> Result<Vec<Group>, PlaceError> {
    let need = parallel.gpus_per_node();
    let list = gpus
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if (gpus.len() as u32) < need {
        return Err(PlaceError::TooFew {
            host: host.into(),
            parallel: *parallel,
            need,
            have: gpus.len(),
            gpus: list,
        });
    }
    if !(gpus.len() as u32).is_multiple_of(need) {
        return Err(PlaceError::Remainder {
            host: host.into(),
            parallel: *parallel,
            need,
            have: gpus.len(),
            gpus: list,
        });
    }
    Ok(groups::choose(board, gpus, need as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(tp: u32, dp: u32, dp_attention: bool, nnodes: u32) -> Parallel {
        Parallel {
            tp,
            dp,
            dp_attention,
            nnodes,
            ..Parallel::default()
        }
    }

    #[test]
    fn gpus_follow_sglangs_rule() {
        assert_eq!(Parallel::default().gpus(), 1);
        assert!(Parallel::default().is_single());
        assert_eq!(p(2, 4, false, 1).gpus(), 8);
        assert_eq!(p(8, 8, true, 1).gpus(), 8);
        assert_eq!(p(16, 1, false, 2).gpus_per_node(), 8);
        assert_eq!(p(2, 4, false, 1).to_string(), "tp2×dp4");
        assert_eq!(p(16, 1, false, 2).to_string(), "tp16 over 2 nodes");
        assert!(p(8, 8, true, 1).check().is_empty());
    }

    #[test]
    fn layouts_sglang_refuses_are_named() {
        assert_eq!(
            p(4, 3, true, 1).check(),
            vec![ParallelError::DpAttentionSplit { tp: 4, dp: 3 }]
        );
        let ep = Parallel {
            ep: 3,
            ..p(4, 1, false, 3)
        };
        assert_eq!(ep.check().len(), 2);
    }

    #[test]
    fn a_selection_too_small_or_not_divisible_is_refused_with_what_exists() {
        let tp16 = p(16, 1, false, 1);
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(
            place("ct200", &tp16, &all, None).unwrap_err().to_string(),
            "host `ct200`: a tp16 server needs 16 GPUs on each node, and the selection has 8 \
             (0,1,2,3,4,5,6,7)"
        );
        let err = place("ct200", &p(4, 1, false, 1), &[0, 1, 2, 3, 4, 5], None).unwrap_err();
        assert!(err.to_string().contains("select a multiple of 4"), "{err}");
        let groups = place("ct200", &p(2, 1, false, 1), &[4, 5, 6, 7], None).unwrap();
        assert_eq!(groups.len(), 2);
    }
}

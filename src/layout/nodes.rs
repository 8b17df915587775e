//! Servers over several nodes: which node gives each rank of a server its GPUs, by SGLang's
//! rule that every node runs the same share (`gpus ÷ nnodes`) and rank 0 serves the API.

use super::{Group, Parallel, PlaceError};

/// One rank of a server: the node it runs on (its address) and its GPUs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlace {
    pub node: String,
    pub group: Group,
}

/// The servers `places` hold, each as its ranks in order (rank 0 first). `places` are the
/// host's GPU places with the node each is on, node by node (a Slurm allocation's order);
/// nodes are taken `nnodes` at a time, and each node's places split into whole shares.
pub fn spread(
    host: &str,
    parallel: &Parallel,
    places: &[(u32, String)],
) -> Result<Vec<Vec<RankPlace>>, PlaceError> {
    let nnodes = parallel.nnodes.max(1) as usize;
    let share = parallel.gpus_per_node().max(1) as usize;
    let mut nodes: Vec<(String, Vec<u32>)> = Vec::new();
    for (place, node) in places {
        match nodes.iter_mut().find(|(n, _)| n == node) {
            Some((_, list)) => list.push(*place),
            None => nodes.push((node.clone(), vec![*place])),
        }
    }
    let uneven = nodes.iter().any(|(_, p)| !p.len().is_multiple_of(share));
    if nodes.len() < nnodes || !nodes.len().is_multiple_of(nnodes) || uneven {
        return Err(PlaceError::Nodes {
            host: host.into(),
            parallel: *parallel,
            share: share as u32,
            have: nodes
                .iter()
                .map(|(n, p)| format!("{n}: {}", p.len()))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let mut servers = Vec::new();
    for set in nodes.chunks(nnodes) {
        let per_node = set[0].1.len() / share;
        let shares = set.iter().map(|(_, p)| p.len() / share).min().unwrap_or(0);
        for s in 0..shares.min(per_node) {
            servers.push(
                set.iter()
                    .map(|(node, p)| RankPlace {
                        node: node.clone(),
                        group: Group {
                            gpus: p[s * share..(s + 1) * share].to_vec(),
                            slowest: None,
                        },
                    })
                    .collect(),
            );
        }
    }
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(nodes: &[(&str, u32)]) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        for (node, n) in nodes {
            for _ in 0..*n {
                out.push((out.len() as u32, node.to_string()));
            }
        }
        out
    }

    fn layout(tp: u32, nnodes: u32) -> Parallel {
        Parallel {
            tp,
            nnodes,
            ..Parallel::default()
        }
    }

    #[test]
    fn a_tp16_server_takes_eight_gpus_on_each_of_two_nodes() {
        let servers = spread("hpc", &layout(16, 2), &places(&[("n1", 8), ("n2", 8)])).unwrap();
        assert_eq!(servers.len(), 1);
        let ranks = &servers[0];
        assert_eq!(
            (ranks[0].node.as_str(), ranks[1].node.as_str()),
            ("n1", "n2")
        );
        assert_eq!(ranks[0].group.gpus, (0..8).collect::<Vec<_>>());
        assert_eq!(ranks[1].group.gpus, (8..16).collect::<Vec<_>>());
    }

    #[test]
    fn smaller_shares_make_several_servers_each_over_the_same_nodes() {
        let servers = spread("hpc", &layout(4, 2), &places(&[("n1", 4), ("n2", 4)])).unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[1][0].group.gpus, vec![2, 3]);
        assert_eq!(servers[1][1].group.gpus, vec![6, 7]);
    }

    #[test]
    fn nodes_that_cannot_hold_whole_shares_are_refused_naming_what_each_has() {
        let err = spread("hpc", &layout(16, 2), &places(&[("n1", 8)])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "host `hpc`: a tp16 over 2 nodes server runs 8 GPUs on each of its nodes, and the \
             allocation has n1: 8"
        );
        assert!(spread("hpc", &layout(16, 2), &places(&[("n1", 8), ("n2", 6)])).is_err());
    }
}

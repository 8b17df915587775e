//! Which measured config is crowned: the fastest, unless another is the same within the noise
//! of their windows, in which case the one farther from the out-of-memory edge. Pure.
//!
//! A lead smaller than the windows can tell apart is a draw; of two configs that are equally
//! fast, the one that asks GPU memory for less is the one that keeps loading when the real job
//! meets a longer prompt, a fuller batch or another driver's overhead.

use std::cmp::Ordering;

use super::Measured;
use crate::sweep::space::Candidate;
use crate::sweep::stats::Estimate;

/// Keys whose larger values take more GPU memory, in the order they move the out-of-memory
/// edge: the static pool's share (each percent of it is about a GiB outside the pool on a
/// 96 GB GPU), then the decode graphs captured (a few hundred MiB across their range), then
/// the requests held at once.
pub const MEMORY_KEYS: [&str; 5] = [
    "server.mem_fraction_static",
    "flag.mem-fraction-static",
    "flag.cuda-graph-max-bs-decode",
    "flag.cuda-graph-max-bs",
    "server.max_running_requests",
];

/// Whether two figures are the same within their windows' noise: the 95% interval of their
/// difference (the root of the squared half-widths) holds zero. Without an interval on either,
/// they are told apart by their means.
pub fn tie(a: &Measured, b: &Measured) -> bool {
    let (Some(x), Some(y)) = (a.estimate, b.estimate) else {
        return false;
    };
    let half = |e: &Estimate| (e.high - e.low) / 2.0;
    (x.mean - y.mean).abs() < half(&x).hypot(half(&y))
}

/// How `a` stands against `b` by its distance to the out-of-memory edge: `Less` when `a` asks
/// less memory, compared key by key in [`MEMORY_KEYS`] order on the first key both set to
/// different numbers; `Equal` when none tells them apart.
pub fn memory_ask(a: &Candidate, b: &Candidate) -> Ordering {
    let get = |c: &Candidate, key: &str| {
        c.settings
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.parse::<f64>().ok())
    };
    MEMORY_KEYS
        .iter()
        .filter_map(|k| Some(get(a, k)?.total_cmp(&get(b, k)?)))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// Of `ranked` (fastest first, each a config's candidate and figure), the place of the one to
/// crown and the places of those tied with the fastest: the fastest, unless some tie with it,
/// then the one of them that asks the least memory (the fastest among equals).
pub fn crown(ranked: &[(&Candidate, &Measured)]) -> Option<(usize, Vec<usize>)> {
    let (_, top) = ranked.first()?;
    let tied: Vec<usize> = (1..ranked.len())
        .filter(|&i| tie(top, ranked[i].1))
        .collect();
    let mut pick = 0;
    for &i in &tied {
        if memory_ask(ranked[i].0, ranked[pick].0).is_lt() {
            pick = i;
        }
    }
    Some((pick, tied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::rank::Outcome;
    use crate::sweep::rank::tests::trial;

    /// A figure of `mean` output tok/s per GPU, without an interval.
    fn measured(mean: f64) -> Measured {
        match trial("no_buffer", mean, 72, 0.06).outcome {
            Outcome::Ok(m) => m,
            _ => unreachable!(),
        }
    }

    fn config(mem: &str, bs: &str) -> Candidate {
        let settings = vec![
            ("server.mem_fraction_static".to_string(), mem.to_string()),
            ("flag.cuda-graph-max-bs-decode".to_string(), bs.to_string()),
        ];
        Candidate::new(format!("{mem};{bs}"), settings)
    }

    fn at(mean: f64, half: f64) -> Measured {
        let mut m = measured(mean);
        m.estimate = Some(Estimate::around(mean, half));
        m
    }

    #[test]
    fn a_lead_inside_the_noise_is_a_tie_and_the_config_farther_from_the_edge_wins() {
        // The outside tester's race: 0.913 with a bound of 84 was the space's best, 0.882 with
        // 93 a little behind; one lucky window put 0.882 ahead.
        let (edge, safe) = (config("0.913", "84"), config("0.882", "93"));
        let (fast, near) = (at(1000.0, 20.0), at(985.0, 20.0));
        // 15 apart, the difference's interval ±28: a tie, crowned on memory.
        let (i, tied) = crown(&[(&edge, &fast), (&safe, &near)]).unwrap();
        assert_eq!((i, tied), (1, vec![1]));
        // Told apart (a 4% lead over ±1% windows): the fastest wins, though nearer the edge.
        let (far, tight) = (at(960.0, 10.0), at(1000.0, 10.0));
        let (i, tied) = crown(&[(&edge, &tight), (&safe, &far)]).unwrap();
        assert_eq!((i, tied), (0, vec![]));
    }

    #[test]
    fn ties_are_with_the_fastest_and_the_least_memory_among_them_wins() {
        let a = config("0.90", "128");
        let b = config("0.90", "96");
        let c = config("0.85", "300");
        let ranked = [
            (&a, &at(1000.0, 15.0)),
            (&b, &at(990.0, 15.0)),
            // Beyond the fastest's noise, though within the second's: not a tie.
            (&c, &at(965.0, 15.0)),
        ];
        let (i, tied) = crown(&ranked).unwrap();
        assert_eq!((i, tied), (1, vec![1]), "same fraction: the smaller bound");
        assert_eq!(memory_ask(&c, &a), Ordering::Less, "the fraction first");
        assert!(crown(&[]).is_none());
    }

    #[test]
    fn without_intervals_or_memory_keys_the_mean_decides() {
        let a = Candidate::new(
            "a".into(),
            vec![("server.mamba_strategy".into(), "a".into())],
        );
        let b = Candidate::new(
            "b".into(),
            vec![("server.mamba_strategy".into(), "b".into())],
        );
        assert!(!tie(&measured(100.0), &measured(100.5)), "no interval");
        let (x, y) = (at(100.0, 5.0), at(99.0, 5.0));
        assert!(tie(&x, &y));
        assert_eq!(crown(&[(&a, &x), (&b, &y)]), Some((0, vec![1])));
    }
}

//! Which measured config is crowned: the fastest, unless another is the same within the noise
//! of their windows, in which case the one farther from the out-of-memory edge. Pure.
//!
//! A lead smaller than the windows can tell apart is a draw; of two configs that are equally
//! fast, the one that asks GPU memory for less is the one that keeps loading when the real job
//! meets a longer prompt, a fuller batch or another driver's overhead. "Within the noise" is
//! the one-standard-error rule of model selection (Breiman et al., *Classification and
//! Regression Trees*, 1984): the simplest model whose error is within one standard error of
//! the best's. A 95% interval would be a wider draw, and every config it calls equal to the
//! fastest may be crowned: near the memory edge, where the best lies, that gives away a few
//! percent of throughput for headroom the windows cannot show is needed.
//!
//! The noise is read from the windows themselves: a search measures each leader twice, the
//! second time all of them side by side, so each leader's two windows differ by the change of
//! load between the rounds (the same for all of them) plus its own noise. The spread of those
//! differences across the leaders is that noise, whatever the host; a bin-by-bin interval of a
//! single window counts a continuously batched server's bursts (a step's tokens land in one bin
//! and not the next) and reads several times wider than two windows of one config differ.

use std::cmp::Ordering;

use crate::sweep::space::Candidate;

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

/// A config in the race: its candidate and its full windows' rates (output tok/s per GPU), in
/// the order they ran.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub candidate: &'a Candidate,
    pub windows: &'a [f64],
}

impl Entry<'_> {
    fn mean(&self) -> f64 {
        self.windows.iter().sum::<f64>() / self.windows.len().max(1) as f64
    }
}

/// The noise of one window: from the configs measured at least twice, the spread of their
/// last window less their first about the mean of those differences (which is the change of
/// load between the rounds). `None` below three such configs: two differences cannot tell
/// noise from a shift.
pub fn window_noise(entries: &[Entry<'_>]) -> Option<f64> {
    let d: Vec<f64> = entries
        .iter()
        .filter(|e| e.windows.len() >= 2)
        .map(|e| e.windows[e.windows.len() - 1] - e.windows[0])
        .collect();
    if d.len() < 3 {
        return None;
    }
    let mean = d.iter().sum::<f64>() / d.len() as f64;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (d.len() - 1) as f64;
    // Each difference holds two windows' noise.
    Some((var / 2.0).sqrt())
}

/// Whether `a` and `b` are the same within `sigma` (one window's noise): their means differ
/// by less than one standard error of the difference.
pub fn tie(a: &Entry<'_>, b: &Entry<'_>, sigma: f64) -> bool {
    let n = |e: &Entry<'_>| e.windows.len().max(1) as f64;
    (a.mean() - b.mean()).abs() < sigma * (1.0 / n(a) + 1.0 / n(b)).sqrt()
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

/// Of `race` (fastest first), the place of the one to crown and the places of those tied with
/// the fastest: the fastest, unless some tie with it by [`window_noise`], then the one of them
/// that asks the least memory (the fastest among equals). Without a noise to judge by (fewer
/// than three configs measured twice), the fastest and no tie.
pub fn crown(race: &[Entry<'_>]) -> Option<(usize, Vec<usize>)> {
    let top = race.first()?;
    let tied: Vec<usize> = match window_noise(race) {
        Some(noise) => (1..race.len())
            .filter(|&i| tie(top, &race[i], noise))
            .collect(),
        None => Vec::new(),
    };
    let mut pick = 0;
    for &i in &tied {
        if memory_ask(race[i].candidate, race[pick].candidate).is_lt() {
            pick = i;
        }
    }
    Some((pick, tied))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mem: &str, bs: &str) -> Candidate {
        let settings = vec![
            ("server.mem_fraction_static".to_string(), mem.to_string()),
            ("flag.cuda-graph-max-bs-decode".to_string(), bs.to_string()),
        ];
        Candidate::new(format!("{mem};{bs}"), settings)
    }

    fn entries<'a>(configs: &'a [Candidate], windows: &'a [Vec<f64>]) -> Vec<Entry<'a>> {
        configs
            .iter()
            .zip(windows)
            .map(|(candidate, w)| Entry {
                candidate,
                windows: w,
            })
            .collect()
    }

    #[test]
    fn the_noise_is_the_spread_of_each_config_s_change_between_its_windows() {
        let c = [config("0.9", "1"), config("0.9", "2"), config("0.9", "3")];
        // Every second window 100 lower (the load of the last round), give or take 10.
        let w = [
            vec![1200.0, 1090.0],
            vec![1150.0, 1050.0],
            vec![1100.0, 1010.0],
        ];
        let sigma = window_noise(&entries(&c, &w)).unwrap();
        // Differences -110, -100, -90: sd 10 over two windows' noise.
        assert!((sigma - 10.0 / 2f64.sqrt()).abs() < 1e-9, "{sigma}");
        assert_eq!(window_noise(&entries(&c[..2], &w[..2])), None, "too few");
        let once = [vec![1200.0], vec![1150.0], vec![1100.0]];
        assert_eq!(window_noise(&entries(&c, &once)), None, "one window each");
    }

    #[test]
    fn a_lead_inside_the_noise_is_a_tie_and_the_config_farther_from_the_edge_wins() {
        // The outside tester's race: 0.913 with a bound of 84 was the space's best, 0.882 with
        // 93 a little behind.
        let c = [
            config("0.913", "84"),
            config("0.882", "93"),
            config("0.90", "120"),
            config("0.85", "200"),
        ];
        // Second windows 20 lower, give or take 20 (one window's noise 11.5, the standard
        // error of a difference of two-window means as much): 0.882 trails by 8, a tie; 0.90
        // by 15 and 0.85 by 80, not.
        let w = [
            vec![1010.0, 990.0],
            vec![992.0, 992.0],
            vec![1005.0, 965.0],
            vec![930.0, 910.0],
        ];
        let (i, tied) = crown(&entries(&c, &w)).unwrap();
        assert_eq!((i, tied), (1, vec![1]));
        // Windows twice as noisy: 0.90 ties too, and 0.882 still asks the least memory.
        let w = [
            vec![1020.0, 980.0],
            vec![992.0, 992.0],
            vec![1025.0, 945.0],
            vec![940.0, 900.0],
        ];
        assert_eq!(crown(&entries(&c, &w)).unwrap(), (1, vec![1, 2]));
        // Told apart: the fastest wins, though nearer the edge.
        let w = [
            vec![1100.0, 1090.0],
            vec![1000.0, 992.0],
            vec![985.0, 975.0],
            vec![920.0, 908.0],
        ];
        assert_eq!(crown(&entries(&c, &w)).unwrap(), (0, vec![]));
    }

    #[test]
    fn of_the_tied_the_least_memory_wins_the_fraction_first() {
        let c = [
            config("0.90", "128"),
            config("0.90", "96"),
            config("0.85", "300"),
        ];
        assert_eq!(
            memory_ask(&c[2], &c[0]),
            Ordering::Less,
            "the fraction first"
        );
        assert_eq!(memory_ask(&c[1], &c[0]), Ordering::Less, "then the bound");
        let same = [vec![1000.0, 990.0], vec![1002.0, 988.0], vec![990.0, 996.0]];
        assert_eq!(crown(&entries(&c, &same)).unwrap(), (2, vec![1, 2]));
        assert!(crown(&[]).is_none());
        // Without memory keys, equals keep the fastest.
        let s =
            |v: &str| Candidate::new(v.into(), vec![("server.mamba_strategy".into(), v.into())]);
        let plain = [s("a"), s("b"), s("c")];
        assert_eq!(crown(&entries(&plain, &same)).unwrap(), (0, vec![1, 2]));
    }
}

//! The throughput estimate a pruning decision rests on: the mean of equal-width samples
//! (output tok/s per GPU in each bin of a window) with a 95% confidence interval that
//! accounts for the samples' serial correlation. Pure.

use serde::{Deserialize, Serialize};

/// A throughput with its 95% confidence interval, output tok/s per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub mean: f64,
    pub low: f64,
    pub high: f64,
    /// How many bins the estimate is made of, and their width in seconds.
    pub samples: usize,
    pub sample_s: f64,
}

impl Estimate {
    /// `mean ± half` over 15 one-second bins: the estimates the pruning tests reason about.
    #[cfg(test)]
    pub fn around(mean: f64, half: f64) -> Estimate {
        Estimate {
            mean,
            low: mean - half,
            high: mean + half,
            samples: 15,
            sample_s: 1.0,
        }
    }

    /// The mean of independent estimates, with the interval of that mean: its half-width is
    /// the root of the halves' squares over their count. `None` for none.
    pub fn of_mean(estimates: &[Estimate]) -> Option<Estimate> {
        let n = estimates.len() as f64;
        let first = estimates.first()?;
        let mean = estimates.iter().map(|e| e.mean).sum::<f64>() / n;
        let half = estimates
            .iter()
            .map(|e| ((e.high - e.low) / 2.0).powi(2))
            .sum::<f64>()
            .sqrt()
            / n;
        Some(Estimate {
            mean,
            low: mean - half,
            high: mean + half,
            samples: estimates.iter().map(|e| e.samples).sum(),
            sample_s: first.sample_s,
        })
    }

    /// This interval lies wholly below `other`'s.
    pub fn clearly_below(&self, other: &Estimate) -> bool {
        self.high < other.low
    }
}

/// Fewer bins than this carry no usable spread.
pub const MIN_SAMPLES: usize = 3;

/// Above this lag-1 autocorrelation the effective sample size is taken at this value's: a
/// window that drifts that much is better judged as one observation than trusted more.
const MAX_RHO: f64 = 0.9;

/// The mean of `samples` (rates over consecutive bins of `sample_s` seconds) with a 95%
/// interval, or `None` when there is nothing to judge: fewer than [`MIN_SAMPLES`] bins, no
/// token in any of them (a window shorter than one decode step says nothing about the rate),
/// or bins so correlated that they are worth fewer than two independent observations.
///
/// Per-bin token counts of a continuously batched server are not independent: a long prefill
/// or a batch refill lowers several consecutive bins. Treating them as independent would give
/// intervals too narrow, so the standard error uses the effective sample size of an AR(1)
/// series, `n (1 - rho) / (1 + rho)` with `rho` the lag-1 autocorrelation (negative values,
/// which would narrow the interval, count as 0), and Student's t with `n_eff - 1` degrees of
/// freedom, rounded down.
pub fn estimate(samples: &[f64], sample_s: f64) -> Option<Estimate> {
    let n = samples.len();
    if n < MIN_SAMPLES || samples.iter().all(|&x| x == 0.0) {
        return None;
    }
    let mean = samples.iter().sum::<f64>() / n as f64;
    let ss: f64 = samples.iter().map(|x| (x - mean).powi(2)).sum();
    let rho = if ss == 0.0 {
        0.0
    } else {
        let lagged: f64 = samples
            .windows(2)
            .map(|w| (w[0] - mean) * (w[1] - mean))
            .sum();
        (lagged / ss).clamp(0.0, MAX_RHO)
    };
    let n_eff = n as f64 * (1.0 - rho) / (1.0 + rho);
    if n_eff < 2.0 {
        return None;
    }
    // A window that happens to be flat (every bin alike) says little about its spread: its
    // tokens are counted as a Poisson count varies, never with a zero-width interval that would
    // call a difference of one token clear.
    let variance = if ss == 0.0 {
        mean / sample_s
    } else {
        ss / (n - 1) as f64
    };
    let half = t_975(n_eff - 1.0) * (variance / n_eff).sqrt();
    Some(Estimate {
        mean,
        low: mean - half,
        high: mean + half,
        samples: n,
        sample_s,
    })
}

/// Two-sided 95% quantiles of Student's t for 1..=30 degrees of freedom.
const T_975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// Student's t 97.5% quantile for `df` degrees of freedom, rounded down to a whole number (so
/// never below the exact value); below 1, infinite. Beyond the table, 1.96 + 2.5/df, which is
/// at or above the exact quantile.
pub fn t_975(df: f64) -> f64 {
    if df.is_nan() || df < 1.0 {
        return f64::INFINITY;
    }
    let k = df.floor() as usize;
    match T_975.get(k - 1) {
        Some(t) => *t,
        None => 1.96 + 2.5 / k as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    #[test]
    fn independent_looking_samples_get_a_student_t_interval() {
        // Alternating values: negative lag-1 autocorrelation, taken as 0.
        let x = [10.0, 12.0, 10.0, 12.0, 10.0, 12.0, 10.0, 12.0];
        let e = estimate(&x, 0.5).unwrap();
        assert_eq!(e.mean, 11.0);
        let sd = (8.0 / 7.0_f64).sqrt();
        let half = 2.365 * sd / 8.0_f64.sqrt();
        assert!(
            close(e.low, 11.0 - half) && close(e.high, 11.0 + half),
            "{e:?}"
        );
        assert_eq!((e.samples, e.sample_s), (8, 0.5));
    }

    #[test]
    fn serial_correlation_widens_the_interval() {
        // The same values in pairs: lag-1 autocorrelation 1/8, so n_eff = 8 * 7/9 and t has 5
        // degrees of freedom.
        let pairs = [10.0, 10.0, 12.0, 12.0, 10.0, 10.0, 12.0, 12.0];
        let e = estimate(&pairs, 1.0).unwrap();
        let sd = (8.0 / 7.0_f64).sqrt();
        let half = 2.571 * sd / (8.0 * 7.0 / 9.0_f64).sqrt();
        assert!(close(e.high, 11.0 + half), "{e:?}");
        // In blocks of four (rho = 5/8) the window is worth less than two observations: nothing
        // is judged on it.
        let blocks = [10.0, 10.0, 10.0, 10.0, 12.0, 12.0, 12.0, 12.0];
        assert_eq!(estimate(&blocks, 1.0), None);
    }

    #[test]
    fn too_few_or_empty_bins_are_no_estimate_and_a_flat_window_counts_its_tokens() {
        assert_eq!(estimate(&[5.0, 6.0], 1.0), None);
        assert_eq!(estimate(&[0.0; 8], 1.0), None);
        // 1000 tokens in each of 8 one-second bins: a Poisson count's spread, sqrt(1000) per
        // bin, so a flat 1001 is not clearly above it.
        let flat = estimate(&[1000.0; 8], 1.0).unwrap();
        let half = 2.365 * (1000.0_f64 / 8.0).sqrt();
        assert!(
            close(flat.low, 1000.0 - half) && close(flat.high, 1000.0 + half),
            "{flat:?}"
        );
        let next = estimate(&[1001.0; 8], 1.0).unwrap();
        assert!(!flat.clearly_below(&next));
    }

    #[test]
    fn bursty_bins_of_a_slow_server_give_a_wide_interval() {
        // A server whose decode step is longer than a bin: most bins empty, some a whole batch.
        let x = [0.0, 296.0, 0.0, 0.0, 296.0, 0.0, 296.0, 0.0];
        let e = estimate(&x, 0.125).unwrap();
        assert!(e.low < 0.0 && e.high > 2.0 * e.mean, "{e:?}");
    }

    #[test]
    fn t_quantiles_are_never_below_the_exact_ones() {
        assert_eq!(t_975(1.0), 12.706);
        assert_eq!(t_975(7.9), 2.365, "rounded down");
        assert_eq!(t_975(30.0), 2.042);
        // Exact: 2.021 (40), 2.000 (60), 1.980 (120).
        for (df, exact) in [(40.0, 2.021), (60.0, 2.000), (120.0, 1.980)] {
            let t = t_975(df);
            assert!(t >= exact && t < exact + 0.025, "{df}: {t}");
        }
        assert!(t_975(0.5).is_infinite());
        assert!(t_975(f64::NAN).is_infinite());
    }

    #[test]
    fn clearly_below_needs_the_intervals_apart() {
        let e = |low, high| Estimate {
            mean: (low + high) / 2.0,
            low,
            high,
            samples: 8,
            sample_s: 1.0,
        };
        assert!(e(90.0, 110.0).clearly_below(&e(111.0, 130.0)));
        assert!(!e(90.0, 112.0).clearly_below(&e(111.0, 130.0)), "overlap");
        assert!(!e(111.0, 130.0).clearly_below(&e(90.0, 110.0)));
    }
}

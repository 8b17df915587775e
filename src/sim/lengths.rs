//! The distribution of natural output lengths (`--sim-output-dist`, `--sim-output-seed`).
//!
//! A prompt's natural length (what it would generate before EOS, ahead of the max-tokens and
//! context caps) is a draw from [`OutputDist`], deterministic in (prompt hash, seed). The seed
//! is mixed into the prompt hash with `hash ^ mix(seed)`; `mix(0) == 0`, so seed 0 keeps the
//! draws of the sim without the flag, and `uniform` is [`text::natural_output_len`] itself.

use crate::sim::text::{self, mix};

/// What `--sim-output-dist` accepts, for the error message.
pub const EXPECTED: &str =
    "expected uniform, uniform:LO:HI, lognormal:MEDIAN:SIGMA or bimodal:SHORT:LONG:SHARE";

/// The largest natural length drawn: heavy tails stay far below `u64` overflow when the
/// reasoning tokens are added (the caps cut them to max tokens or the context anyway).
const MAX_LEN: u64 = u32::MAX as u64;

/// How natural output lengths are distributed over prompts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OutputDist {
    /// The default: uniform over [0.5, 1.5] × `--sim-mean-output-tokens`.
    Uniform,
    /// Uniform over the integers [lo, hi].
    Range { lo: u64, hi: u64 },
    /// exp(ln(median) + sigma·z), z standard normal.
    LogNormal { median: f64, sigma: f64 },
    /// With probability `share` uniform over [0.8, 1.2] × `long`, else [0.5, 1.5] × `short`.
    Bimodal { short: u64, long: u64, share: f64 },
}

impl OutputDist {
    /// Reads a `--sim-output-dist` SPEC; `None` when it is not one of [`EXPECTED`].
    pub fn parse(spec: &str) -> Option<OutputDist> {
        let parts: Vec<&str> = spec.trim().split(':').collect();
        let int = |s: &str| s.trim().parse::<u64>().ok().filter(|n| *n >= 1);
        let float = |s: &str| s.trim().parse::<f64>().ok().filter(|x| x.is_finite());
        match parts[..] {
            ["uniform"] => Some(OutputDist::Uniform),
            ["uniform", lo, hi] => {
                let (lo, hi) = (int(lo)?, int(hi)?);
                (lo <= hi).then_some(OutputDist::Range { lo, hi })
            }
            ["lognormal", median, sigma] => {
                let (median, sigma) = (float(median)?, float(sigma)?);
                (median > 0.0 && sigma >= 0.0).then_some(OutputDist::LogNormal { median, sigma })
            }
            ["bimodal", short, long, share] => {
                let (short, long, share) = (int(short)?, int(long)?, float(share)?);
                (0.0..=1.0)
                    .contains(&share)
                    .then_some(OutputDist::Bimodal { short, long, share })
            }
            _ => None,
        }
    }

    /// The natural output length of the prompt with this hash under `seed`: at least 1.
    /// `mean_output_tokens` (`--sim-mean-output-tokens`) scales `uniform` only.
    pub fn draw(&self, prompt_hash: u64, seed: u64, mean_output_tokens: u64) -> u64 {
        let key = prompt_hash ^ mix(seed);
        let x = mix(key);
        let len = match *self {
            OutputDist::Uniform => return text::natural_output_len(key, mean_output_tokens),
            // lo ≥ 1, so the span cannot overflow.
            OutputDist::Range { lo, hi } => lo + x % (hi - lo + 1),
            OutputDist::LogNormal { median, sigma } => {
                let y = mix(x ^ 0x9e37_79b9_7f4a_7c15);
                // Box–Muller; 1 − u lies in (0, 1], so the logarithm is finite.
                let z = (-2.0 * (1.0 - unit(x)).ln()).sqrt()
                    * (2.0 * std::f64::consts::PI * unit(y)).cos();
                (median.ln() + sigma * z).exp().round() as u64
            }
            OutputDist::Bimodal { short, long, share } => {
                let y = unit(mix(x ^ 0x9e37_79b9_7f4a_7c15));
                if unit(x) < share {
                    (long as f64 * (0.8 + 0.4 * y)).round() as u64
                } else {
                    (short as f64 * (0.5 + y)).round() as u64
                }
            }
        };
        len.clamp(1, MAX_LEN)
    }

    /// The analytic mean of the distribution, before any cap (and before the rounding to
    /// whole tokens and the floor of 1, which move it by well under a token).
    pub fn mean(&self, mean_output_tokens: u64) -> f64 {
        match *self {
            OutputDist::Uniform => mean_output_tokens as f64,
            OutputDist::Range { lo, hi } => (lo as f64 + hi as f64) / 2.0,
            OutputDist::LogNormal { median, sigma } => median * (sigma * sigma / 2.0).exp(),
            OutputDist::Bimodal { short, long, share } => {
                (1.0 - share) * short as f64 + share * long as f64
            }
        }
    }
}

/// The top 53 bits of `x` as a float in [0, 1).
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::text::hash;

    fn sample_mean(dist: OutputDist, seed: u64) -> f64 {
        let n = 20_000u64;
        let total: u64 = (0..n)
            .map(|i| dist.draw(hash(format!("prompt {i}").as_bytes()), seed, 988))
            .sum();
        total as f64 / n as f64
    }

    #[test]
    fn each_kind_s_sample_mean_is_near_its_analytic_mean() {
        for (spec, tolerance) in [
            ("uniform", 0.03),
            ("uniform:10:5000", 0.03),
            ("uniform:1:1", 0.0),
            ("lognormal:400:1.0", 0.05),
            ("lognormal:1000:0.5", 0.05),
            ("bimodal:200:4000:0.25", 0.03),
            ("bimodal:300:20000:0", 0.03),
        ] {
            let dist = OutputDist::parse(spec).unwrap();
            let want = dist.mean(988);
            for seed in [0, 7] {
                let got = sample_mean(dist, seed);
                assert!(
                    (got - want).abs() <= tolerance * want,
                    "{spec} seed {seed}: sample mean {got}, analytic {want}"
                );
            }
        }
    }

    #[test]
    fn seed_zero_uniform_is_the_old_draw_and_other_seeds_differ() {
        // The formula before the distributions existed, spelled out.
        let old = |h: u64, mean: u64| {
            let frac = (mix(h) % 10_001) as f64 / 10_000.0;
            ((mean as f64) * (0.5 + frac)).round().max(1.0) as u64
        };
        for i in 0..1000u64 {
            let h = hash(format!("prompt {i}").as_bytes());
            for mean in [1, 40, 988] {
                assert_eq!(OutputDist::Uniform.draw(h, 0, mean), old(h, mean));
            }
        }
        for spec in [
            "uniform",
            "uniform:1:100000",
            "lognormal:500:1.2",
            "bimodal:100:9000:0.5",
        ] {
            let dist = OutputDist::parse(spec).unwrap();
            let draws = |seed| -> Vec<u64> {
                (0..200u64)
                    .map(|i| dist.draw(hash(format!("p{i}").as_bytes()), seed, 988))
                    .collect()
            };
            assert_eq!(draws(3), draws(3), "{spec}: deterministic");
            let (a, b) = (draws(0), draws(1));
            let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
            assert!(same < 20, "{spec}: {same} of 200 draws equal across seeds");
            assert!(a.iter().chain(&b).all(|n| *n >= 1), "{spec}");
        }
    }

    #[test]
    fn lengths_are_at_least_one_and_tails_stay_bounded() {
        let tiny = OutputDist::parse("lognormal:1:3").unwrap();
        let huge = OutputDist::parse("lognormal:1e300:5").unwrap();
        for i in 0..2000u64 {
            assert!(tiny.draw(i, 0, 988) >= 1);
            assert!((1..=MAX_LEN).contains(&huge.draw(i, 0, 988)));
        }
        let one = OutputDist::parse("bimodal:1:1:0.5").unwrap();
        assert!((0..100).all(|i| one.draw(i, 9, 988) == 1));
        let all = OutputDist::parse(&format!("uniform:1:{}", u64::MAX)).unwrap();
        assert!(all.draw(5, 0, 988) >= 1);
    }

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        assert_eq!(OutputDist::parse("uniform"), Some(OutputDist::Uniform));
        assert_eq!(
            OutputDist::parse("uniform:100:2000"),
            Some(OutputDist::Range { lo: 100, hi: 2000 })
        );
        assert_eq!(
            OutputDist::parse("lognormal:600:1.1"),
            Some(OutputDist::LogNormal {
                median: 600.0,
                sigma: 1.1
            })
        );
        assert_eq!(
            OutputDist::parse("bimodal:300:40000:0.1"),
            Some(OutputDist::Bimodal {
                short: 300,
                long: 40000,
                share: 0.1
            })
        );
        assert_eq!(OutputDist::Uniform.mean(40), 40.0);
        assert_eq!(OutputDist::parse("uniform:10:20").unwrap().mean(988), 15.0);
        assert_eq!(
            OutputDist::parse("bimodal:100:1100:0.25")
                .unwrap()
                .mean(988),
            350.0
        );
        let ln = OutputDist::parse("lognormal:100:2").unwrap().mean(988);
        assert!((ln - 100.0 * 2f64.exp()).abs() < 1e-9);
        for bad in [
            "",
            "nope",
            "Uniform",
            "uniform:",
            "uniform:5",
            "uniform:0:10",
            "uniform:20:10",
            "uniform:1.5:10",
            "uniform:-1:10",
            "uniform:1:2:3",
            "lognormal:0:1",
            "lognormal:-5:1",
            "lognormal:100:-1",
            "lognormal:100:nan",
            "lognormal:inf:1",
            "lognormal:100",
            "bimodal:100:1000",
            "bimodal:100:1000:1.5",
            "bimodal:100:1000:-0.1",
            "bimodal:0:1000:0.5",
            "bimodal:100:1000:0.5:1",
        ] {
            assert_eq!(OutputDist::parse(bad), None, "{bad:?} must be refused");
        }
    }
}

//! Capped exponential backoff with jitter: the one rule for how long to wait before retry
//! number n, shared by everything in fleet that retries (SSH reconnects, request retries).
//!
//! The wait before attempt `n` (1-based) is `min(cap, base * 2^(n-1))`, scaled by a jitter
//! factor in `[1 - jitter, 1]` so that clients that failed together do not retry in waves.
//! The factor is either supplied (tests, callers with their own random source) or drawn with
//! `rand`.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait before the first retry, before jitter.
    pub base: Duration,
    /// No wait is longer than this.
    pub cap: Duration,
    /// How much of the wait jitter may take away: 0 none, 0.5 up to half ("equal jitter", the
    /// default), 1 all of it ("full jitter").
    pub jitter: f64,
}

impl Backoff {
    /// `base` doubling up to `cap`, with equal jitter (waits in `[ceiling / 2, ceiling]`).
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            jitter: 0.5,
        }
    }

    /// The same schedule with another jitter fraction (clamped to `[0, 1]`).
    pub fn with_jitter(self, jitter: f64) -> Self {
        Backoff {
            jitter: jitter.clamp(0.0, 1.0),
            ..self
        }
    }

    /// The longest wait before attempt `attempt` (1-based; 0 counts as 1): `base` doubled
    /// `attempt - 1` times, at most `cap`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.base.saturating_mul(1u32 << doublings).min(self.cap)
    }

    /// The wait before attempt `attempt`, with `unit` in `[0, 1]` (clamped) choosing where in
    /// the jitter window it falls: 0 the shortest, 1 the ceiling.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let unit = if unit.is_nan() {
            1.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        self.ceiling(attempt)
            .mul_f64(1.0 - self.jitter + self.jitter * unit)
    }

    /// [`Backoff::delay`] with the jitter drawn from `rng`.
    pub fn delay_with(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        self.delay(attempt, rng.random_range(0.0..=1.0))
    }

    /// [`Backoff::delay`] with the jitter drawn from the thread's random generator.
    pub fn random_delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, &mut rand::rng())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ceiling_doubles_from_base_up_to_the_cap() {
        let b = Backoff::new(250 * MS, 5000 * MS);
        let ceilings: Vec<u128> = (0..=8).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(
            ceilings,
            [250, 250, 500, 1000, 2000, 4000, 5000, 5000, 5000]
        );
        // No overflow however long the outage.
        assert_eq!(b.ceiling(u32::MAX), 5000 * MS);
        let huge = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        assert_eq!(huge.ceiling(40), Duration::MAX);
    }

    #[test]
    fn jitter_only_shortens_the_wait_within_its_window() {
        let b = Backoff::new(1000 * MS, 8000 * MS);
        assert_eq!(b.delay(3, 1.0), 4000 * MS);
        assert_eq!(b.delay(3, 0.0), 2000 * MS);
        assert_eq!(b.delay(3, 0.5), 3000 * MS);
        assert_eq!(b.delay(3, 7.0), 4000 * MS, "clamped");
        assert_eq!(b.delay(3, f64::NAN), 4000 * MS);
        let full = b.with_jitter(1.0);
        assert_eq!(full.delay(1, 0.0), Duration::ZERO);
        assert_eq!(full.delay(1, 0.25), 250 * MS);
        let none = b.with_jitter(-3.0);
        assert_eq!(none.jitter, 0.0);
        assert_eq!(none.delay(2, 0.0), 2000 * MS);
    }

    #[test]
    fn drawn_delays_stay_in_the_window_and_vary() {
        let b = Backoff::new(100 * MS, 10_000 * MS);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let draws: Vec<Duration> = (0..200).map(|_| b.delay_with(4, &mut rng)).collect();
        assert!(
            draws.iter().all(|d| (400 * MS..=800 * MS).contains(d)),
            "{draws:?}"
        );
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 100, "jitter should spread the waits");
        assert!((50 * MS..=100 * MS).contains(&b.random_delay(1)));
    }
}

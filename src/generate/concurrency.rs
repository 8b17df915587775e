//! Per-instance in-flight limits: fixed, or adaptive from the server's own running/queued
//! counts so that its batch stays full while its queue stays short but non-empty.

use serde::Serialize;

/// `--concurrency auto|N`, or the sweep's closed loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ConcurrencyMode {
    Auto,
    Fixed(u32),
    /// About [`SATURATE_FACTOR`] times the server's cap in flight, never tuned: a sweep trial
    /// holds every server saturated so candidates compare at full load.
    Saturate,
}

/// In-flight requests per server relative to its cap under [`ConcurrencyMode::Saturate`]:
/// enough that the batch stays full while a finished request's replacement is on its way,
/// without a long queue.
pub const SATURATE_FACTOR: f64 = 1.25;

/// What [`ConcurrencyMode::Saturate`] keeps in flight on a server with `cap`.
pub fn saturating(cap: u32) -> u32 {
    ((f64::from(cap) * SATURATE_FACTOR).ceil() as u32).max(1)
}

impl std::str::FromStr for ConcurrencyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(ConcurrencyMode::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if n > 0 => Ok(ConcurrencyMode::Fixed(n)),
            _ => Err(format!(
                "--concurrency must be `auto` or a positive number, got {s:?}"
            )),
        }
    }
}

/// Used when a server reports no cap: SGLang's batches rarely go past this without tuning.
const UNKNOWN_CAP_START: u32 = 64;
const UNKNOWN_CAP_MAX: u32 = 1024;

/// The in-flight limit of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Controller {
    mode: ConcurrencyMode,
    cap: Option<u32>,
    limit: u32,
}

impl Controller {
    /// `cap` is the server's effective max running requests.
    pub fn new(mode: ConcurrencyMode, cap: Option<u64>) -> Self {
        let cap = cap.map(|c| c.clamp(1, u32::MAX as u64) as u32);
        let limit = match mode {
            ConcurrencyMode::Fixed(n) => n,
            ConcurrencyMode::Auto => cap.map_or(UNKNOWN_CAP_START, |c| c + margin(c)),
            ConcurrencyMode::Saturate => saturating(cap.unwrap_or(1)),
        };
        Controller { mode, cap, limit }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Adjusts the limit from one `/metrics` reading. `in_flight` is what this client has
    /// outstanding there right now.
    pub fn observe(&mut self, running: f64, queued: f64, in_flight: u32) {
        if self.mode != ConcurrencyMode::Auto {
            return;
        }
        let m = self.cap.map_or(UNKNOWN_CAP_START / 8, margin);
        let max = self.cap.map_or(UNKNOWN_CAP_MAX, |c| 2 * c + m);
        let below_cap = self.cap.is_none_or(|c| running < c as f64);
        if queued < 1.0 && below_cap && in_flight + 1 >= self.limit {
            // The server has idle batch slots and nothing waiting: we are what holds it back.
            self.limit = (self.limit + (m / 2).max(1)).min(max);
        } else if queued > (2 * m) as f64 {
            // Requests wait in the server's queue: they add latency without adding throughput.
            let excess = (queued as u32).saturating_sub(m);
            self.limit = self.limit.saturating_sub((excess / 2).max(1)).max(1);
        }
    }
}

/// A small queue so a finishing request is replaced at once: an eighth of the cap, at least 2.
fn margin(cap: u32) -> u32 {
    (cap / 8).max(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_cap_plus_margin() {
        assert_eq!(Controller::new(ConcurrencyMode::Auto, Some(72)).limit(), 81);
        assert_eq!(Controller::new(ConcurrencyMode::Auto, Some(8)).limit(), 10);
        assert_eq!(Controller::new(ConcurrencyMode::Auto, None).limit(), 64);
        assert_eq!(
            Controller::new(ConcurrencyMode::Fixed(32), Some(72)).limit(),
            32
        );
    }

    #[test]
    fn steady_when_batch_full_and_queue_short() {
        let mut c = Controller::new(ConcurrencyMode::Auto, Some(72));
        c.observe(72.0, 9.0, 81);
        assert_eq!(c.limit(), 81);
    }

    #[test]
    fn grows_when_the_server_idles_and_shrinks_when_it_queues() {
        let mut c = Controller::new(ConcurrencyMode::Auto, Some(72));
        // Another client shares the server, or prompts are short: running below cap, no queue.
        c.observe(60.0, 0.0, 81);
        assert_eq!(c.limit(), 85);
        c.observe(72.0, 40.0, 85);
        assert_eq!(c.limit(), 70);
        // Never above twice the cap plus margin, never below 1.
        for _ in 0..100 {
            c.observe(0.0, 0.0, c.limit());
        }
        assert_eq!(c.limit(), 153);
        for _ in 0..100 {
            c.observe(72.0, 500.0, c.limit());
        }
        assert_eq!(c.limit(), 1);
    }

    #[test]
    fn idle_client_slots_do_not_grow_the_limit() {
        let mut c = Controller::new(ConcurrencyMode::Auto, Some(72));
        c.observe(10.0, 0.0, 10);
        assert_eq!(c.limit(), 81);
    }

    #[test]
    fn fixed_never_moves() {
        let mut c = Controller::new(ConcurrencyMode::Fixed(32), Some(72));
        c.observe(32.0, 0.0, 32);
        assert_eq!(c.limit(), 32);
        assert!("0".parse::<ConcurrencyMode>().is_err());
        assert_eq!("auto".parse::<ConcurrencyMode>(), Ok(ConcurrencyMode::Auto));
    }
}

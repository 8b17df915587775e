//! The throughput watchdog: after warm-up, compares the live rate with the profile's measured
//! `expected:` numbers or, lacking those, with what the servers' capacity signals say is
//! possible, and names the likely cause when the run is far below it.

use serde::Serialize;

use crate::config::Expected;

/// What the servers' `/metrics` showed since warm-up, averaged over instances.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// Mean `num_running_reqs` per instance.
    pub running: f64,
    /// Share of readings with an empty server queue.
    pub queue_empty_share: f64,
    /// Mean effective max running requests per instance, when servers report it.
    pub cap: Option<f64>,
    /// Mean in-flight limit fleet allowed per instance.
    pub client_limit: f64,
    /// How many requests fit the KV cache at the observed mean sequence length.
    pub kv_fit: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Cause {
    /// Running is pinned at the server's own cap, which is well below what fits.
    ServerCap {
        running: f64,
        cap: f64,
    },
    /// The servers have free batch slots and empty queues: the client sends too little.
    ClientLimited {
        running: f64,
        cap: f64,
        client_limit: f64,
    },
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub live_tok_s_per_gpu: f64,
    /// Expected output tok/s per GPU, when the profile records it.
    pub expected_tok_s_per_gpu: Option<f64>,
    /// Live over expected (or the used share of the servers' capacity).
    pub fraction: f64,
    pub cause: Cause,
}

impl Finding {
    /// The warning a user reads: numbers, likely cause and what to try.
    pub fn message(&self) -> String {
        let head = match self.expected_tok_s_per_gpu {
            Some(e) => format!(
                "throughput is {:.0}% of expected: {:.0} output tok/s per GPU vs {:.0} measured by sweep",
                self.fraction * 100.0,
                self.live_tok_s_per_gpu,
                e
            ),
            None => format!(
                "throughput looks {:.0}% of what the servers can do ({:.0} output tok/s per GPU)",
                self.fraction * 100.0,
                self.live_tok_s_per_gpu
            ),
        };
        let cause = match &self.cause {
            Cause::ServerCap { running, cap } => format!(
                "running {running:.0}/instance, pinned at the server cap of {cap:.0}: the server cap is low; \
                 try `fleet sweep --strategies extra_buffer,no_buffer` (the mamba strategy sets the cap)"
            ),
            Cause::ClientLimited {
                running,
                cap,
                client_limit,
            } => format!(
                "running {running:.0}/instance with an empty queue while the server takes {cap:.0}: \
                 the client is too slow (in-flight limit {client_limit:.0}); use --concurrency auto"
            ),
            Cause::Unknown => {
                "cause unknown: check `fleet status` for server load and GPU use".to_string()
            }
        };
        format!("{head}; {cause}")
    }
}

/// Below this fraction the watchdog warns.
pub const WARN_BELOW: f64 = 0.5;

fn cause_of(s: &Signals, expected_cap: Option<f64>) -> Cause {
    let Some(cap) = s.cap else {
        return Cause::Unknown;
    };
    let pinned = s.running >= 0.9 * cap && s.queue_empty_share < 0.5;
    let room = [expected_cap, s.kv_fit]
        .into_iter()
        .flatten()
        .fold(0.0, f64::max);
    if pinned && room >= 1.5 * cap {
        return Cause::ServerCap {
            running: s.running,
            cap,
        };
    }
    if s.queue_empty_share > 0.9 && s.running < 0.9 * cap {
        return Cause::ClientLimited {
            running: s.running,
            cap,
            client_limit: s.client_limit,
        };
    }
    Cause::Unknown
}

/// Judges the run; `None` when it is fine or nothing can be said.
pub fn assess(
    live_tok_s_per_gpu: f64,
    expected: Option<&Expected>,
    s: &Signals,
) -> Option<Finding> {
    let expected_cap = expected.map(|e| e.max_running_requests as f64);
    let cause = cause_of(s, expected_cap);
    let (fraction, expected_tok_s_per_gpu) = match expected {
        Some(e) if e.output_tok_s_per_gpu > 0.0 => (
            live_tok_s_per_gpu / e.output_tok_s_per_gpu,
            Some(e.output_tok_s_per_gpu),
        ),
        _ => match &cause {
            // Without a measured number, the share of the concurrency that could run is the
            // best available estimate of how much throughput is left on the table.
            Cause::ServerCap { cap, .. } => {
                let room = [expected_cap, s.kv_fit]
                    .into_iter()
                    .flatten()
                    .fold(0.0, f64::max);
                (cap / room, None)
            }
            Cause::ClientLimited { running, cap, .. } => (running / cap, None),
            Cause::Unknown => return None,
        },
    };
    (fraction < WARN_BELOW).then_some(Finding {
        live_tok_s_per_gpu,
        expected_tok_s_per_gpu,
        fraction,
        cause,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(tok: f64, cap: u32) -> Expected {
        Expected {
            output_tok_s_per_gpu: tok,
            max_running_requests: cap,
        }
    }

    #[test]
    fn the_seed_run_is_flagged_as_a_server_cap() {
        // extra_buffer: 37 running, queue never empty, sweep measured 1,180 tok/s with 72.
        let s = Signals {
            running: 37.0,
            queue_empty_share: 0.0,
            cap: Some(37.0),
            client_limit: 32.0,
            kv_fit: None,
        };
        let f = assess(107.0, Some(&expected(1180.0, 72)), &s).unwrap();
        assert!(f.fraction < 0.1);
        assert_eq!(
            f.cause,
            Cause::ServerCap {
                running: 37.0,
                cap: 37.0
            }
        );
        let msg = f.message();
        assert!(msg.contains("running 37/instance"), "{msg}");
        assert!(
            msg.contains("fleet sweep --strategies extra_buffer,no_buffer"),
            "{msg}"
        );
    }

    #[test]
    fn fixed_32_against_72_is_client_limited_without_a_profile() {
        let s = Signals {
            running: 48.0,
            queue_empty_share: 1.0,
            cap: Some(72.0),
            client_limit: 48.0,
            kv_fit: None,
        };
        assert!(assess(700.0, None, &s).is_none(), "48/72 is above half");
        let s = Signals {
            running: 32.0,
            client_limit: 32.0,
            ..s
        };
        let f = assess(500.0, None, &s).unwrap();
        assert!(matches!(f.cause, Cause::ClientLimited { .. }));
        assert!(f.message().contains("client is too slow"));
    }

    #[test]
    fn kv_room_reveals_a_low_cap_without_a_profile() {
        let s = Signals {
            running: 37.0,
            queue_empty_share: 0.1,
            cap: Some(37.0),
            client_limit: 41.0,
            kv_fit: Some(120.0),
        };
        let f = assess(107.0, None, &s).unwrap();
        assert!((f.fraction - 37.0 / 120.0).abs() < 1e-9);
    }

    #[test]
    fn a_healthy_run_is_quiet() {
        let s = Signals {
            running: 72.0,
            queue_empty_share: 0.2,
            cap: Some(72.0),
            client_limit: 81.0,
            kv_fit: Some(80.0),
        };
        assert!(assess(1150.0, Some(&expected(1180.0, 72)), &s).is_none());
        assert!(assess(1150.0, None, &s).is_none());
    }
}

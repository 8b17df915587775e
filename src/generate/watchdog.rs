//! The throughput watchdog: after warm-up, compares the live rate with the profile's measured
//! `expected:` numbers or, lacking those, with what the servers' capacity signals say is
//! possible, and names the likely cause when the run is far below it. Under prefix placement
//! it also compares the share of prompt tokens the servers' radix caches served with what the
//! input's prefix plan expected ([`assess_cache`]).

use serde::Serialize;

use crate::config::Expected;

/// What the servers' `/metrics` showed since warm-up, averaged over instances.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// Mean `num_running_reqs` per instance.
    pub running: f64,
    /// Share of readings with an empty server queue.
    pub queue_empty_share: f64,
    /// Mean requests a server really runs at once: its effective max running requests, or what
    /// its KV pool holds at the observed request size when that is less (a dense model's cap
    /// is SGLang's general request cap, thousands, whatever its pool holds).
    pub cap: Option<f64>,
    /// Mean in-flight limit fleet allowed per instance.
    pub client_limit: f64,
    /// How many requests fit the KV cache at the observed mean sequence length.
    pub kv_fit: Option<f64>,
    /// `--concurrency auto` is on: fleet already follows the servers.
    pub auto: bool,
    /// The open-file limit holds fleet's in-flight limit below what the servers take.
    pub held_by_files: bool,
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
        /// What holds the client back, and so what to do about it.
        by: ClientBound,
    },
    Unknown,
    /// Prefix placement is on, and the servers' radix caches serve far less of the prompts
    /// than the prefix plan expected: the prefixes do not stay in the cache.
    LowCacheHits {
        /// Share of this run's prompt tokens served from the cache.
        observed: f64,
        /// What the plan expected over the job (each group's prefix prefilled once).
        expected: f64,
        /// The instance whose answers the cache served least, and its share.
        worst: Option<(String, f64)>,
    },
}

/// What keeps fleet's in-flight limit low.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientBound {
    /// A fixed `--concurrency`: `auto` would follow the servers.
    FixedConcurrency,
    /// The process's open-file limit leaves no room for more sockets.
    OpenFiles,
}

impl Cause {
    /// Whether two findings say the same thing: the numbers in a cause move with every
    /// reading, and a warning is said again only when what it says changes.
    pub fn same_finding(&self, other: &Cause) -> bool {
        match (self, other) {
            (Cause::ServerCap { .. }, Cause::ServerCap { .. }) => true,
            (Cause::ClientLimited { by: a, .. }, Cause::ClientLimited { by: b, .. }) => a == b,
            (Cause::Unknown, Cause::Unknown) => true,
            (Cause::LowCacheHits { .. }, Cause::LowCacheHits { .. }) => true,
            _ => false,
        }
    }
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
        if let Cause::LowCacheHits {
            observed,
            expected,
            worst,
        } = &self.cause
        {
            let worst = worst.as_ref().map_or(String::new(), |(name, f)| {
                format!(" (least on {name}: {:.0}%)", f * 100.0)
            });
            return format!(
                "the servers' radix caches served {:.0}% of prompt tokens where the prefix plan \
                 expected {:.0}%{worst}: the shared prefixes do not stay cached; check that the \
                 servers run without --disable-radix-cache and that a group's prefix and its \
                 batch fit the KV pool (max_total_num_tokens), and `fleet progress` for each \
                 instance's cached fraction",
                observed * 100.0,
                expected * 100.0
            );
        }
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
                by: ClientBound::FixedConcurrency,
            } => format!(
                "running {running:.0}/instance with an empty queue while the server takes {cap:.0}: \
                 the client is too slow (in-flight limit {client_limit:.0}); use --concurrency auto"
            ),
            Cause::ClientLimited {
                running,
                cap,
                client_limit,
                by: ClientBound::OpenFiles,
            } => format!(
                "running {running:.0}/instance with an empty queue while the server takes {cap:.0}: \
                 fleet's in-flight limit ({client_limit:.0}) is held by the open-file limit; \
                 raise the hard limit (`ulimit -Hn`, or LimitNOFILE= in a unit) and run again"
            ),
            Cause::Unknown => {
                "cause unknown: check `fleet status` for server load and GPU use".to_string()
            }
            Cause::LowCacheHits { .. } => unreachable!("said above"),
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
    // What the servers really run: a cap above what the KV pool holds is never reached.
    let runs = s.kv_fit.map_or(cap, |k| cap.min(k));
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
    if s.queue_empty_share > 0.9 && s.running < 0.9 * runs {
        // Under auto, only the open-file limit holds fleet back; otherwise auto is still
        // finding the level, and there is nothing to advise.
        let by = match (s.auto, s.held_by_files) {
            (_, true) => ClientBound::OpenFiles,
            (false, false) => ClientBound::FixedConcurrency,
            (true, false) => return Cause::Unknown,
        };
        return Cause::ClientLimited {
            running: s.running,
            cap: runs,
            client_limit: s.client_limit,
            by,
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
            Cause::Unknown | Cause::LowCacheHits { .. } => return None,
        },
    };
    (fraction < WARN_BELOW).then_some(Finding {
        live_tok_s_per_gpu,
        expected_tok_s_per_gpu,
        fraction,
        cause,
    })
}

/// Below this share of the expected cached fraction the watchdog warns.
pub const CACHE_WARN_BELOW: f64 = 0.5;
/// Answered prompt tokens, as a multiple of the prefixes' own, before the cache is judged:
/// each group's first prefill is a miss, and must weigh at most a quarter by then.
pub const CACHE_JUDGE_AFTER: u64 = 4;

/// What the caches served in this run, against the prefix plan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheSignals {
    /// The plan's expected cached fraction of the job's prompt tokens.
    pub expected: f64,
    /// Estimated tokens of every group's shared prefix, each once: what even a perfect cache
    /// prefills.
    pub prefix_tokens: u64,
    /// The answers' prompt tokens so far (`usage.prompt_tokens`), and of them served from the
    /// cache (`meta_info.cached_tokens`).
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The instance whose answers the cache served least, and its share.
    pub worst: Option<(String, f64)>,
}

/// Judges the cache under prefix placement: a finding when, once enough prompt tokens were
/// answered for each group's first prefill to weigh little, the cache served less than
/// [`CACHE_WARN_BELOW`] of what the plan expected. `live_tok_s_per_gpu` is carried into the
/// finding as is.
pub fn assess_cache(live_tok_s_per_gpu: f64, s: &CacheSignals) -> Option<Finding> {
    if s.expected <= 0.0
        || s.prompt_tokens == 0
        || s.prompt_tokens < CACHE_JUDGE_AFTER * s.prefix_tokens.max(1)
    {
        return None;
    }
    let observed = s.cached_tokens as f64 / s.prompt_tokens as f64;
    let fraction = observed / s.expected;
    (fraction < CACHE_WARN_BELOW).then(|| Finding {
        live_tok_s_per_gpu,
        expected_tok_s_per_gpu: None,
        fraction,
        cause: Cause::LowCacheHits {
            observed,
            expected: s.expected,
            worst: s.worst.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_that_serves_far_less_than_the_plan_expected_is_flagged() {
        let s = CacheSignals {
            expected: 0.96,
            prefix_tokens: 40_000,
            prompt_tokens: 400_000,
            cached_tokens: 68_000,
            worst: Some(("s3".into(), 0.05)),
        };
        let f = assess_cache(100.0, &s).unwrap();
        assert!(matches!(f.cause, Cause::LowCacheHits { .. }));
        assert!((f.fraction - 0.17 / 0.96).abs() < 1e-9);
        let msg = f.message();
        assert!(msg.contains("served 17% of prompt tokens"), "{msg}");
        assert!(msg.contains("expected 96%"), "{msg}");
        assert!(msg.contains("least on s3: 5%"), "{msg}");
        assert!(msg.contains("--disable-radix-cache"), "{msg}");
        // What the plan expected, near enough: quiet.
        let good = CacheSignals {
            cached_tokens: 370_000,
            ..s.clone()
        };
        assert!(assess_cache(100.0, &good).is_none());
        // Half of what it expected is the line.
        let half = CacheSignals {
            cached_tokens: 193_000,
            ..s.clone()
        };
        assert!(assess_cache(100.0, &half).is_none());
    }

    #[test]
    fn the_cache_is_not_judged_before_the_first_prefills_weigh_little_nor_without_a_plan() {
        let early = CacheSignals {
            expected: 0.96,
            prefix_tokens: 40_000,
            prompt_tokens: 159_000,
            cached_tokens: 0,
            worst: None,
        };
        assert!(assess_cache(100.0, &early).is_none());
        let later = CacheSignals {
            prompt_tokens: 160_000,
            ..early.clone()
        };
        assert!(assess_cache(100.0, &later).is_some());
        let no_plan = CacheSignals {
            expected: 0.0,
            ..later
        };
        assert!(assess_cache(100.0, &no_plan).is_none());
    }

    fn expected(tok: f64, cap: u32) -> Expected {
        Expected {
            output_tok_s_per_gpu: tok,
            max_running_requests: cap,
            output_tokens: None,
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
            auto: false,
            held_by_files: false,
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
            auto: false,
            held_by_files: false,
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
            auto: false,
            held_by_files: false,
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
            auto: false,
            held_by_files: false,
        };
        assert!(assess(1150.0, Some(&expected(1180.0, 72)), &s).is_none());
        assert!(assess(1150.0, None, &s).is_none());
    }

    /// The dense model: cap 4096, ~300 fit the pool, fleet at auto ran ~300.
    fn dense(running: f64, auto: bool, held_by_files: bool) -> Signals {
        Signals {
            running,
            queue_empty_share: 1.0,
            cap: Some(4096.0),
            client_limit: running + 40.0,
            kv_fit: Some(315.0),
            auto,
            held_by_files,
        }
    }

    #[test]
    fn a_dense_server_full_by_its_kv_pool_is_not_called_client_limited() {
        // 300 running of 4096 is 7% of the cap, but all the pool holds.
        assert!(assess(2500.0, None, &dense(300.0, true, false)).is_none());
        assert!(assess(2500.0, None, &dense(300.0, false, false)).is_none());
    }

    #[test]
    fn auto_is_never_advised_to_a_run_that_uses_it() {
        assert!(assess(250.0, None, &dense(100.0, true, false)).is_none());
        let fixed = assess(250.0, None, &dense(100.0, false, false)).unwrap();
        assert!(fixed.message().contains("use --concurrency auto"));
        let files = assess(250.0, None, &dense(100.0, true, true)).unwrap();
        let msg = files.message();
        assert!(!msg.contains("--concurrency auto"), "{msg}");
        assert!(msg.contains("open-file limit"), "{msg}");
        assert!((files.fraction - 100.0 / 315.0).abs() < 1e-9);
    }

    #[test]
    fn a_finding_with_new_numbers_is_the_same_finding() {
        let a = assess(250.0, None, &dense(100.0, false, false)).unwrap();
        let b = assess(260.0, None, &dense(101.0, false, false)).unwrap();
        assert_ne!(a.cause, b.cause);
        assert!(a.cause.same_finding(&b.cause));
        let c = assess(250.0, None, &dense(100.0, true, true)).unwrap();
        assert!(!a.cause.same_finding(&c.cause));
    }
}

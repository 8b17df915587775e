//! One instance's `/metrics` readings since the warm-up, as the watchdog's judgement sums them.

/// One instance's `/metrics` readings since the warm-up.
#[derive(Debug, Default)]
pub(super) struct SignalAcc {
    pub(super) readings: u64,
    pub(super) running: f64,
    pub(super) queue_empty: u64,
    /// Sum and count of `sglang:gen_throughput` readings: the decode rate as the batch runs.
    pub(super) gen_tok_s: f64,
    pub(super) gen_readings: u64,
}

impl SignalAcc {
    pub fn add(&mut self, running: f64, queued: f64, gen_throughput: Option<f64>) {
        self.readings += 1;
        self.running += running;
        self.queue_empty += u64::from(queued < 1.0);
        if let Some(g) = gen_throughput {
            self.gen_tok_s += g;
            self.gen_readings += 1;
        }
    }
}

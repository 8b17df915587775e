//! The prefix bench's hidden sims and job, drawn from a seed so that no one scenario is what
//! placement gets tuned to: the system prompts' length, the questions' length, how many system
//! prompts a server's KV pool holds, how skewed the groups' sizes are, and each server's speed
//! and running-request cap. Also the job placed by hand over the same draw: what a careful person
//! who knows the group sizes and the server speeds would give each server.

use serde_json::json;

pub const SYSTEMS: usize = 40;
pub const SERVERS: usize = 8;

/// One draw of the hidden parameters, and the job it makes.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    /// Sim tokens of each system prompt (the shared prefix).
    pub prefix_tokens: usize,
    /// Sim tokens of each question after it.
    pub question_tokens: usize,
    /// System prompts a server's KV pool holds besides its running requests.
    pub cache_prefixes: usize,
    /// Group `g` has a size in proportion to `1 / (g + 1)^skew`.
    pub skew: f64,
    /// Each server's speed (1.0: a ~1,000-token prefill miss costs 20 ms, a decode step 10 ms).
    pub speeds: Vec<f64>,
    /// Each server's `--max-running-requests`.
    pub caps: Vec<u32>,
    /// Prompts of each group.
    pub sizes: Vec<usize>,
}

/// xorshift64: the bench's only source of chance, so a seed names the whole scenario.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

impl Scenario {
    /// The scenario of `seed`, `n` prompts in all.
    pub fn draw(seed: u64, n: usize) -> Scenario {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        for _ in 0..8 {
            r.next();
        }
        let prefix_tokens = r.range(300.0, 2000.0) as usize;
        let question_tokens = r.range(5.0, 120.0) as usize;
        let cache_prefixes = r.range(2.0, 11.0) as usize;
        let skew = r.range(0.0, 1.0);
        let speeds = (0..SERVERS).map(|_| r.range(0.6, 1.4)).collect();
        let caps = (0..SERVERS).map(|_| r.range(8.0, 33.0) as u32).collect();
        let weights: Vec<f64> = (0..SYSTEMS)
            .map(|g| 1.0 / ((g + 1) as f64).powf(skew))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut sizes: Vec<usize> = weights
            .iter()
            .map(|w| ((n as f64) * w / total).floor().max(1.0) as usize)
            .collect();
        let short = n.saturating_sub(sizes.iter().sum());
        sizes[0] += short;
        Scenario {
            seed,
            prefix_tokens,
            question_tokens,
            cache_prefixes,
            skew,
            speeds,
            caps,
            sizes,
        }
    }

    pub fn prompts(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// One line per prompt, `(group, line)`, in a shuffled order.
    pub fn lines(&self) -> Vec<(usize, String)> {
        let heads: Vec<String> = (0..SYSTEMS)
            .map(|g| {
                filler(
                    &format!("System prompt {g}. "),
                    g as u64,
                    self.prefix_tokens,
                )
            })
            .collect();
        let mut out = Vec::with_capacity(self.prompts());
        for (g, &size) in self.sizes.iter().enumerate() {
            for q in 0..size {
                let question = filler(
                    &format!("Question {q}: "),
                    (g * 1_000_003 + q) as u64,
                    self.question_tokens,
                );
                let prompt = format!("{}\n{question}why?", heads[g]);
                let id = format!("p{}", out.len());
                out.push((g, json!({"id": id, "prompt": prompt}).to_string()));
            }
        }
        let mut r = Rng(self.seed.wrapping_mul(0xd6e8_feb8_6659_fd93) | 1);
        for i in (1..out.len()).rev() {
            out.swap(i, (r.next() % (i as u64 + 1)) as usize);
        }
        out
    }

    /// The `sglang-sim` flags of server `k`.
    pub fn sim_args(&self, k: usize) -> Vec<String> {
        let speed = self.speeds[k];
        let cap = self.caps[k];
        let pool =
            self.cache_prefixes * self.prefix_tokens + cap as usize * (self.question_tokens + 16);
        [
            "--sim-dense",
            "--max-total-tokens",
            &pool.to_string(),
            "--max-running-requests",
            &cap.to_string(),
            "--sim-prefill-base-ms",
            "1",
            "--sim-prefill-per-token-ms",
            &format!("{:.4}", 0.02 / speed),
            "--sim-decode-base-ms",
            &format!("{:.3}", 10.0 / speed),
            "--sim-decode-per-req-ms",
            "0.01",
            "--sim-mean-output-tokens",
            "4",
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// Prompts of each group each server gets when placed by hand: each server a share of the
    /// prompts in proportion to its speed, groups dealt whole, largest first, to the server with
    /// the most share left, and a group split only where it is larger than that.
    pub fn hand_split(&self) -> Vec<Vec<(usize, usize)>> {
        let speed: f64 = self.speeds.iter().sum();
        let n = self.prompts() as f64;
        let mut left: Vec<f64> = self.speeds.iter().map(|s| n * s / speed).collect();
        let mut order: Vec<usize> = (0..SYSTEMS).collect();
        order.sort_by_key(|&g| std::cmp::Reverse(self.sizes[g]));
        let mut split = vec![Vec::new(); SERVERS];
        for g in order {
            let mut size = self.sizes[g];
            while size > 0 {
                let k = (0..SERVERS)
                    .max_by(|&a, &b| left[a].total_cmp(&left[b]))
                    .unwrap();
                let take = if (size as f64) <= left[k] + 0.5 {
                    size
                } else {
                    (left[k].round() as usize).clamp(1, size)
                };
                split[k].push((g, take));
                left[k] -= take as f64;
                size -= take;
            }
        }
        split
    }

    /// The lines server `k` gets when placed by hand, in the shuffled order.
    pub fn hand_placed(&self, lines: &[(usize, String)], k: usize) -> Vec<String> {
        let split = self.hand_split();
        // Group g's prompts go to its servers in turn, by the shares the split gave them.
        let mut quota: Vec<Vec<(usize, usize)>> = vec![Vec::new(); SYSTEMS];
        for (server, parts) in split.iter().enumerate() {
            for &(g, take) in parts {
                quota[g].push((server, take));
            }
        }
        let mut out = Vec::new();
        for (g, line) in lines {
            let Some((server, take)) = quota[*g].last_mut() else {
                continue;
            };
            if *server == k {
                out.push(line.clone());
            }
            *take -= 1;
            if *take == 0 {
                quota[*g].pop();
            }
        }
        out
    }

    /// The draw in a line, for the bench's output.
    pub fn describe(&self) -> String {
        let (lo, hi) = self
            .speeds
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &s| (l.min(s), h.max(s)));
        format!(
            "seed {}: prefix {} tok, question {} tok, pool holds {} prefixes, skew {:.2} \
             (groups {}..{}), speeds {lo:.2}..{hi:.2}, caps {}..{}",
            self.seed,
            self.prefix_tokens,
            self.question_tokens,
            self.cache_prefixes,
            self.skew,
            self.sizes.iter().min().unwrap(),
            self.sizes.iter().max().unwrap(),
            self.caps.iter().min().unwrap(),
            self.caps.iter().max().unwrap(),
        )
    }
}

/// `head` then words drawn from `seed` until about `tokens` sim tokens (4 bytes each).
fn filler(head: &str, seed: u64, tokens: usize) -> String {
    let mut out = head.to_string();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while out.len() < tokens * 4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(["alpha ", "beta ", "gamma ", "delta ", "omega "][(x % 5) as usize]);
    }
    out
}

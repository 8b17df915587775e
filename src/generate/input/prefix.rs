//! The dataset's prefix structure, found offline before any request: which prompts share
//! leading content worth keeping on one server, how big each group is, and what share of the
//! prompt tokens a radix cache could serve if each group's prefix were prefilled once.
//!
//! A prompt is read as the bytes the server's cache keys on as far as fleet can know them: a
//! `/generate` or completions text as is, chat messages as role and content in order (fleet does
//! not know the chat template, so the leading messages stand for it). The bytes are cut into
//! [`BLOCK`]-byte blocks, each named by the hash of the whole prefix up to its end, so two
//! prompts share a block hash exactly when they share that many leading bytes.
//!
//! Memory is bounded and time linear, whatever the file: whole prompts are never kept, only
//! block hashes and a count each. The first pass ([`Learner`]) counts the blocks every prompt
//! shares with those before it, and inserts at most one new block for a prompt that shares
//! nothing (its first), so the table grows by at most one entry a prompt plus a fixed pool of
//! [`POOL`] for prompts that extend a shared prefix; blocks seen once are dropped after it. The
//! second pass ([`Prefixes::group_of`]) names each prompt's group: its deepest block still shared,
//! when that is at least [`MIN_SHARED`] bytes in. A long shared prefix is learned a pool's worth
//! of blocks at a time, so a prefix shared by a few prompts only may be found shorter than it is.

use std::path::Path;
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde::Serialize;
use serde_json::Value;

use super::{InputError, Reader, prompt_line};
use crate::generate::PlacementMode;
use crate::sglang::client::Prompt;

/// Bytes per block: about 16 tokens at ~4 bytes a token.
pub const BLOCK: usize = 64;
/// A group's prompts share at least this many leading bytes (~64 tokens): shorter shared heads
/// (a common instruction word, a role name) are not worth a server.
pub const MIN_SHARED: usize = 256;
/// Blocks read of a prompt at most: a prefix longer than this counts as this long.
pub const MAX_BLOCKS: usize = 1024;
/// New blocks the first pass may insert beyond one a prompt.
pub const POOL: usize = 1 << 16;
/// Bytes a token takes, for estimates (the sim's tokenizer; real ones are near it for English).
pub const BYTES_PER_TOKEN: u64 = 4;

/// A group as a prompt names it: the hash of its shared prefix, and how long that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupKey {
    pub hash: u64,
    pub blocks: u32,
}

/// The prefix hashes of a prompt's blocks, in order, as many as [`MAX_BLOCKS`].
pub fn block_hashes(prompt: &Prompt, out: &mut Vec<u64>) {
    out.clear();
    let mut b = Blocks {
        out,
        buf: [0; BLOCK],
        len: 0,
        hash: 0xcbf2_9ce4_8422_2325,
    };
    match prompt {
        Prompt::Text(t) => b.feed(t.as_bytes()),
        Prompt::Messages(Value::Array(msgs)) => {
            for m in msgs {
                if b.full() {
                    break;
                }
                b.feed(
                    m.get("role")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .as_bytes(),
                );
                b.feed(&[0x1f]);
                match m.get("content") {
                    Some(Value::String(s)) => b.feed(s.as_bytes()),
                    Some(Value::Array(parts)) => {
                        for p in parts {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                b.feed(t.as_bytes());
                            }
                        }
                    }
                    _ => {}
                }
                b.feed(&[0x1e]);
            }
        }
        Prompt::Messages(_) => {}
    }
}

/// The prompt's length in bytes as [`block_hashes`] reads it, capped there too.
pub fn prompt_bytes(prompt: &Prompt) -> u64 {
    match prompt {
        Prompt::Text(t) => t.len() as u64,
        Prompt::Messages(Value::Array(msgs)) => msgs
            .iter()
            .map(|m| {
                let content = match m.get("content") {
                    Some(Value::String(s)) => s.len(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .map(str::len)
                        .sum(),
                    _ => 0,
                };
                (content + m.get("role").and_then(Value::as_str).map_or(0, str::len) + 2) as u64
            })
            .sum(),
        Prompt::Messages(_) => 0,
    }
}

struct Blocks<'a> {
    out: &'a mut Vec<u64>,
    buf: [u8; BLOCK],
    len: usize,
    hash: u64,
}

impl Blocks<'_> {
    fn full(&self) -> bool {
        self.out.len() >= MAX_BLOCKS
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.full() {
            let n = (BLOCK - self.len).min(bytes.len());
            self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
            if self.len == BLOCK {
                // FNV-1a over the block, chained: the hash names the whole prefix.
                self.hash = self.buf.iter().fold(self.hash, |h, b| {
                    (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
                });
                self.out.push(self.hash);
                self.len = 0;
            }
        }
    }
}

/// The first pass: counts shared blocks, in bounded memory.
#[derive(Debug)]
pub struct Learner {
    counts: FxHashMap<u64, u32>,
    pool: usize,
}

impl Default for Learner {
    fn default() -> Self {
        Learner {
            counts: FxHashMap::default(),
            pool: POOL,
        }
    }
}

impl Learner {
    /// Counts one prompt's blocks.
    pub fn prompt(&mut self, blocks: &[u64]) {
        let mut shared = false;
        for h in blocks {
            match self.counts.get_mut(h) {
                Some(c) => {
                    *c = c.saturating_add(1);
                    shared = true;
                }
                None if !shared => {
                    // A prompt that shares nothing yet pays for its first block only.
                    self.counts.insert(*h, 1);
                    return;
                }
                None if self.pool > 0 => {
                    self.pool -= 1;
                    self.counts.insert(*h, 1);
                }
                None => return,
            }
        }
    }

    /// The table for the second pass: only blocks that more than one prompt holds.
    pub fn finish(mut self) -> Prefixes {
        self.counts.retain(|_, c| *c >= 2);
        self.counts.shrink_to_fit();
        Prefixes {
            shared: self.counts,
        }
    }
}

/// The blocks more than one prompt shares.
#[derive(Debug, Default, Clone)]
pub struct Prefixes {
    shared: FxHashMap<u64, u32>,
}

impl Prefixes {
    /// The group a prompt belongs to: its deepest shared block, when at least [`MIN_SHARED`]
    /// bytes in; `None` for a prompt that shares no prefix worth a server.
    pub fn group_of(&self, blocks: &[u64]) -> Option<GroupKey> {
        let depth = blocks
            .iter()
            .take_while(|h| self.shared.contains_key(h))
            .count();
        (depth * BLOCK >= MIN_SHARED).then(|| GroupKey {
            hash: blocks[depth - 1],
            blocks: depth as u32,
        })
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.shared.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shared.is_empty()
    }
}

/// A group as the plan counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GroupStats {
    pub prompts: u64,
    /// Shared prefix, in estimated tokens.
    pub shared_tokens: u64,
    /// Estimated prompt tokens of all its prompts, and output tokens they may ask for.
    pub prompt_tokens: u64,
    pub max_tokens: u64,
}

impl GroupStats {
    /// Its work for balancing: prompt plus expected output tokens, the shared prefix counted
    /// once.
    pub fn work(&self) -> u64 {
        let prefill = self
            .prompt_tokens
            .saturating_sub(self.shared_tokens * self.prompts.saturating_sub(1));
        prefill + self.max_tokens
    }
}

/// The second pass's findings.
#[derive(Debug, Clone, Default)]
pub struct PrefixPlan {
    pub prefixes: Prefixes,
    pub groups: FxHashMap<GroupKey, GroupStats>,
    /// Prompts in no group.
    pub ungrouped: GroupStats,
}

impl PrefixPlan {
    /// Counts one prompt in the plan.
    pub fn prompt(&mut self, blocks: &[u64], prompt_bytes: u64, max_tokens: u64) {
        let tokens = prompt_bytes.div_ceil(BYTES_PER_TOKEN);
        let stats = match self.prefixes.group_of(blocks) {
            Some(k) => {
                let g = self.groups.entry(k).or_default();
                g.shared_tokens = (u64::from(k.blocks) * BLOCK as u64).div_ceil(BYTES_PER_TOKEN);
                g
            }
            None => &mut self.ungrouped,
        };
        stats.prompts += 1;
        stats.prompt_tokens += tokens;
        stats.max_tokens += max_tokens;
    }

    pub fn prompts(&self) -> u64 {
        self.ungrouped.prompts + self.groups.values().map(|g| g.prompts).sum::<u64>()
    }

    /// Prompt tokens a radix cache serves when every group's prefix is prefilled once.
    pub fn shareable_tokens(&self) -> u64 {
        self.groups
            .values()
            .map(|g| g.shared_tokens * g.prompts.saturating_sub(1))
            .sum()
    }

    pub fn prompt_tokens(&self) -> u64 {
        self.ungrouped.prompt_tokens + self.groups.values().map(|g| g.prompt_tokens).sum::<u64>()
    }

    /// The share of prompt tokens a cache could serve.
    pub fn expected_cached_fraction(&self) -> f64 {
        self.shareable_tokens() as f64 / self.prompt_tokens().max(1) as f64
    }

    /// Whether prefix placement is worth it: groups of more than one prompt that could serve at
    /// least a fifth of the prompt tokens from the cache.
    pub fn worth_it(&self) -> bool {
        self.groups.values().any(|g| g.prompts > 1) && self.expected_cached_fraction() >= 0.2
    }
}

/// Both passes over the prompt file (up to `limit` lines); `max_tokens` is what a line that
/// names none asks for.
pub fn scan(path: &Path, limit: Option<u64>, max_tokens: u32) -> Result<PrefixPlan, InputError> {
    let mut reader = Reader::open(path, limit)?;
    let mut blocks = Vec::with_capacity(MAX_BLOCKS);
    let mut learner = Learner::default();
    while let Some((_, bytes)) = reader.next_raw()? {
        if let Some(p) = prompt_line(bytes) {
            block_hashes(&p.prompt, &mut blocks);
            learner.prompt(&blocks);
        }
    }
    let mut plan = PrefixPlan {
        prefixes: learner.finish(),
        ..PrefixPlan::default()
    };
    reader.rewind()?;
    while let Some((_, bytes)) = reader.next_raw()? {
        if let Some(p) = prompt_line(bytes) {
            block_hashes(&p.prompt, &mut blocks);
            let max = p.max_tokens.unwrap_or(max_tokens);
            plan.prompt(&blocks, prompt_bytes(&p.prompt), u64::from(max));
        }
    }
    Ok(plan)
}

/// What `fleet generate --dry-run` shows of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The placement the job would use: `prefix` or `least-loaded`.
    pub placement: &'static str,
    pub prompts: u64,
    pub groups: u64,
    pub grouped_prompts: u64,
    pub prompt_tokens: u64,
    /// Prompt tokens a radix cache serves when each group's prefix is prefilled once.
    pub shareable_tokens: u64,
    pub expected_cached_fraction: f64,
    /// The largest groups, by work.
    pub largest: Vec<GroupStats>,
    pub scan_seconds: f64,
}

/// Groups the report lists.
const LISTED: usize = 10;

impl Report {
    pub fn of(plan: &PrefixPlan, mode: PlacementMode, took: Duration) -> Report {
        let prefix = match mode {
            PlacementMode::Prefix => true,
            PlacementMode::LeastLoaded => false,
            PlacementMode::Auto => plan.worth_it(),
        };
        let mut largest: Vec<GroupStats> = plan.groups.values().copied().collect();
        largest.sort_by(|a, b| b.work().cmp(&a.work()).then(b.prompts.cmp(&a.prompts)));
        largest.truncate(LISTED);
        Report {
            placement: if prefix { "prefix" } else { "least-loaded" },
            prompts: plan.prompts(),
            groups: plan.groups.len() as u64,
            grouped_prompts: plan.prompts() - plan.ungrouped.prompts,
            prompt_tokens: plan.prompt_tokens(),
            shareable_tokens: plan.shareable_tokens(),
            expected_cached_fraction: (plan.expected_cached_fraction() * 1000.0).round() / 1000.0,
            largest,
            scan_seconds: (took.as_secs_f64() * 1000.0).round() / 1000.0,
        }
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "prompts      {} ({} est. prompt tokens), scanned in {:.2} s\n\
             groups       {} sharing a prefix of at least {} tokens, holding {} prompts\n\
             cacheable    {} prompt tokens ({:.0}%) when each group's prefix is prefilled once\n\
             placement    {}\n",
            self.prompts,
            self.prompt_tokens,
            self.scan_seconds,
            self.groups,
            MIN_SHARED as u64 / BYTES_PER_TOKEN,
            self.grouped_prompts,
            self.shareable_tokens,
            self.expected_cached_fraction * 100.0,
            self.placement,
        );
        if !self.largest.is_empty() {
            out.push_str(&format!(
                "\n{:>8} {:>14} {:>14}\n",
                "prompts", "shared tokens", "work tokens"
            ));
            for g in &self.largest {
                out.push_str(&format!(
                    "{:>8} {:>14} {:>14}\n",
                    g.prompts,
                    g.shared_tokens,
                    g.work()
                ));
            }
        }
        out.trim_end().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(text: &str) -> Vec<u64> {
        let mut v = Vec::new();
        block_hashes(&Prompt::Text(text.into()), &mut v);
        v
    }

    fn plan(prompts: &[String]) -> PrefixPlan {
        let mut l = Learner::default();
        for p in prompts {
            l.prompt(&blocks(p));
        }
        let mut plan = PrefixPlan {
            prefixes: l.finish(),
            ..PrefixPlan::default()
        };
        for p in prompts {
            plan.prompt(&blocks(p), p.len() as u64, 10);
        }
        plan
    }

    #[test]
    fn prompts_sharing_a_long_system_prompt_form_one_group_each() {
        let sys: Vec<String> = (0..3).map(|s| format!("{s}").repeat(1000)).collect();
        let mut prompts = Vec::new();
        for q in 0..50 {
            for s in &sys {
                prompts.push(format!("{s} question {q}?"));
            }
        }
        prompts.push("a prompt that shares nothing with the rest".repeat(10));
        let p = plan(&prompts);
        assert_eq!(p.groups.len(), 3);
        for g in p.groups.values() {
            assert_eq!(g.prompts, 50);
            // 1000 bytes shared: 15 whole blocks of 64, found in full within 50 prompts.
            assert_eq!(g.shared_tokens, (15 * 64) / 4);
        }
        assert_eq!(p.ungrouped.prompts, 1);
        assert!(p.expected_cached_fraction() > 0.9);
        assert!(p.worth_it());
    }

    #[test]
    fn unrelated_prompts_and_short_shared_heads_make_no_group() {
        let prompts: Vec<String> = (0..200)
            .map(|i| {
                format!(
                    "Answer briefly: what is {i} times {}? {}",
                    i * 7,
                    "x".repeat(i)
                )
            })
            .collect();
        let p = plan(&prompts);
        assert!(p.groups.is_empty(), "{:?}", p.groups);
        assert!(!p.worth_it());
        // A prompt that shares nothing costs one entry, dropped after the first pass.
        assert!(p.prefixes.is_empty());
    }

    #[test]
    fn chat_prompts_group_by_their_leading_messages() {
        let sys = "You are a careful grader. ".repeat(40);
        let chat = |q: &str| {
            Prompt::Messages(serde_json::json!([
                {"role": "system", "content": sys},
                {"role": "user", "content": q},
            ]))
        };
        let mut l = Learner::default();
        let mut v = Vec::new();
        for q in ["a", "b", "c", "d"] {
            block_hashes(&chat(q), &mut v);
            l.prompt(&v);
        }
        let pre = l.finish();
        block_hashes(&chat("a"), &mut v);
        let a = pre.group_of(&v);
        block_hashes(&chat("zzz"), &mut v);
        assert!(a.is_some());
        assert_eq!(a, pre.group_of(&v));
    }

    #[test]
    fn the_table_grows_by_at_most_one_entry_a_prompt_beyond_the_pool() {
        let mut l = Learner::default();
        for i in 0..10_000u64 {
            l.prompt(&blocks(&format!("{i:08}").repeat(100)));
        }
        assert!(l.counts.len() <= 10_000);
    }
}

//! What the radix cache (on unless `--disable-radix-cache`) saves a prompt seen before: all its
//! tokens but the last come from the cache (srt/mem_cache/radix_cache.py `match_prefix`; the
//! scheduler always computes at least the last token, srt/managers/schedule_batch.py
//! `init_next_round_input`), reported as `meta_info.cached_tokens` and counted in
//! `sglang:cached_tokens_total` (srt/observability/metrics_collector.py, by `cache_source`).
//! The sim has no real tokens, so only whole repeats match, never a shared prefix; it reports
//! the saving and does not shorten the prefill.

use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct RadixCache {
    disabled: bool,
    seen: Mutex<HashSet<u64>>,
}

impl RadixCache {
    pub fn new(disabled: bool) -> RadixCache {
        RadixCache {
            disabled,
            ..RadixCache::default()
        }
    }

    /// The tokens of a prompt (by its hash) served from the cache; the prompt is cached after.
    pub fn lookup(&self, prompt_hash: u64, prompt_tokens: u64) -> u64 {
        if self.disabled {
            return 0;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(prompt_hash) {
            0
        } else {
            prompt_tokens.saturating_sub(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_is_served_but_its_last_token_and_only_with_the_cache_on() {
        let on = RadixCache::new(false);
        assert_eq!(on.lookup(7, 6), 0);
        assert_eq!(on.lookup(8, 6), 0);
        // What 0.5.23 answered for a 6-token prompt sent twice: cached_tokens 5.
        assert_eq!(on.lookup(7, 6), 5);
        let off = RadixCache::new(true);
        assert_eq!((off.lookup(7, 6), off.lookup(7, 6)), (0, 0));
    }
}

//! The radix cache (on unless `--disable-radix-cache`): a prompt's leading tokens that an
//! earlier prompt already put in the tree are served from it, as srt/mem_cache/radix_cache.py
//! does.
//!
//! - `match_prefix` walks the tree from the root, a page (`--page-size`, 1 unless set) at a
//!   time; a partial last page never matches (radix_cache.py `key_match_paged`, which aligns
//!   to `page_size`).
//! - At least the last prompt token is computed (srt/managers/schedule_batch.py
//!   `init_next_round_input` keeps one token out of the match), so a repeat reports
//!   `prompt_tokens - 1` cached.
//! - The prompt is inserted after its match, as `cache_unfinished_req` does once it is
//!   prefilled.
//! - The tree is bounded by the KV pool (`max_total_num_tokens`); beyond it the least recently
//!   used leaves go first (radix_cache.py `evict`: a heap of leaves by `last_access_time`).
//!   Here every node on a matched or inserted path is stamped from the leaf up, so a parent is
//!   always newer than its children and the oldest stamp is always a leaf. The sim does not
//!   take the running requests' own pages out of the tree's budget.
//! - Matches count in `meta_info.cached_tokens` and `sglang:cached_tokens_total`
//!   (srt/observability/metrics_collector.py, by `cache_source`); the scheduler prefills only
//!   the uncached tokens (srt/managers/schedule_policy.py `PrefillAdder` counts
//!   `extend_input_len`, the prompt less its prefix).
//!
//! The sim's tokens are ids that [`super::text`] derives from the prompt's characters, so two
//! prompts share cached tokens exactly where their texts share leading tokens.

use std::collections::BTreeMap;
use std::sync::Mutex;

use rustc_hash::FxHashMap;

/// One page of the tree, named by the hash of the whole path to it.
#[derive(Debug)]
struct Node {
    /// Only the tests read it: they check that eviction never leaves an orphan.
    #[cfg_attr(not(test), allow(dead_code))]
    parent: Option<u64>,
    stamp: u64,
}

#[derive(Debug, Default)]
struct Tree {
    nodes: FxHashMap<u64, Node>,
    /// Every node by its last access: the first is the least recently used leaf.
    lru: BTreeMap<u64, u64>,
    clock: u64,
}

#[derive(Debug, Default)]
pub struct RadixCache {
    disabled: bool,
    page_size: u64,
    tree: Mutex<Tree>,
}

impl RadixCache {
    pub fn new(disabled: bool, page_size: Option<u64>) -> RadixCache {
        RadixCache {
            disabled,
            page_size: page_size.unwrap_or(1).max(1),
            tree: Mutex::default(),
        }
    }

    /// The tokens of a prompt served from the cache; the prompt is in the tree after, within a
    /// tree of at most `capacity` tokens.
    pub fn lookup(&self, tokens: &[u64], capacity: u64) -> u64 {
        if self.disabled || tokens.is_empty() {
            return 0;
        }
        let page = self.page_size as usize;
        let max_nodes = (capacity / self.page_size).max(1) as usize;
        let mut tree = self.tree.lock().unwrap_or_else(|e| e.into_inner());
        let mut path: Vec<u64> = Vec::with_capacity(tokens.len() / page);
        let mut key = 0xcbf2_9ce4_8422_2325u64;
        let mut matched = 0u64;
        let mut matching = true;
        for chunk in tokens.chunks_exact(page) {
            key = chunk.iter().fold(key, |h, t| super::text::mix(h ^ *t));
            let parent = path.last().copied();
            match tree.nodes.entry(key) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    if matching {
                        matched += self.page_size;
                    }
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    matching = false;
                    v.insert(Node { parent, stamp: 0 });
                }
            }
            path.push(key);
        }
        let touched_from = tree.clock;
        tree.touch(&path);
        while tree.nodes.len() > max_nodes && tree.evict_one(touched_from) {}
        matched.min(tokens.len() as u64 - 1)
    }
}

impl Tree {
    /// Stamps the path from its leaf up to the root, newest at the root.
    fn touch(&mut self, path: &[u64]) {
        for key in path.iter().rev() {
            self.clock += 1;
            let clock = self.clock;
            let Some(n) = self.nodes.get_mut(key) else {
                continue;
            };
            let old = std::mem::replace(&mut n.stamp, clock);
            self.lru.remove(&old);
            self.lru.insert(clock, *key);
        }
    }

    /// Drops the least recently used leaf, never one stamped after `touched_from` (the path
    /// just used); false when nothing can go.
    fn evict_one(&mut self, touched_from: u64) -> bool {
        let Some((&stamp, &key)) = self.lru.iter().next() else {
            return false;
        };
        if stamp > touched_from {
            return false;
        }
        self.lru.remove(&stamp);
        self.nodes.remove(&key);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u64, base: u64) -> Vec<u64> {
        (0..n).map(|i| base + i).collect()
    }

    #[test]
    fn a_repeat_is_served_but_its_last_token_and_only_with_the_cache_on() {
        let on = RadixCache::new(false, None);
        assert_eq!(on.lookup(&ids(6, 0), 1000), 0);
        assert_eq!(on.lookup(&ids(6, 100), 1000), 0);
        // What 0.5.23 answered for a 6-token prompt sent twice: cached_tokens 5.
        assert_eq!(on.lookup(&ids(6, 0), 1000), 5);
        let off = RadixCache::new(true, None);
        assert_eq!(
            (off.lookup(&ids(6, 0), 1000), off.lookup(&ids(6, 0), 1000)),
            (0, 0)
        );
    }

    #[test]
    fn a_shared_prefix_is_served_whole_pages_at_a_time() {
        let c = RadixCache::new(false, Some(4));
        let mut a = ids(10, 0);
        assert_eq!(c.lookup(&a, 1000), 0);
        a[9] = 99;
        // 10 tokens share 9: two whole pages of 4 match, the partial third never does.
        assert_eq!(c.lookup(&a, 1000), 8);
    }

    #[test]
    fn the_least_recently_used_prefix_goes_when_the_tree_is_full() {
        let c = RadixCache::new(false, None);
        let (a, b, x) = (ids(10, 0), ids(10, 100), ids(10, 200));
        c.lookup(&a, 20);
        c.lookup(&b, 20);
        // a is used again, so b is the oldest when x needs room.
        assert_eq!(c.lookup(&a, 20), 9);
        c.lookup(&x, 20);
        assert_eq!(c.lookup(&a, 20), 9);
        assert_eq!(c.lookup(&b, 20), 0);
        // A leaf goes before its parents: b evicted x's tail, then a's, from the leaves up.
        let tree = c.tree.lock().unwrap();
        assert!(tree.nodes.len() <= 20);
        for n in tree.nodes.values() {
            if let Some(p) = n.parent {
                assert!(tree.nodes.contains_key(&p), "an orphan survived eviction");
            }
        }
    }
}

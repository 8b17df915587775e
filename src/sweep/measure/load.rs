//! The sweep's workload: a reproducible sample of the user's prompts (`--prompts --sample
//! --seed`) or synthetic prompts of a given length, as the requests `fleet generate` would send
//! (same endpoint choice, same max tokens). A trial draws its requests without repetition, as
//! far as the sample goes: SGLang's radix cache (on by default) serves a repeated prompt's
//! prefill for free, which would flatter every candidate but one run with
//! `--disable-radix-cache`. What the trials drew, and the prompts that cannot fit the context
//! (the dataset's problem, never a candidate's), are noted here for the report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::generate::drive::Output;
use crate::generate::input::{Ids, InputError, Reader};
use crate::generate::journal::Entry;
use crate::sglang::client::{Api, CompletionRequest, Prompt};

/// What the workload is, as recorded in `sweep.json` (a resumed sweep must use the same one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkloadSpec {
    Prompts {
        path: PathBuf,
        sample: usize,
        seed: u64,
        max_tokens: u32,
    },
    Synthetic {
        input_len: u32,
        output_len: u32,
    },
}

impl WorkloadSpec {
    /// The most output tokens one of its requests asks for.
    pub fn max_output_tokens(&self) -> u32 {
        match self {
            WorkloadSpec::Prompts { max_tokens, .. } => *max_tokens,
            WorkloadSpec::Synthetic { output_len, .. } => *output_len,
        }
    }

    /// The workload this spec describes: the sample read from the prompt file, or synthetic
    /// prompts; requests for `endpoint` (default as `fleet generate` picks it) and `model`.
    pub fn load(&self, endpoint: Option<Api>, model: Option<&str>) -> Result<Workload, LoadError> {
        match self {
            WorkloadSpec::Prompts {
                path,
                sample,
                seed,
                max_tokens,
            } => sample_prompts(path, *sample, *seed, *max_tokens, endpoint, model),
            WorkloadSpec::Synthetic {
                input_len,
                output_len,
            } => Ok(synthetic(*input_len, *output_len, endpoint, model)),
        }
    }
}

/// The requests a trial draws from. Clones share what the trials saw.
#[derive(Debug, Clone)]
pub struct Workload {
    source: Source,
    /// Synthetic requests ask the server to ignore EOS so that every output has `output_len`
    /// tokens.
    pub ignore_eos: bool,
    /// Prompt lines in the file (malformed ones included, as `generate` counts them).
    pub total_lines: Option<u64>,
    /// Usable prompt lines in the file (what a sample can hold at most).
    pub usable: Option<u64>,
    /// Lines of the file that are not usable prompts (never sampled).
    pub malformed: u64,
    seen: Arc<Seen>,
}

#[derive(Debug, Clone)]
enum Source {
    /// The sample, in a seeded random order.
    Sample(Vec<CompletionRequest>),
    /// A new prompt for every request.
    Synthetic {
        input_len: u32,
        output_len: u32,
        api: Api,
        model: Option<String>,
    },
}

#[derive(Debug, Default)]
struct Seen {
    /// The most requests one trial's load drew.
    drawn: AtomicU64,
    /// Prompts that cannot fit the context (by request number for synthetic ones, by place in
    /// the sample otherwise), with the server's reason.
    unfit: Mutex<BTreeMap<u64, String>>,
}

/// A trial drew more requests than the sample holds, so prompts repeated within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Repeated {
    /// The most requests one trial drew.
    pub drawn: u64,
    pub sample: u64,
    /// Usable prompts in the file: a larger `--sample` helps only up to this.
    pub usable: Option<u64>,
}

/// The prompts of the workload that no candidate can run: longer than the context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unfit {
    pub prompts: u64,
    /// The server's reason for the first of them.
    pub example: String,
}

impl Workload {
    /// Request `i` of a trial: a new prompt each time while the sample lasts (then the sample
    /// again from its start).
    pub fn request(&self, i: u64) -> CompletionRequest {
        self.seen.drawn.fetch_max(i + 1, Ordering::Relaxed);
        match &self.source {
            Source::Sample(requests) => requests[(i % requests.len() as u64) as usize].clone(),
            Source::Synthetic {
                input_len,
                output_len,
                api,
                model,
            } => synthetic_request(i, *input_len, *output_len, *api, model.as_deref()),
        }
    }

    /// Distinct prompts: the sample's size; `None` when every request has its own.
    pub fn distinct(&self) -> Option<u64> {
        match &self.source {
            Source::Sample(requests) => Some(requests.len() as u64),
            Source::Synthetic { .. } => None,
        }
    }

    /// Whether a trial outran the sample.
    pub fn repeated(&self) -> Option<Repeated> {
        let drawn = self.seen.drawn.load(Ordering::Relaxed);
        let sample = self.distinct()?;
        (drawn > sample).then_some(Repeated {
            drawn,
            sample,
            usable: self.usable,
        })
    }

    /// Takes note of what the generation core wrote about a request: a prompt too long for the
    /// context, which the core drops as `fleet generate` does.
    pub fn observe(&self, out: &Output) {
        let Output::Write(Entry::Failure(line)) = out else {
            return;
        };
        let Ok(record) = serde_json::from_slice::<serde_json::Value>(line) else {
            return;
        };
        if record["reason"] != "prompt_too_long" {
            return;
        }
        let Some(i) = record["id"].as_u64() else {
            return;
        };
        let prompt = self.distinct().map_or(i, |n| i % n);
        let why = record["error"].as_str().unwrap_or_default().to_string();
        let mut unfit = self.seen.unfit.lock().unwrap_or_else(|e| e.into_inner());
        unfit.entry(prompt).or_insert(why);
    }

    /// The prompts no trial could run, once for the whole sweep.
    pub fn unfit(&self) -> Option<Unfit> {
        let unfit = self.seen.unfit.lock().unwrap_or_else(|e| e.into_inner());
        let (_, example) = unfit.iter().next()?;
        Some(Unfit {
            prompts: unfit.len() as u64,
            example: example.clone(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("{}: no usable prompt line ({malformed} malformed)", path.display())]
    Empty { path: PathBuf, malformed: u64 },
}

/// SplitMix64: a sample must be the same for a seed on every build and platform (a resumed
/// sweep compares like with like), which `rand`'s StdRng does not promise across releases.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0); the modulo bias is below 2^-40 for any file size.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Reservoir-samples `sample` usable prompt lines from `path` in one streamed pass (only the
/// sample is kept in memory), in an order shuffled by the seed, so that the part of the sample
/// a trial draws is a sample too. `api`: the `--endpoint` override, else what `generate` picks
/// (chat for messages, generate for text, or a Batch API line's URL).
pub fn sample_prompts(
    path: &Path,
    sample: usize,
    seed: u64,
    max_tokens: u32,
    endpoint: Option<Api>,
    model: Option<&str>,
) -> Result<Workload, LoadError> {
    let mut reader = Reader::open(path, None)?;
    let mut ids = Ids::default();
    let mut rng = SplitMix(seed);
    let mut kept: Vec<(u64, CompletionRequest)> = Vec::with_capacity(sample.min(1 << 16));
    let (mut total, mut usable, mut malformed) = (0u64, 0u64, 0u64);
    while let Some(line) = reader.next_line(&mut ids)? {
        total += 1;
        let Ok(parsed) = line.parsed else {
            malformed += 1;
            continue;
        };
        let api = endpoint.or(parsed.api).unwrap_or(match parsed.prompt {
            Prompt::Messages(_) => Api::Chat,
            Prompt::Text(_) => Api::Generate,
        });
        if matches!(
            (&parsed.prompt, api),
            (Prompt::Messages(_), Api::Generate | Api::Completions)
        ) {
            malformed += 1;
            continue;
        }
        usable += 1;
        let slot = if kept.len() < sample {
            Some(kept.len())
        } else {
            let j = rng.below(usable) as usize;
            (j < sample).then_some(j)
        };
        let Some(slot) = slot else { continue };
        let req = CompletionRequest {
            api,
            prompt: parsed.prompt,
            max_tokens: parsed.max_tokens.unwrap_or(max_tokens),
            temperature: None,
            top_p: None,
            model: model.map(str::to_string),
            extra: parsed.extra,
        };
        if slot == kept.len() {
            kept.push((line.number, req));
        } else {
            kept[slot] = (line.number, req);
        }
    }
    if kept.is_empty() {
        return Err(LoadError::Empty {
            path: path.to_path_buf(),
            malformed,
        });
    }
    // From file order (what the reservoir kept does not depend on the order it kept it in),
    // a Fisher-Yates shuffle by the seed.
    kept.sort_by_key(|(n, _)| *n);
    let mut order = SplitMix(seed ^ 0x5EED_0F5A_3B1E);
    for i in (1..kept.len()).rev() {
        let j = order.below(i as u64 + 1) as usize;
        kept.swap(i, j);
    }
    Ok(Workload {
        source: Source::Sample(kept.into_iter().map(|(_, r)| r).collect()),
        ignore_eos: false,
        total_lines: Some(total),
        usable: Some(usable),
        malformed,
        seen: Arc::default(),
    })
}

/// Short common words: about one token each for real tokenizers, and 4 characters (one token
/// by the simulator's count) with the following space.
const WORDS: [&str; 16] = [
    "the", "cat", "sat", "map", "red", "sun", "dog", "ran", "far", "big", "old", "sea", "sky",
    "day", "man", "art",
];

/// Synthetic prompts of about `input_len` tokens, a new one for every request and each
/// different from its first word on (so that no server-side prefix cache makes one cheaper
/// than another), asking for exactly `output_len` tokens on `endpoint` (default: `/generate`,
/// what `generate` uses for text).
pub fn synthetic(
    input_len: u32,
    output_len: u32,
    endpoint: Option<Api>,
    model: Option<&str>,
) -> Workload {
    Workload {
        source: Source::Synthetic {
            input_len,
            output_len,
            api: endpoint.unwrap_or(Api::Generate),
            model: model.map(str::to_string),
        },
        ignore_eos: true,
        total_lines: None,
        usable: None,
        malformed: 0,
        seen: Arc::default(),
    }
}

fn synthetic_request(
    i: u64,
    input_len: u32,
    output_len: u32,
    api: Api,
    model: Option<&str>,
) -> CompletionRequest {
    let mut rng = SplitMix(i);
    let mut text = format!("{i:03} ");
    for _ in 1..input_len.max(1) {
        text.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
        text.push(' ');
    }
    CompletionRequest {
        api,
        prompt: Prompt::Text(text.trim_end().to_string()),
        max_tokens: output_len.max(1),
        temperature: None,
        top_p: None,
        model: model.map(str::to_string),
        extra: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(lines: &[String]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        f
    }

    fn text(r: &CompletionRequest) -> String {
        match &r.prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Messages(m) => m.to_string(),
        }
    }

    fn texts(w: &Workload) -> Vec<String> {
        (0..w.distinct().unwrap())
            .map(|i| text(&w.request(i)))
            .collect()
    }

    #[test]
    fn a_sample_is_reproducible_per_seed_and_counts_every_line() {
        let mut lines: Vec<String> = (0..200)
            .map(|i| format!(r#"{{"id": {i}, "prompt": "p{i}"}}"#))
            .collect();
        lines.push("not json".into());
        lines.push(r#"{"id": "m", "messages": [{"role": "user", "content": "hi"}]}"#.into());
        let f = file(&lines);
        let a = sample_prompts(f.path(), 10, 7, 4096, None, None).unwrap();
        let b = sample_prompts(f.path(), 10, 7, 4096, None, None).unwrap();
        let c = sample_prompts(f.path(), 10, 8, 4096, None, None).unwrap();
        assert_eq!(texts(&a), texts(&b));
        assert_ne!(texts(&a), texts(&c));
        assert_eq!(a.distinct(), Some(10));
        assert_eq!(a.total_lines, Some(202));
        assert_eq!((a.usable, a.malformed), (Some(201), 1));
        assert!((0..10).all(|i| a.request(i).max_tokens == 4096));
        // The sample spreads over the file rather than taking its head.
        let ids: Vec<u32> = texts(&a)
            .iter()
            .filter_map(|t| t.strip_prefix('p').and_then(|n| n.parse().ok()))
            .collect();
        assert!(ids.iter().any(|&i| i >= 100), "{ids:?}");
    }

    #[test]
    fn endpoints_follow_generate_and_a_small_file_is_taken_whole() {
        let f = file(&[
            r#"{"id": 1, "prompt": "hello"}"#.into(),
            r#"{"id": 2, "messages": [{"role": "user", "content": "hi"}]}"#.into(),
            r#"{"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 7}}"#.into(),
        ]);
        let w = sample_prompts(f.path(), 100, 0, 4096, None, Some("m")).unwrap();
        let mut apis: Vec<Api> = (0..3).map(|i| w.request(i).api).collect();
        assert_eq!(w.repeated(), None, "three prompts drawn once each");
        apis.sort_by_key(|a| a.path());
        assert_eq!(apis, vec![Api::Generate, Api::Chat, Api::Completions]);
        let completions = (0..3)
            .find(|i| w.request(*i).api == Api::Completions)
            .unwrap();
        assert_eq!(w.request(completions).max_tokens, 7);
        assert_eq!(
            w.request(3 + completions).api,
            Api::Completions,
            "then from the start"
        );
        assert_eq!(
            w.repeated(),
            Some(Repeated {
                drawn: 4 + completions,
                sample: 3,
                usable: Some(3)
            })
        );
        let empty = file(&["{}".into()]);
        assert!(matches!(
            sample_prompts(empty.path(), 5, 0, 4096, None, None),
            Err(LoadError::Empty { malformed: 1, .. })
        ));
    }

    #[test]
    fn a_trial_draws_the_sample_in_a_shuffled_order() {
        let lines: Vec<String> = (0..50)
            .map(|i| format!(r#"{{"id": {i}, "prompt": "p{i}"}}"#))
            .collect();
        let f = file(&lines);
        let w = sample_prompts(f.path(), 50, 3, 64, None, None).unwrap();
        let drawn = texts(&w);
        let mut sorted = drawn.clone();
        sorted.sort_by_key(|t| t[1..].parse::<u32>().unwrap());
        assert_eq!(sorted, (0..50).map(|i| format!("p{i}")).collect::<Vec<_>>());
        assert_ne!(drawn, sorted, "not the file's order");
    }

    #[test]
    fn synthetic_prompts_have_the_asked_lengths_and_never_repeat() {
        let w = synthetic(100, 64, None, None);
        let t: Vec<String> = (0..5000).map(|i| text(&w.request(i))).collect();
        assert_eq!(t[0].split(' ').count(), 100);
        assert_eq!(t[0].len().div_ceil(4), 100, "about 4 characters a token");
        let distinct: std::collections::BTreeSet<&String> = t.iter().collect();
        assert_eq!(distinct.len(), 5000);
        assert_eq!((w.distinct(), w.repeated()), (None, None));
        assert!(w.ignore_eos);
        let r = w.request(7);
        assert!(r.max_tokens == 64 && r.api == Api::Generate);
        assert_eq!(
            synthetic(4, 4, Some(Api::Chat), None).request(0).api,
            Api::Chat
        );
    }

    #[test]
    fn prompts_too_long_are_noted_once_for_the_sweep() {
        let lines: Vec<String> = (0..4)
            .map(|i| format!(r#"{{"id": {i}, "prompt": "p{i}"}}"#))
            .collect();
        let f = file(&lines);
        let w = sample_prompts(f.path(), 4, 0, 64, None, None).unwrap();
        let failure = |id: u64, reason: &str| {
            Output::Write(Entry::Failure(
                format!(r#"{{"id":{id},"line":1,"reason":"{reason}","error":"the prompt is 9 tokens; the context length is 8"}}"#)
                    .into_bytes(),
            ))
        };
        assert_eq!(w.unfit(), None);
        // Request 5 is prompt 1 again (a later cycle, or another candidate's trial).
        let other = w.clone();
        w.observe(&failure(1, "prompt_too_long"));
        other.observe(&failure(5, "prompt_too_long"));
        w.observe(&failure(2, "rejected"));
        assert_eq!(
            w.unfit(),
            Some(Unfit {
                prompts: 1,
                example: "the prompt is 9 tokens; the context length is 8".into()
            })
        );
    }
}

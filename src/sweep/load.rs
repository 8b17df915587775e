//! The sweep's workload: a reproducible sample of the user's prompts (`--prompts --sample
//! --seed`) or synthetic prompts of a given length, as the requests `fleet generate` would send
//! (same endpoint choice, same max tokens).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::generate::input::{Ids, InputError, Reader};
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

/// The requests a trial cycles through.
#[derive(Debug, Clone)]
pub struct Workload {
    pub requests: Vec<CompletionRequest>,
    /// Synthetic requests ask the server to ignore EOS so that every output has `output_len`
    /// tokens.
    pub ignore_eos: bool,
    /// Prompt lines in the file (malformed ones included, as `generate` counts them).
    pub total_lines: Option<u64>,
    /// Lines of the file that are not usable prompts (never sampled).
    pub malformed: u64,
}

impl Workload {
    /// Request `i`, cycling through the sample.
    pub fn request(&self, i: u64) -> &CompletionRequest {
        &self.requests[(i % self.requests.len() as u64) as usize]
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
/// sample is kept in memory), in file order. `api`: the `--endpoint` override, else what
/// `generate` picks (chat for messages, generate for text, or a Batch API line's URL).
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
    kept.sort_by_key(|(n, _)| *n);
    Ok(Workload {
        requests: kept.into_iter().map(|(_, r)| r).collect(),
        ignore_eos: false,
        total_lines: Some(total),
        malformed,
    })
}

/// Short common words: about one token each for real tokenizers, and 4 characters (one token
/// by the simulator's count) with the following space.
const WORDS: [&str; 16] = [
    "the", "cat", "sat", "map", "red", "sun", "dog", "ran", "far", "big", "old", "sea", "sky",
    "day", "man", "art",
];

/// `count` synthetic prompts of about `input_len` tokens, each different from its first word
/// on (so that no server-side prefix cache makes one cheaper than another), asking for exactly
/// `output_len` tokens on `endpoint` (default: `/generate`, what `generate` uses for text).
pub fn synthetic(
    input_len: u32,
    output_len: u32,
    count: usize,
    endpoint: Option<Api>,
    model: Option<&str>,
) -> Workload {
    let requests = (0..count)
        .map(|i| {
            let mut rng = SplitMix(i as u64);
            let mut text = format!("{i:03} ");
            for _ in 1..input_len.max(1) {
                text.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
                text.push(' ');
            }
            CompletionRequest {
                api: endpoint.unwrap_or(Api::Generate),
                prompt: Prompt::Text(text.trim_end().to_string()),
                max_tokens: output_len.max(1),
                temperature: None,
                top_p: None,
                model: model.map(str::to_string),
                extra: None,
            }
        })
        .collect();
    Workload {
        requests,
        ignore_eos: true,
        total_lines: None,
        malformed: 0,
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

    fn texts(w: &Workload) -> Vec<String> {
        w.requests
            .iter()
            .map(|r| match &r.prompt {
                Prompt::Text(t) => t.clone(),
                Prompt::Messages(m) => m.to_string(),
            })
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
        assert_eq!(a.requests.len(), 10);
        assert_eq!(a.total_lines, Some(202));
        assert_eq!(a.malformed, 1);
        assert!(a.requests.iter().all(|r| r.max_tokens == 4096));
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
        let apis: Vec<Api> = w.requests.iter().map(|r| r.api).collect();
        assert_eq!(apis, vec![Api::Generate, Api::Chat, Api::Completions]);
        assert_eq!(w.requests[2].max_tokens, 7);
        assert_eq!(w.request(4).api, Api::Chat, "requests cycle");
        let empty = file(&["{}".into()]);
        assert!(matches!(
            sample_prompts(empty.path(), 5, 0, 4096, None, None),
            Err(LoadError::Empty { malformed: 1, .. })
        ));
    }

    #[test]
    fn synthetic_prompts_have_the_asked_lengths_and_differ() {
        let w = synthetic(100, 64, 3, None, None);
        let t = texts(&w);
        assert_eq!(t[0].split(' ').count(), 100);
        assert_eq!(t[0].len().div_ceil(4), 100, "about 4 characters a token");
        assert_ne!(t[0], t[1]);
        assert!(w.ignore_eos);
        assert!(
            w.requests
                .iter()
                .all(|r| r.max_tokens == 64 && r.api == Api::Generate)
        );
        assert_eq!(
            synthetic(4, 4, 1, Some(Api::Chat), None).requests[0].api,
            Api::Chat
        );
    }
}

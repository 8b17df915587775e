//! The sim's deterministic tokenizer and output text.
//!
//! - A text is ⌈characters / 4⌉ tokens, at least 1.
//! - A chat prompt costs its messages' tokens plus 4 per message (role header and end marker)
//!   plus 3 for the assistant prefix the template appends.
//! - The output length a prompt would produce on its own ("natural" length, ended by EOS) comes
//!   from a hash of the prompt: uniform over [mean/2, 3·mean/2], so the mean is `mean`. This is
//!   `--sim-output-dist uniform`; the other distributions are in `lengths.rs`.
//! - Output text is pseudo-words of 3 letters joined by spaces: token 0 is one word, every other
//!   token is a space plus a word, so N tokens are 4N−1 characters and re-tokenize to N tokens.

/// The token id reported as the matched stop token when a request ends naturally.
pub const EOS_TOKEN_ID: u64 = 151645;

const WORDS: [&str; 32] = [
    "the", "and", "for", "but", "now", "one", "two", "new", "old", "way", "day", "man", "sun",
    "sea", "sky", "map", "key", "box", "cat", "dog", "run", "fly", "red", "big", "low", "top",
    "end", "art", "law", "age", "air", "fix",
];

/// FNV-1a: stable across Rust versions and platforms, unlike `DefaultHasher`.
pub fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

pub fn count_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4).max(1)
}

/// The ids of a text's tokens, for the radix cache: each 4 characters are one token, named by
/// their hash, so equal leading text gives equal leading ids. As many as [`count_tokens`].
pub fn token_ids(text: &str, out: &mut Vec<u64>) {
    let mut chunk = [0u8; 16];
    let mut len = 0;
    let mut chars = 0;
    for c in text.chars() {
        len += c.encode_utf8(&mut chunk[len..]).len();
        chars += 1;
        if chars == 4 {
            out.push(hash(&chunk[..len]));
            (len, chars) = (0, 0);
        }
    }
    if chars > 0 || text.is_empty() {
        out.push(hash(&chunk[..len]));
    }
}

/// The token ids of a chat prompt: each message's 4 header tokens then its content, then the
/// 3 of the assistant prefix; as many as [`chat_tokens`].
pub fn chat_token_ids<'a>(contents: impl Iterator<Item = &'a str>) -> Vec<u64> {
    let mut out = Vec::new();
    for c in contents {
        out.extend([1, 2, 3, 4]);
        token_ids(c, &mut out);
    }
    out.extend([5, 6, 7]);
    out
}

/// Prompt tokens of a chat request from its message contents.
pub fn chat_tokens<'a>(contents: impl Iterator<Item = &'a str>) -> u64 {
    contents.map(|c| count_tokens(c) + 4).sum::<u64>() + 3
}

/// How many tokens the model would generate for this prompt before EOS.
pub fn natural_output_len(prompt_hash: u64, mean: u64) -> u64 {
    let frac = (mix(prompt_hash) % 10_001) as f64 / 10_000.0;
    ((mean as f64) * (0.5 + frac)).round().max(1.0) as u64
}

/// Appends the text of output tokens `from..to` of the completion seeded by `prompt_hash`.
pub fn push_tokens(out: &mut String, prompt_hash: u64, from: u64, to: u64) {
    for i in from..to {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[(mix(prompt_hash ^ i.wrapping_mul(0x9e37_79b9)) % 32) as usize]);
    }
}

#[cfg(test)]
pub fn output_text(prompt_hash: u64, tokens: u64) -> String {
    let mut s = String::with_capacity(tokens as usize * 4);
    push_tokens(&mut s, prompt_hash, 0, tokens);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_are_as_many_as_the_tokens_counted_and_shared_where_the_text_is() {
        for t in ["", "a", "abcd", "abcde", "héllo wörld, ça va?"] {
            let mut ids = Vec::new();
            token_ids(t, &mut ids);
            assert_eq!(ids.len() as u64, count_tokens(t), "{t:?}");
        }
        let msgs = ["You are terse.", "hi"];
        assert_eq!(
            chat_token_ids(msgs.into_iter()).len() as u64,
            chat_tokens(msgs.into_iter())
        );
        let (mut a, mut b) = (Vec::new(), Vec::new());
        token_ids("shared prefix!! one", &mut a);
        token_ids("shared prefix!! two", &mut b);
        assert_eq!(a[..4], b[..4]);
        assert_ne!(a[4], b[4]);
    }

    #[test]
    fn output_text_retokenizes_to_its_length() {
        for n in [1, 2, 7, 988] {
            let t = output_text(42, n);
            assert_eq!(count_tokens(&t), n);
            let mut pieces = String::new();
            push_tokens(&mut pieces, 42, 0, n / 2);
            push_tokens(&mut pieces, 42, n / 2, n);
            assert_eq!(pieces, t);
        }
    }

    #[test]
    fn lengths_are_deterministic_with_the_configured_mean() {
        assert_eq!(natural_output_len(7, 988), natural_output_len(7, 988));
        let n = 20_000u64;
        let total: u64 = (0..n)
            .map(|i| natural_output_len(hash(format!("prompt {i}").as_bytes()), 988))
            .sum();
        let mean = total as f64 / n as f64;
        assert!((mean - 988.0).abs() < 10.0, "mean {mean}");
        assert_eq!(count_tokens(""), 1);
        assert_eq!(count_tokens("abcde"), 2);
        assert_eq!(chat_tokens(["abcd", "efgh"].into_iter()), 13);
    }
}

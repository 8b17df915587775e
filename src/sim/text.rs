//! The sim's deterministic tokenizer and output text.
//!
//! - A text is ⌈characters / 4⌉ tokens, at least 1.
//! - A chat prompt costs its messages' tokens plus 4 per message (role header and end marker)
//!   plus 3 for the assistant prefix the template appends.
//! - The output length a prompt would produce on its own ("natural" length, ended by EOS) comes
//!   from a hash of the prompt: uniform over [mean/2, 3·mean/2], so the mean is `mean`.
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

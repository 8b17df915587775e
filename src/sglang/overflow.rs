//! SGLang's context-overflow 400s, read from their own numbers: which limit a request broke,
//! by how much, and what to do about it.

use std::fmt;

/// SGLang's 400s for a request that does not fit: each says which limit and by how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// The tokenizer: "The input (N tokens) is longer than the model's context length (C
    /// tokens)." The prompt alone does not fit.
    InputLonger {
        prompt_tokens: u64,
        context_len: u64,
    },
    /// The tokenizer: "Requested token count exceeds the model's maximum context length of C
    /// tokens. You requested a total of T tokens: P tokens from the input messages and M tokens
    /// for the completion." Fewer output tokens would fit.
    Total {
        prompt_tokens: u64,
        context_len: u64,
    },
    /// Chat only (srt/entrypoints/openai/serving_chat.py): "max_completion_tokens is too large:
    /// N.This model supports at most C completion tokens." Checked before the prompt is
    /// tokenized, so the prompt's length is not known yet.
    CompletionTooLarge { requested: u64, context_len: u64 },
    /// The scheduler (srt/managers/utils.py `validate_input_length`): "Input length (N tokens)
    /// exceeds the maximum allowed length (M tokens)." M is `max_req_input_len`
    /// (srt/managers/tp_worker.py: min(context − 1, KV pool − 1) − 5), and the check is
    /// `len >= M`, so despite the words a prompt of M tokens is refused too.
    InputLimit { prompt_tokens: u64, max_input: u64 },
}

impl Overflow {
    /// What to do about it: fewer output tokens, or nothing (the prompt itself is too long).
    pub fn remedy(&self) -> Remedy {
        match *self {
            Overflow::InputLonger { .. } | Overflow::InputLimit { .. } => Remedy::PromptTooLong,
            Overflow::Total {
                prompt_tokens,
                context_len,
            } => match context_len.checked_sub(prompt_tokens + 1) {
                Some(room) if room > 0 => Remedy::MaxTokens(room.min(u32::MAX as u64) as u32),
                _ => Remedy::PromptTooLong,
            },
            Overflow::CompletionTooLarge { context_len, .. } => {
                Remedy::MaxTokens(context_len.min(u32::MAX as u64) as u32)
            }
        }
    }

    /// Whether the remedy is the final clamp (C − P − 1), after which only a prompt's own
    /// length is left to blame.
    pub fn knows_prompt(&self) -> bool {
        !matches!(self, Overflow::CompletionTooLarge { .. })
    }
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Overflow::InputLonger {
                prompt_tokens,
                context_len,
            } => write!(
                f,
                "the prompt is {prompt_tokens} tokens; the context length is {context_len}"
            ),
            Overflow::Total {
                prompt_tokens,
                context_len,
            } => write!(
                f,
                "prompt ({prompt_tokens} tokens) plus max_tokens exceed the context length ({context_len})"
            ),
            Overflow::CompletionTooLarge {
                requested,
                context_len,
            } => write!(
                f,
                "max_tokens {requested} exceeds the context length ({context_len})"
            ),
            Overflow::InputLimit {
                prompt_tokens,
                max_input,
            } => write!(
                f,
                "the prompt is {prompt_tokens} tokens; the server runs prompts of at most {} tokens",
                max_input.saturating_sub(1)
            ),
        }
    }
}

/// The answer to an [`Overflow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// Send it again asking for at most this many output tokens.
    MaxTokens(u32),
    /// No output length makes it fit.
    PromptTooLong,
}

/// Recognises SGLang's four messages (see [`Overflow`]) anywhere in an error body.
pub fn parse_overflow(body: &str) -> Option<Overflow> {
    if let Some(at) = body.find("The input (") {
        let s = &body[at..];
        return Some(Overflow::InputLonger {
            prompt_tokens: number_after(s, "The input (")?,
            context_len: number_after(s, "context length (")?,
        });
    }
    if let Some(at) = body.find("maximum context length of ") {
        let s = &body[at..];
        return Some(Overflow::Total {
            context_len: number_after(s, "maximum context length of ")?,
            prompt_tokens: number_after(s, "tokens: ")?,
        });
    }
    if let Some(at) = body.find("max_completion_tokens is too large: ") {
        let s = &body[at..];
        return Some(Overflow::CompletionTooLarge {
            requested: number_after(s, "max_completion_tokens is too large: ")?,
            context_len: number_after(s, "supports at most ")?,
        });
    }
    if let Some(at) = body.find("Input length (") {
        let s = &body[at..];
        return Some(Overflow::InputLimit {
            prompt_tokens: number_after(s, "Input length (")?,
            max_input: number_after(s, "maximum allowed length (")?,
        });
    }
    None
}

fn number_after(s: &str, prefix: &str) -> Option<u64> {
    let start = s.find(prefix)? + prefix.len();
    let digits: String = s[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_input_longer_than_context() {
        let body = r#"{"object":"error","message":"The input (9000 tokens) is longer than the model's context length (8192 tokens).","code":400}"#;
        let o = parse_overflow(body).unwrap();
        assert_eq!(
            o,
            Overflow::InputLonger {
                prompt_tokens: 9000,
                context_len: 8192
            }
        );
        assert_eq!(o.remedy(), Remedy::PromptTooLong);
    }

    #[test]
    fn parses_requested_total_and_clamps() {
        let body = "Requested token count exceeds the model's maximum context length of 8192 tokens. \
                    You requested a total of 9096 tokens: 1000 tokens from the input messages and \
                    8096 tokens for the completion. Please reduce the number of tokens.";
        let o = parse_overflow(body).unwrap();
        assert_eq!(
            o,
            Overflow::Total {
                prompt_tokens: 1000,
                context_len: 8192
            }
        );
        assert_eq!(o.remedy(), Remedy::MaxTokens(7191));
        let total = |prompt_tokens| Overflow::Total {
            prompt_tokens,
            context_len: 8192,
        };
        assert_eq!(total(8191).remedy(), Remedy::PromptTooLong);
        assert_eq!(total(8190).remedy(), Remedy::MaxTokens(1));
    }

    #[test]
    fn parses_the_chat_and_scheduler_limits() {
        // serving_chat.py joins its two sentences without a space.
        let chat = r#"{"object":"error","message":"max_completion_tokens is too large: 9000.This model supports at most 8192 completion tokens.","type":"BadRequestError","param":null,"code":400}"#;
        let o = parse_overflow(chat).unwrap();
        assert_eq!(
            o,
            Overflow::CompletionTooLarge {
                requested: 9000,
                context_len: 8192
            }
        );
        assert_eq!(o.remedy(), Remedy::MaxTokens(8192));
        assert!(!o.knows_prompt());
        let limit = r#"{"error":{"message":"Input length (8187 tokens) exceeds the maximum allowed length (8186 tokens). Use a shorter input or enable --allow-auto-truncate."}}"#;
        let o = parse_overflow(limit).unwrap();
        assert_eq!(
            o,
            Overflow::InputLimit {
                prompt_tokens: 8187,
                max_input: 8186
            }
        );
        assert_eq!(o.remedy(), Remedy::PromptTooLong);
    }

    #[test]
    fn the_input_limit_names_the_longest_prompt_that_runs() {
        // utils.py refuses `len >= max_req_input_len`: with M = 506 a 506-token prompt is
        // refused and a 505-token one runs.
        let o = Overflow::InputLimit {
            prompt_tokens: 507,
            max_input: 506,
        };
        assert_eq!(
            o.to_string(),
            "the prompt is 507 tokens; the server runs prompts of at most 505 tokens"
        );
    }

    #[test]
    fn other_400s_are_not_overflow() {
        assert_eq!(
            parse_overflow("bad request: temperature must be >= 0"),
            None
        );
    }
}

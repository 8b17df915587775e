//! The process-wide registry of secrets (API keys, tokens) that must never appear in logs, and
//! the masking applied to every remote command, server log line and server answer fleet shows
//! or stores.

use std::sync::RwLock;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

const MASK: &str = "***";

/// The names SGLang gives its secrets as fields (`server_args={...}` in the log, `/server_info`)
/// and as flags (`launch_command`, an argv). SGLang 0.5.23 prints `api_key` in plain text in
/// both (srt/entrypoints/engine.py logs `resolved_dict()`; only watermark keys are redacted),
/// so a server log or answer read without the key in this environment still hides it.
const SECRET_FIELDS: [&str; 2] = ["admin_api_key", "api_key"];
const SECRET_FLAGS: [&str; 2] = ["--admin-api-key", "--api-key"];

/// Registers a value to be masked wherever fleet logs a remote command. Empty strings are
/// ignored (masking them would garble every line).
pub fn add_secret(secret: &str) {
    if secret.is_empty() {
        return;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    if !secrets.iter().any(|s| s == secret) {
        secrets.push(secret.to_string());
        // Longest first, so a secret containing another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every registered secret replaced by `***`, and the value of every secret field
/// or flag SGLang prints (`'api_key': '…'`, `"api_key": "…"`, `api_key=…`, `--api-key …`)
/// too, whether or not this process knows the key.
pub fn mask(text: &str) -> String {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    let known = secrets
        .iter()
        .fold(text.to_string(), |acc, s| acc.replace(s.as_str(), MASK));
    let fields = SECRET_FIELDS
        .iter()
        .fold(known, |acc, f| mask_field(&acc, f));
    SECRET_FLAGS
        .iter()
        .fold(fields, |acc, f| mask_flag(&acc, f))
}

/// Masks the value after each `name` that stands as a field: `'name': 'v'`, `"name": "v"`,
/// `name='v'` (Python reprs), `name=v`. The name must not continue a longer word
/// (`admin_api_key` is its own field, masked on its own).
fn mask_field(text: &str, name: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(name) {
        let before = &rest[..at];
        let quote_before = before.chars().last().filter(|c| *c == '\'' || *c == '"');
        let word_before = before
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let after = &rest[at + name.len()..];
        out.push_str(before);
        out.push_str(name);
        rest = after;
        if word_before {
            continue;
        }
        // The name's closing quote, then `:` or `=`, then the value.
        let mut tail = after;
        if let Some(q) = quote_before {
            match tail.strip_prefix(q) {
                Some(t) => tail = t,
                None => continue,
            }
        }
        let trimmed = tail.trim_start();
        if !trimmed.starts_with([':', '=']) {
            continue;
        }
        let value = trimmed[1..].trim_start();
        let Some(len) = value_len(value) else {
            continue;
        };
        let bare = &value[..len.total];
        if len.inner == 0 || (len.quote.is_none() && matches!(bare, "None" | "null")) {
            continue;
        }
        let consumed = after.len() - value.len();
        out.push_str(&after[..consumed]);
        rest = masked_value(&mut out, value, &len);
    }
    out.push_str(rest);
    out
}

/// Masks the argument after each `flag` (`--api-key v`, `--api-key=v`) in a command line shown
/// as text (`launch_command`, a shell command).
fn mask_flag(text: &str, flag: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(flag) {
        let after = &rest[at + flag.len()..];
        out.push_str(&rest[..at + flag.len()]);
        rest = after;
        let Some(sep) = after.chars().next().filter(|c| *c == ' ' || *c == '=') else {
            continue;
        };
        let value = &after[sep.len_utf8()..];
        let Some(len) = value_len(value) else {
            continue;
        };
        if len.inner == 0 || value.starts_with("--") {
            continue;
        }
        out.push(sep);
        rest = masked_value(&mut out, value, &len);
    }
    out.push_str(rest);
    out
}

/// Writes `value`'s own quotes around the mask in place of its content; returns what follows it.
fn masked_value<'a>(out: &mut String, value: &'a str, len: &ValueLen) -> &'a str {
    out.push_str(&value[..len.start]);
    out.push_str(MASK);
    out.push_str(&value[len.start + len.inner..len.total]);
    &value[len.total..]
}

/// Where a value starts and ends: quoted (`'v'`, `"v"`, with backslash escapes) or bare (up
/// to whitespace, a comma, a quote or a closing bracket).
struct ValueLen {
    quote: Option<char>,
    /// Byte offset of the value inside its quotes.
    start: usize,
    /// Bytes of the value itself.
    inner: usize,
    /// Bytes through the closing quote.
    total: usize,
}

fn value_len(value: &str) -> Option<ValueLen> {
    let first = value.chars().next()?;
    if first == '\'' || first == '"' {
        let mut escaped = false;
        for (i, c) in value[1..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                c if c == first => {
                    return Some(ValueLen {
                        quote: Some(first),
                        start: 1,
                        inner: i,
                        total: 1 + i + 1,
                    });
                }
                _ => {}
            }
        }
        // An unclosed quote (a line cut short): everything after it is the secret.
        return Some(ValueLen {
            quote: Some(first),
            start: 1,
            inner: value.len() - 1,
            total: value.len(),
        });
    }
    let end = value
        .find(|c: char| c.is_whitespace() || matches!(c, ',' | '\'' | '"' | '}' | ')' | ']'))
        .unwrap_or(value.len());
    Some(ValueLen {
        quote: None,
        start: 0,
        inner: end,
        total: end,
    })
}

/// Masks a stream of bytes line by line (a secret never straddles a line), holding back a
/// line until its end has arrived. Lines that are not UTF-8 are masked as their lossy text.
#[derive(Debug, Default)]
pub struct LineMask {
    partial: Vec<u8>,
}

impl LineMask {
    /// The masked complete lines of what arrived so far.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.partial.extend_from_slice(chunk);
        let Some(end) = self
            .partial
            .iter()
            .rposition(|b| matches!(b, b'\n' | b'\r'))
        else {
            return Vec::new();
        };
        let rest = self.partial.split_off(end + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        mask_bytes(&lines)
    }

    /// What is left of an unfinished last line, masked.
    pub fn finish(&mut self) -> Vec<u8> {
        mask_bytes(&std::mem::take(&mut self.partial))
    }
}

fn mask_bytes(bytes: &[u8]) -> Vec<u8> {
    match std::str::from_utf8(bytes) {
        Ok(text) => mask(text).into_bytes(),
        Err(_) => mask(&String::from_utf8_lossy(bytes)).into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_are_masked_longest_first() {
        add_secret("");
        add_secret("sk-abc");
        add_secret("sk-abc-long-key");
        assert_eq!(mask("--api-key sk-abc-long-key x"), "--api-key *** x");
        assert_eq!(mask("'sk-abc' and more"), "'***' and more");
        assert_eq!(mask("nothing here"), "nothing here");
    }

    #[test]
    fn the_key_in_what_sglang_prints_is_masked_without_knowing_it() {
        // srt/entrypoints/engine.py: `server_args={...}`, a Python dict repr.
        assert_eq!(
            mask("[2026] server_args={'port': 30000, 'api_key': 'k-1\\'x', 'admin_api_key': None}"),
            "[2026] server_args={'port': 30000, 'api_key': '***', 'admin_api_key': None}"
        );
        // /server_info: the field, and the argv inside `launch_command`.
        assert_eq!(
            mask(
                r#"{"api_key":"k-2","launch_command":"--port 1 --api-key k-2 --host h","admin_api_key":"a b"}"#
            ),
            r#"{"api_key":"***","launch_command":"--port 1 --api-key *** --host h","admin_api_key":"***"}"#
        );
        assert_eq!(
            mask(r#""api_key": "k-3", "x": null"#),
            r#""api_key": "***", "x": null"#
        );
        // An older ServerArgs repr, and flags in both spellings.
        assert_eq!(
            mask("ServerArgs(api_key='k-4', port=1) --api-key=k-5 --api-key --port"),
            "ServerArgs(api_key='***', port=1) --api-key=*** --api-key --port"
        );
        // Words that only contain the name, and absent values, stay.
        assert_eq!(
            mask("my_api_key: 1, api_key: None, api_key=, api_keys"),
            "my_api_key: 1, api_key: None, api_key=, api_keys"
        );
        assert_eq!(mask("'api_key': 'cut sh"), "'api_key': '***");
    }

    #[test]
    fn a_stream_is_masked_line_by_line_across_chunks() {
        let mut m = LineMask::default();
        let mut out = m.push(b"a\n'api_key': 'k-");
        assert_eq!(out, b"a\n");
        out.extend(m.push(b"split' b\nc"));
        out.extend(m.finish());
        assert_eq!(String::from_utf8(out).unwrap(), "a\n'api_key': '***' b\nc");
    }
}

//! The process-wide registry of secrets (API keys, tokens) that must never appear in logs, and
//! the masking applied to every remote command before it is logged.

use std::sync::RwLock;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

const MASK: &str = "***";

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

/// `text` with every registered secret replaced by `***`.
pub fn mask(text: &str) -> String {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    secrets
        .iter()
        .fold(text.to_string(), |acc, s| acc.replace(s.as_str(), MASK))
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
}

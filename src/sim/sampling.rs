//! The sampling parameters' checks that SGLang 0.5.23 makes before a request is queued
//! (srt/sampling/sampling_params.py `SamplingParams.verify`, called by the tokenizer manager):
//! the first one that fails is the request's 400, in the same words.

use serde_json::{Map, Value as Json};

/// A parameter's value as Python prints it in the message: the OpenAI routes' pydantic models
/// turn floats' fields into `float` (so `-3` prints as `-3.0`), `/generate` keeps the JSON's own.
fn shown(v: &Json, float: bool) -> String {
    match v.as_f64() {
        Some(x) if float || !(v.is_i64() || v.is_u64()) => {
            if x.fract() == 0.0 && x.is_finite() && x.abs() < 1e16 {
                format!("{x:.1}")
            } else {
                format!("{x}")
            }
        }
        _ => v.to_string(),
    }
}

/// `verify` over the request's sampling parameters, named as SGLang names them; `float_fields`
/// is true for the OpenAI routes. `Err` holds the message.
pub fn verify(params: &Map<String, Json>, float_fields: bool) -> Result<(), String> {
    let num = |k: &str| params.get(k).filter(|v| !v.is_null());
    let f = |k: &str, default: f64| num(k).and_then(Json::as_f64).unwrap_or(default);
    let show = |k: &str, default: &str| {
        num(k).map_or(default.to_string(), |v| {
            shown(v, float_fields && k != "top_k")
        })
    };
    let temperature = f("temperature", 1.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(format!(
            "temperature must be a non-negative finite number, got {}.",
            show("temperature", "1.0")
        ));
    }
    let top_p = f("top_p", 1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!(
            "top_p must be in (0, 1], got {}.",
            show("top_p", "1.0")
        ));
    }
    let min_p = f("min_p", 0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(format!(
            "min_p must be in [0, 1], got {}.",
            show("min_p", "0.0")
        ));
    }
    // Greedy (a temperature under 1e-6) sets `top_k` to 1, and -1 means the whole vocabulary,
    // before `verify` runs.
    let greedy = (0.0..1e-6).contains(&temperature);
    let top_k = if greedy { 1.0 } else { f("top_k", -1.0) };
    if top_k < 1.0 && top_k != -1.0 {
        return Err(format!(
            "top_k must be -1 (disable) or at least 1, got {}.",
            show("top_k", "-1")
        ));
    }
    for (k, default) in [("frequency_penalty", 0.0), ("presence_penalty", 0.0)] {
        if !(-2.0..=2.0).contains(&f(k, default)) {
            return Err(format!("{k} must be in [-2, 2], got {}.", show(k, "0.0")));
        }
    }
    let repetition = f("repetition_penalty", 1.0);
    if !(repetition > 0.0 && repetition <= 2.0) {
        return Err(format!(
            "repetition_penalty must be in (0, 2] (1.0 = no penalty), got {}.",
            show("repetition_penalty", "1.0")
        ));
    }
    let min_new = f("min_new_tokens", 0.0);
    if min_new < 0.0 {
        return Err(format!(
            "min_new_tokens must be in [0, max_new_tokens], got {}.",
            show("min_new_tokens", "0")
        ));
    }
    if let Some(max_new) = num("max_new_tokens").and_then(Json::as_f64) {
        if max_new < 0.0 {
            return Err(format!(
                "max_new_tokens must be at least 0, got {}.",
                show("max_new_tokens", "")
            ));
        }
        if min_new > max_new {
            return Err(format!(
                "min_new_tokens must be in [0, max_new_tokens({})], got {}.",
                show("max_new_tokens", ""),
                show("min_new_tokens", "0")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Json, float: bool) -> Result<(), String> {
        verify(v.as_object().unwrap(), float)
    }

    #[test]
    fn the_first_bad_parameter_is_named_in_sglangs_words() {
        assert_eq!(
            check(json!({"temperature": -3}), true).unwrap_err(),
            "temperature must be a non-negative finite number, got -3.0."
        );
        assert_eq!(
            check(json!({"top_p": 0}), false).unwrap_err(),
            "top_p must be in (0, 1], got 0."
        );
        assert_eq!(
            check(json!({"top_k": 0, "top_p": 2}), false).unwrap_err(),
            "top_p must be in (0, 1], got 2."
        );
        assert_eq!(
            check(json!({"top_k": 0}), true).unwrap_err(),
            "top_k must be -1 (disable) or at least 1, got 0."
        );
        assert_eq!(
            check(json!({"presence_penalty": 2.5}), true).unwrap_err(),
            "presence_penalty must be in [-2, 2], got 2.5."
        );
        assert_eq!(
            check(json!({"max_new_tokens": 4, "min_new_tokens": 8}), false).unwrap_err(),
            "min_new_tokens must be in [0, max_new_tokens(4)], got 8."
        );
    }

    #[test]
    fn defaults_and_greedy_pass() {
        assert!(check(json!({}), true).is_ok());
        assert!(
            check(
                json!({"temperature": 0, "top_k": -1, "max_new_tokens": 0}),
                false
            )
            .is_ok()
        );
        assert!(check(json!({"temperature": null}), true).is_ok());
        assert!(check(json!({"temperature": 0, "top_k": 0}), true).is_ok());
    }
}

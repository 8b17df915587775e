//! How each kind of profile value is read (with its problems reported at its place) and written
//! back: the readers and writers the schema's keys are made of, and the rules across keys.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::check::{Checker, Fields, is_env_name, join, suggest};
use super::super::yaml::{Node, Value};
use super::super::{MambaStrategy, Profile};
use crate::layout::ParallelError;

pub(super) fn opt_str(s: &Option<String>) -> Value {
    s.clone().map_or(Value::Null, Value::Str)
}

pub(super) fn opt_int(v: Option<u32>) -> Value {
    v.map_or(Value::Null, |v| Value::Int(v.into()))
}

pub(super) fn strs(v: &[String]) -> Value {
    Value::Seq(v.iter().map(|s| Node::new(Value::Str(s.clone()))).collect())
}

pub(super) fn dur(d: Duration) -> Value {
    Value::Str(humantime::format_duration(d).to_string())
}

pub(super) fn string(c: &mut Checker, node: Option<&Node>, field: &str) -> Option<String> {
    node.and_then(|n| c.string(n, field))
}

/// An integer ≥ 1 (a context length, a request cap).
pub(super) fn count(c: &mut Checker, node: Option<&Node>, field: &str) -> Option<u32> {
    node.and_then(|n| c.int(n, field, 1, u32::MAX.into()))
        .map(|v| v as u32)
}

pub(super) fn duration(
    c: &mut Checker,
    node: Option<&Node>,
    field: &str,
    default: Duration,
) -> Duration {
    node.and_then(|n| c.duration(n, field)).unwrap_or(default)
}

pub(super) fn fraction(c: &mut Checker, node: &Node, field: &str) -> Option<f64> {
    let x = c.number(node, field)?;
    if x > 0.0 && x < 1.0 {
        return Some(x);
    }
    c.report(
        node.loc,
        field,
        format!("{x:?} is out of range"),
        Some("must be between 0 and 1 (exclusive), e.g. 0.85".into()),
    );
    None
}

/// `expected.output_tokens`: the length distribution `fleet sweep --write-profile` recorded.
pub(super) fn length_prior(
    c: &mut Checker,
    node: &Node,
    field: &str,
) -> Option<crate::eta::LengthPrior> {
    let parsed = serde_json::to_value(&node.value)
        .and_then(serde_json::from_value::<crate::eta::LengthPrior>);
    match parsed {
        Ok(p) => Some(p),
        Err(e) => {
            c.report(
                node.loc,
                field,
                format!("not a length distribution: {e}"),
                Some(
                    "written by `fleet sweep --write-profile` as {max_tokens, sample, seen_to, \
                     mean, survival: [[tokens, share], ...]}; delete it to go without"
                        .into(),
                ),
            );
            None
        }
    }
}

pub(super) fn positive(c: &mut Checker, node: &Node, field: &str) -> Option<f64> {
    let x = c.number(node, field)?;
    if x > 0.0 {
        return Some(x);
    }
    c.report(
        node.loc,
        field,
        format!("{x:?} is out of range"),
        Some("must be above 0".into()),
    );
    None
}

pub(super) fn launcher(c: &mut Checker, node: &Node, field: &str) -> Vec<String> {
    const EXAMPLE: &str = "e.g. [/workspace/venv/bin/python, -m, sglang.launch_server]";
    if let Value::Str(s) = &node.value {
        c.report(
            node.loc,
            field,
            format!("expected a list (an argv), found the string `{s}`"),
            Some(format!("write each word as an item, {EXAMPLE}")),
        );
        return Vec::new();
    }
    let argv = c
        .list(node, field, |c, n, f| c.string(n, f))
        .unwrap_or_default();
    if argv.is_empty() && matches!(&node.value, Value::Seq(items) if items.is_empty()) {
        c.report(
            node.loc,
            field,
            "must not be empty",
            Some(format!("the command that starts SGLang, {EXAMPLE}")),
        );
    }
    argv
}

pub(super) fn mamba(c: &mut Checker, node: &Node, field: &str) -> Option<MambaStrategy> {
    let name = c.string(node, field)?;
    let found = MambaStrategy::from_name(&name);
    if found.is_none() {
        let choices: Vec<&str> = MambaStrategy::ALL.iter().map(|s| s.as_str()).collect();
        let mut hint = format!("choose one of: {}", choices.join(", "));
        if let Some(s) = suggest(&name, &choices) {
            hint = format!("did you mean `{s}`? {hint}");
        }
        c.report(
            node.loc,
            field,
            format!("unknown mamba strategy `{name}`"),
            Some(hint),
        );
    }
    found
}

pub(super) fn env(c: &mut Checker, node: &Node) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for (key, value) in c.entries(node, "env") {
        let field = join("env", &key.name);
        if !is_env_name(&key.name) {
            c.report(
                key.loc,
                &field,
                "not an environment variable name",
                Some("use letters, digits and _, not starting with a digit".into()),
            );
        } else if key.name == "CUDA_VISIBLE_DEVICES" {
            c.report(
                key.loc,
                &field,
                "set by fleet to pin each server to its GPU",
                Some("choose GPUs with `gpus:` in fleet.yaml or `fleet up --gpus`".into()),
            );
        }
        if let Some(v) = c.text(value, &field) {
            env.insert(key.name.clone(), v);
        }
    }
    env
}

/// SGLang's rules across the layout keys, each reported at the key that breaks it.
pub(super) fn parallel_rules(c: &mut Checker, f: &Fields, p: &Profile) {
    for problem in p.server.parallel.check() {
        let key = match problem {
            ParallelError::DpAttentionSplit { .. } => "dp_size",
            ParallelError::Experts { .. } => "ep_size",
            ParallelError::Nodes { .. } => "nnodes",
        };
        let loc = f.get(key).map_or(f.loc, |n| n.loc);
        c.report(loc, &f.field(key), problem.to_string(), None);
    }
}

/// A layout size: 1, the default, is written as unset.
pub(super) fn size(n: u32) -> Value {
    if n == 1 {
        Value::Null
    } else {
        Value::Int(n.into())
    }
}

pub(super) fn poll_shorter_than_startup(c: &mut Checker, f: &Fields, p: &Profile) {
    let health = &p.health;
    if health.poll < health.startup_timeout {
        return;
    }
    let Some((n, field)) = ["poll", "startup_timeout"]
        .into_iter()
        .find_map(|k| f.get(k).map(|n| (n, f.field(k))))
    else {
        return;
    };
    c.report(
        n.loc,
        &field,
        "the poll interval must be shorter than startup_timeout",
        Some(format!(
            "startup_timeout is {}, poll is {}",
            humantime::format_duration(health.startup_timeout),
            humantime::format_duration(health.poll)
        )),
    );
}

pub(super) fn api_key_env(c: &mut Checker, node: &Node, field: &str) -> Option<String> {
    let name = c.string(node, field)?;
    if is_env_name(&name) {
        return Some(name);
    }
    // Never echo the value: it may be the key itself.
    c.report(
        node.loc,
        field,
        "must be the name of an environment variable (letters, digits, _)",
        Some(
            "name the variable that holds the key, e.g. FLEET_API_KEY, never the key itself".into(),
        ),
    );
    None
}

/// A list of command-line arguments (`extra_args`), each kept; one whose flag `taken` names
/// (fleet sets it itself) is reported at its place with the hint `taken` gives.
pub(super) fn arg_list(
    c: &mut Checker,
    node: &Node,
    field: &str,
    taken: impl Fn(&str) -> Option<String>,
) -> Vec<String> {
    let Value::Seq(items) = &node.value else {
        c.wrong_type(node.loc, field, "a list", &node.value);
        return Vec::new();
    };
    let mut args = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let item_field = format!("{field}[{i}]");
        let Some(arg) = c.text(item, &item_field) else {
            continue;
        };
        let flag = arg.split('=').next().unwrap_or_default();
        if let Some(hint) = taken(flag) {
            c.report(
                item.loc,
                &item_field,
                format!("`{flag}` is set by fleet"),
                Some(hint),
            );
        }
        args.push(arg);
    }
    args
}

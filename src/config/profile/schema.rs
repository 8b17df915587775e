//! The profile schema, written once: every key's section, default, validation, YAML output and
//! the SGLang flags fleet renders for it. Validation, `profile show`, the keys `--set` accepts and
//! the `extra_args` check all read [`SCHEMA`]; nothing else lists the keys.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::super::check::{Checker, Fields, is_env_name, join, suggest};
use super::super::yaml::{Node, Value};
use super::super::{Expected, HealthSettings, Profile, ServerSettings};
use super::stem;
use super::values::*;
use crate::layout::Parallel;

mod router;

/// SGLang's default port; GPU i listens on `port_base + i`.
const DEFAULT_PORT_BASE: u16 = 30000;
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// Reads a field's node (`None`: absent or null) into the profile, default included; problems
/// go to the checker under the dotted field name given.
type Read = fn(&mut Checker, Option<&Node>, &str, &mut Profile);
/// The field's value for `profile show`; `Null` for unset.
type Write = fn(&Profile) -> Value;

/// One key of the profile.
pub(super) struct Field {
    pub key: &'static str,
    /// Reported when missing (unless part of the profile could not be read).
    pub required: bool,
    /// The SGLang flags fleet renders from this key, refused in `server.extra_args`.
    pub flags: &'static [&'static str],
    pub read: Read,
    pub write: Write,
}

/// A mapping of fields under one key (`server:`, `health:`, `expected:`).
pub(super) struct Section {
    pub key: &'static str,
    pub fields: &'static [Field],
    /// `None`: always part of the profile, its fields' defaults apply when it is absent.
    pub optional: Option<Optional>,
    /// A rule across the section's fields, checked once they are read.
    pub check: Option<fn(&mut Checker, &Fields, &Profile)>,
}

/// A section that exists only when written (`expected:`).
pub(super) struct Optional {
    /// Makes the section's value exist before its fields are read into it.
    pub open: fn(&mut Profile),
    pub is_set: fn(&Profile) -> bool,
}

pub(super) enum Item {
    Field(Field),
    Section(Section),
    /// A mapping with free-form keys (`env:`): NAME → value.
    Map {
        key: &'static str,
        read: fn(&mut Checker, Option<&Node>, &mut Profile),
        write: Write,
    },
}

impl Item {
    pub fn key(&self) -> &'static str {
        match self {
            Item::Field(f) => f.key,
            Item::Section(s) => s.key,
            Item::Map { key, .. } => key,
        }
    }
}

impl Section {
    fn keys(&self) -> Vec<&'static str> {
        self.fields.iter().map(|f| f.key).collect()
    }
}

/// The profile, key by key, in the order `profile show` writes it.
pub(super) static SCHEMA: &[Item] = &[
    Item::Field(Field {
        key: "model",
        required: true,
        flags: &["--model-path", "--model"],
        read: |c, n, f, p| p.model = string(c, n, f).unwrap_or_default(),
        write: |p| Value::Str(p.model.clone()),
    }),
    Item::Field(Field {
        key: "served_model_name",
        required: false,
        flags: &["--served-model-name"],
        read: |c, n, f, p| p.served_model_name = string(c, n, f),
        write: |p| opt_str(&p.served_model_name),
    }),
    Item::Field(Field {
        key: "launcher",
        required: true,
        flags: &[],
        read: |c, n, f, p| p.launcher = n.map(|n| launcher(c, n, f)).unwrap_or_default(),
        write: |p| strs(&p.launcher),
    }),
    Item::Field(Field {
        key: "port_base",
        required: false,
        flags: &["--port"],
        read: |c, n, f, p| {
            p.port_base = n
                .and_then(|n| c.int(n, f, 1, 65535))
                .map_or(DEFAULT_PORT_BASE, |v| v as u16)
        },
        write: |p| Value::Int(p.port_base.into()),
    }),
    Item::Section(Section {
        key: "server",
        fields: &[
            Field {
                key: "mem_fraction_static",
                required: false,
                flags: &["--mem-fraction-static"],
                read: |c, n, f, p| p.server.mem_fraction_static = n.and_then(|n| fraction(c, n, f)),
                write: |p| {
                    p.server
                        .mem_fraction_static
                        .map_or(Value::Null, Value::Float)
                },
            },
            Field {
                key: "context_length",
                required: false,
                flags: &["--context-length"],
                read: |c, n, f, p| p.server.context_length = count(c, n, f),
                write: |p| opt_int(p.server.context_length),
            },
            Field {
                key: "attention_backend",
                required: false,
                flags: &["--attention-backend"],
                read: |c, n, f, p| p.server.attention_backend = string(c, n, f),
                write: |p| opt_str(&p.server.attention_backend),
            },
            Field {
                key: "mamba_strategy",
                required: false,
                // The logical key: whichever of the two names the host's SGLang lists.
                flags: &["--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"],
                read: |c, n, f, p| p.server.mamba_strategy = n.and_then(|n| mamba(c, n, f)),
                write: |p| {
                    p.server
                        .mamba_strategy
                        .map_or(Value::Null, |m| Value::Str(m.as_str().into()))
                },
            },
            Field {
                key: "max_running_requests",
                required: false,
                flags: &["--max-running-requests"],
                read: |c, n, f, p| p.server.max_running_requests = count(c, n, f),
                write: |p| opt_int(p.server.max_running_requests),
            },
            Field {
                key: "tp_size",
                required: false,
                flags: &["--tp-size", "--tensor-parallel-size"],
                read: |c, n, f, p| p.server.parallel.tp = count(c, n, f).unwrap_or(1),
                write: |p| size(p.server.parallel.tp),
            },
            Field {
                key: "dp_size",
                required: false,
                flags: &["--dp-size", "--data-parallel-size"],
                read: |c, n, f, p| p.server.parallel.dp = count(c, n, f).unwrap_or(1),
                write: |p| size(p.server.parallel.dp),
            },
            Field {
                key: "ep_size",
                required: false,
                flags: &["--ep-size", "--expert-parallel-size", "--ep"],
                read: |c, n, f, p| p.server.parallel.ep = count(c, n, f).unwrap_or(1),
                write: |p| size(p.server.parallel.ep),
            },
            Field {
                key: "enable_dp_attention",
                required: false,
                flags: &["--enable-dp-attention"],
                read: |c, n, f, p| {
                    p.server.parallel.dp_attention = n.and_then(|n| c.bool(n, f)).unwrap_or(false)
                },
                write: |p| {
                    if p.server.parallel.dp_attention {
                        Value::Bool(true)
                    } else {
                        Value::Null
                    }
                },
            },
            Field {
                key: "nnodes",
                required: false,
                // fleet renders each rank's --node-rank and the shared --dist-init-addr itself.
                flags: &[
                    "--nnodes",
                    "--node-rank",
                    "--dist-init-addr",
                    "--nccl-init-addr",
                ],
                read: |c, n, f, p| p.server.parallel.nnodes = count(c, n, f).unwrap_or(1),
                write: |p| size(p.server.parallel.nnodes),
            },
            Field {
                key: "enable_metrics",
                required: false,
                flags: &["--enable-metrics"],
                read: |c, n, f, p| {
                    p.server.enable_metrics = n.and_then(|n| c.bool(n, f)).unwrap_or(true)
                },
                write: |p| Value::Bool(p.server.enable_metrics),
            },
            Field {
                key: "host",
                required: false,
                flags: &["--host"],
                read: |c, n, f, p| p.server.host = string(c, n, f),
                write: |p| opt_str(&p.server.host),
            },
            Field {
                key: "extra_args",
                required: false,
                flags: &[],
                read: |c, n, f, p| {
                    p.server.extra_args = n.map(|n| extra_args(c, n, f)).unwrap_or_default()
                },
                write: |p| strs(&p.server.extra_args),
            },
        ],
        optional: None,
        check: Some(parallel_rules),
    }),
    Item::Map {
        key: "env",
        read: |c, n, p| p.env = n.map(|n| env(c, n)).unwrap_or_default(),
        write: |p| {
            Value::map(
                p.env
                    .iter()
                    .map(|(k, v)| (k.as_str(), Value::Str(v.clone()))),
            )
        },
    },
    Item::Section(Section {
        key: "health",
        fields: &[
            Field {
                key: "startup_timeout",
                required: false,
                flags: &[],
                read: |c, n, f, p| {
                    p.health.startup_timeout = duration(c, n, f, DEFAULT_STARTUP_TIMEOUT)
                },
                write: |p| dur(p.health.startup_timeout),
            },
            Field {
                key: "poll",
                required: false,
                flags: &[],
                read: |c, n, f, p| p.health.poll = duration(c, n, f, DEFAULT_POLL),
                write: |p| dur(p.health.poll),
            },
        ],
        optional: None,
        check: Some(poll_shorter_than_startup),
    }),
    Item::Field(Field {
        key: "api_key_env",
        required: false,
        flags: &["--api-key"],
        read: |c, n, f, p| p.api_key_env = n.and_then(|n| api_key_env(c, n, f)),
        write: |p| opt_str(&p.api_key_env),
    }),
    Item::Section(Section {
        key: "expected",
        fields: &[
            Field {
                key: "output_tok_s_per_gpu",
                required: true,
                flags: &[],
                read: |c, n, f, p| {
                    if let (Some(x), Some(e)) = (n.and_then(|n| positive(c, n, f)), &mut p.expected)
                    {
                        e.output_tok_s_per_gpu = x;
                    }
                },
                write: |p| {
                    p.expected
                        .as_ref()
                        .map_or(Value::Null, |e| Value::Float(e.output_tok_s_per_gpu))
                },
            },
            Field {
                key: "max_running_requests",
                required: true,
                flags: &[],
                read: |c, n, f, p| {
                    if let (Some(v), Some(e)) = (count(c, n, f), &mut p.expected) {
                        e.max_running_requests = v;
                    }
                },
                write: |p| opt_int(p.expected.as_ref().map(|e| e.max_running_requests)),
            },
            Field {
                key: "output_tokens",
                required: false,
                flags: &[],
                read: |c, n, f, p| {
                    if let (Some(v), Some(e)) =
                        (n.and_then(|n| length_prior(c, n, f)), &mut p.expected)
                    {
                        e.output_tokens = Some(v);
                    }
                },
                write: |p| {
                    p.expected
                        .as_ref()
                        .and_then(|e| e.output_tokens.as_ref())
                        .and_then(|d| serde_json::to_value(d).ok())
                        .and_then(|j| serde_json::from_value::<Value>(j).ok())
                        .unwrap_or(Value::Null)
                },
            },
        ],
        optional: Some(Optional {
            open: |p| {
                p.expected = Some(Expected {
                    output_tok_s_per_gpu: 0.0,
                    max_running_requests: 0,
                    output_tokens: None,
                })
            },
            is_set: |p| p.expected.is_some(),
        }),
        check: None,
    }),
    Item::Section(router::SECTION),
];

/// `extends:` is resolved by the loader before validation sees the document.
const EXTENDS: &str = "extends";

/// The typed profile, or `None` when the document is not a mapping; problems go to `c`. With
/// `complete` false (an `extends:` target could not be read) missing keys prove nothing.
pub(super) fn validate(
    c: &mut Checker,
    root: &Node,
    path: &Path,
    complete: bool,
) -> Option<Profile> {
    let known: Vec<&str> = std::iter::once(EXTENDS)
        .chain(SCHEMA.iter().map(Item::key))
        .collect();
    let top = c.fields_with(root, "", &known, misplaced)?;
    let mut p = blank(path);
    for item in SCHEMA {
        match item {
            Item::Field(f) => read_field(c, Some(&top), f, complete, &mut p),
            Item::Map { key, read, .. } => read(c, top.get(key), &mut p),
            Item::Section(s) => {
                let fields = top
                    .get(s.key)
                    .and_then(|n| c.fields_with(n, s.key, &s.keys(), sglang_name));
                match (&s.optional, &fields) {
                    (Some(_), None) => continue,
                    (Some(o), Some(_)) => (o.open)(&mut p),
                    (None, _) => {}
                }
                for f in s.fields {
                    read_field(c, fields.as_ref(), f, complete, &mut p);
                }
                if let (Some(check), Some(fields)) = (s.check, &fields) {
                    check(c, fields, &p);
                }
            }
        }
    }
    Some(p)
}

fn read_field(
    c: &mut Checker,
    fields: Option<&Fields>,
    f: &Field,
    complete: bool,
    p: &mut Profile,
) {
    let node = fields.and_then(|fields| {
        if f.required && complete {
            fields.required(c, f.key)
        } else {
            fields.get(f.key)
        }
    });
    let name = fields.map_or_else(|| f.key.to_string(), |fields| fields.field(f.key));
    (f.read)(c, node, &name, p);
}

/// A profile every field of which the schema's reads then set (an absent field to its default).
fn blank(path: &Path) -> Profile {
    Profile {
        name: stem(path),
        path: path.to_path_buf(),
        model: String::new(),
        served_model_name: None,
        launcher: Vec::new(),
        port_base: DEFAULT_PORT_BASE,
        server: ServerSettings {
            mem_fraction_static: None,
            context_length: None,
            attention_backend: None,
            mamba_strategy: None,
            max_running_requests: None,
            parallel: Parallel::default(),
            enable_metrics: true,
            host: None,
            extra_args: Vec::new(),
        },
        env: BTreeMap::new(),
        health: HealthSettings {
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            poll: DEFAULT_POLL,
        },
        api_key_env: None,
        expected: None,
        router: None,
    }
}

/// A top-level key that belongs in a section (`mem_fraction_static:` written unindented).
fn misplaced(key: &str) -> Option<String> {
    SCHEMA.iter().find_map(|item| match item {
        Item::Section(s) if s.fields.iter().any(|f| f.key == key) => {
            Some(format!("`{key}` belongs under `{}:`", s.key))
        }
        _ => None,
    })
}

/// The dotted key of the profile that sets `flag`, when fleet renders that flag itself.
/// A key written as SGLang names the flag (`tensor_parallel_size` for `--tensor-parallel-size`):
/// the profile's own key for it.
fn sglang_name(key: &str) -> Option<String> {
    let flag = format!("--{}", key.replace('_', "-"));
    key_for_flag(&flag).map(|k| format!("`{flag}` is `{k}` in a profile"))
}

pub(super) fn key_for_flag(flag: &str) -> Option<String> {
    SCHEMA.iter().find_map(|item| match item {
        Item::Field(f) if f.flags.contains(&flag) => Some(f.key.to_string()),
        Item::Section(s) => s
            .fields
            .iter()
            .find(|f| f.flags.contains(&flag))
            .map(|f| join(s.key, f.key)),
        _ => None,
    })
}

/// `None` when `--set` may change this key; otherwise a hint for the "unknown key" message.
pub(super) fn override_problem(parts: &[&str]) -> Option<String> {
    let settable = settable();
    let section = |name: &str| {
        SCHEMA.iter().find_map(|item| match item {
            Item::Section(s) if s.key == name => Some(s.keys()),
            _ => None,
        })
    };
    let is_map = |name: &str| {
        SCHEMA
            .iter()
            .any(|item| matches!(item, Item::Map { key, .. } if *key == name))
    };
    let top_fields: Vec<&str> = SCHEMA
        .iter()
        .filter_map(|item| match item {
            Item::Field(f) => Some(f.key),
            _ => None,
        })
        .collect();
    let did_you_mean = |word: &str, known: &[&str], prefix: &str| {
        Some(match suggest(word, known) {
            Some(s) => format!("did you mean `{prefix}{s}`?"),
            None => settable.clone(),
        })
    };
    match parts {
        [EXTENDS] => Some("`extends:` cannot be set; name another profile instead".into()),
        [map, name] if is_map(map) && is_env_name(name) => None,
        [map, _] if is_map(map) => {
            Some("not an environment variable name: use letters, digits and _".into())
        }
        [top] if is_map(top) || section(top).is_some() => Some(format!(
            "`{top}` is a section: set one of its keys, e.g. `{top}.KEY=VALUE`"
        )),
        [top] if top_fields.contains(top) => None,
        [top] => {
            // A bare server key (`--set mem_fraction_static=0.8`) most likely meant server.KEY.
            if let Some(s) = section("server").and_then(|keys| suggest(top, &keys)) {
                return Some(format!("did you mean `server.{s}`?"));
            }
            let known: Vec<&str> = std::iter::once(EXTENDS)
                .chain(SCHEMA.iter().map(Item::key))
                .collect();
            did_you_mean(top, &known, "")
        }
        [name, key] => match section(name) {
            Some(keys) if keys.contains(key) => None,
            Some(keys) => did_you_mean(key, &keys, &format!("{name}.")),
            None => Some(settable),
        },
        _ => Some(settable),
    }
}

/// What `--set` accepts, for a hint: `settable: model, ..., server.KEY, ..., env.NAME`.
fn settable() -> String {
    let fields = SCHEMA.iter().filter_map(|item| match item {
        Item::Field(f) => Some(f.key.to_string()),
        _ => None,
    });
    let sections = SCHEMA.iter().filter_map(|item| match item {
        Item::Section(s) => Some(format!("{}.KEY", s.key)),
        _ => None,
    });
    let maps = SCHEMA.iter().filter_map(|item| match item {
        Item::Map { key, .. } => Some(format!("{key}.NAME")),
        _ => None,
    });
    let all: Vec<String> = fields.chain(sections).chain(maps).collect();
    format!("settable: {}", all.join(", "))
}

/// The profile as a YAML tree in schema order: unset top-level keys are left out, unset keys of
/// a section are shown as null (so `profile show` lists what can be set).
pub(super) fn to_value(p: &Profile) -> Value {
    let entries = SCHEMA.iter().filter_map(|item| {
        let value = match item {
            Item::Field(f) => (f.write)(p),
            Item::Map { write, .. } => write(p),
            Item::Section(s) => section_value(s, p),
        };
        (value != Value::Null).then_some((item.key(), value))
    });
    Value::map(entries)
}

fn section_value(s: &Section, p: &Profile) -> Value {
    if s.optional.as_ref().is_some_and(|o| !(o.is_set)(p)) {
        return Value::Null;
    }
    Value::map(s.fields.iter().map(|f| (f.key, (f.write)(p))))
}

/// `expected:` as written by `fleet sweep --write-profile`.
pub(super) fn expected_value(e: &Expected) -> Value {
    let mut p = blank(Path::new(""));
    p.expected = Some(e.clone());
    SCHEMA
        .iter()
        .find_map(|item| match item {
            Item::Section(s) if s.key == "expected" => Some(section_value(s, &p)),
            _ => None,
        })
        .map(|v| match v {
            // A measurement the sweep did not make is left out, not written as null.
            Value::Map(entries) => Value::Map(
                entries
                    .into_iter()
                    .filter(|(_, n)| n.value != Value::Null)
                    .collect(),
            ),
            v => v,
        })
        .unwrap_or(Value::Null)
}

fn extra_args(c: &mut Checker, node: &Node, field: &str) -> Vec<String> {
    arg_list(c, node, field, |flag| {
        key_for_flag(flag).map(|key| format!("use `{key}` instead"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_listed_once_per_mapping() {
        let mut top: Vec<&str> = SCHEMA.iter().map(Item::key).collect();
        top.push(EXTENDS);
        let n = top.len();
        top.sort();
        top.dedup();
        assert_eq!(top.len(), n, "a top-level key twice");
        for item in SCHEMA {
            if let Item::Section(s) = item {
                let mut keys = s.keys();
                keys.sort();
                keys.dedup();
                assert_eq!(keys.len(), s.fields.len(), "a key twice in {}", s.key);
            }
        }
    }

    #[test]
    fn flags_fleet_renders_name_their_key() {
        assert_eq!(key_for_flag("--port").as_deref(), Some("port_base"));
        assert_eq!(key_for_flag("--model").as_deref(), Some("model"));
        assert_eq!(
            key_for_flag("--mamba-radix-cache-strategy").as_deref(),
            Some("server.mamba_strategy")
        );
        assert_eq!(key_for_flag("--api-key").as_deref(), Some("api_key_env"));
        assert_eq!(key_for_flag("--trust-remote-code"), None);
    }

    #[test]
    fn the_settable_hint_names_every_kind_of_key() {
        assert_eq!(
            settable(),
            "settable: model, served_model_name, launcher, port_base, api_key_env, server.KEY, \
             health.KEY, expected.KEY, router.KEY, env.NAME"
        );
    }

    #[test]
    fn a_section_key_at_the_top_says_where_it_belongs() {
        assert_eq!(
            misplaced("mem_fraction_static").as_deref(),
            Some("`mem_fraction_static` belongs under `server:`")
        );
        assert_eq!(
            misplaced("poll").as_deref(),
            Some("`poll` belongs under `health:`")
        );
        assert_eq!(misplaced("nonsense"), None);
    }
}

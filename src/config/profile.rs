//! Server profiles: name-or-path resolution, `extends:` merging, `--set` overrides, validation
//! into [`Profile`] with every problem at once, and writing profiles back as YAML.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::check::{Checker, Fields, is_env_name, join, suggest};
use super::yaml::{self, Key, Loc, Node, Value};
use super::{
    ConfigError, Expected, GpuSelection, HealthSettings, Inventory, MambaStrategy, Problem,
    Profile, ServerSettings,
};

const TOP_KEYS: &[&str] = &[
    "extends",
    "model",
    "served_model_name",
    "launcher",
    "port_base",
    "server",
    "env",
    "health",
    "api_key_env",
    "expected",
];
const SERVER_KEYS: &[&str] = &[
    "mem_fraction_static",
    "context_length",
    "attention_backend",
    "mamba_strategy",
    "max_running_requests",
    "enable_metrics",
    "host",
    "extra_args",
];
const HEALTH_KEYS: &[&str] = &["startup_timeout", "poll"];
const EXPECTED_KEYS: &[&str] = &["output_tok_s_per_gpu", "max_running_requests"];

/// SGLang's default port; GPU i listens on `port_base + i`.
const DEFAULT_PORT_BASE: u16 = 30000;
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// Flags fleet renders itself, and the profile key to use instead of passing them raw.
const FLAGS_FLEET_SETS: &[(&str, &str)] = &[
    ("--model-path", "model"),
    ("--model", "model"),
    ("--served-model-name", "served_model_name"),
    ("--port", "port_base"),
    ("--host", "server.host"),
    ("--mem-fraction-static", "server.mem_fraction_static"),
    ("--context-length", "server.context_length"),
    ("--attention-backend", "server.attention_backend"),
    ("--mamba-scheduler-strategy", "server.mamba_strategy"),
    ("--mamba-radix-cache-strategy", "server.mamba_strategy"),
    ("--max-running-requests", "server.max_running_requests"),
    ("--enable-metrics", "server.enable_metrics"),
    ("--api-key", "api_key_env"),
];

/// `--set KEY=VALUE`: one field changed after `extends:` merging and before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// Dotted, e.g. `server.mem_fraction_static`, `env.NCCL_DEBUG`.
    pub key: String,
    /// YAML scalar text, e.g. `0.85`, `null`, `no_buffer`.
    pub value: String,
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--set {}={}", self.key, self.value)
    }
}

/// A NAME resolves to `<profiles_dir>/NAME.yaml`; anything with a `/` or ending in
/// `.yaml`/`.yml` is a path.
pub fn resolve_profile_path(
    name_or_path: &str,
    profiles_dir: &Path,
) -> Result<PathBuf, ConfigError> {
    let path = if is_path(name_or_path) {
        PathBuf::from(name_or_path)
    } else {
        profiles_dir.join(format!("{name_or_path}.yaml"))
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(ConfigError::ProfileNotFound {
            wanted: name_or_path.to_string(),
            looked: path,
            available: available_profiles(profiles_dir),
        })
    }
}

fn is_path(s: &str) -> bool {
    s.contains('/') || s.ends_with(".yaml") || s.ends_with(".yml")
}

/// The profile files of a directory (`*.yaml`), sorted; empty when it cannot be read.
pub fn profile_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml") && p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn available_profiles(dir: &Path) -> Vec<String> {
    profile_files(dir).iter().map(|p| stem(p)).collect()
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub(super) fn not_found_message(wanted: &str, looked: &Path, available: &[String]) -> String {
    let mut msg = format!(
        "profile `{wanted}` not found: no file at {}",
        looked.display()
    );
    let names: Vec<&str> = available.iter().map(String::as_str).collect();
    if let Some(s) = suggest(wanted, &names) {
        msg.push_str(&format!(" (did you mean `{s}`?)"));
    }
    if available.is_empty() {
        let dir = looked.parent().unwrap_or(Path::new("."));
        msg.push_str(&format!(
            "; {} holds no profiles (pass --profiles-dir DIR or a path to a .yaml file)",
            dir.display()
        ));
    } else {
        msg.push_str(&format!("; available: {}", available.join(", ")));
    }
    msg
}

pub fn load_profile(name_or_path: &str, profiles_dir: &Path) -> Result<Profile, ConfigError> {
    load_profile_with(name_or_path, profiles_dir, &[])
}

/// Loads a profile, merges what it `extends:`, applies `overrides`, then validates.
pub fn load_profile_with(
    name_or_path: &str,
    profiles_dir: &Path,
    overrides: &[Override],
) -> Result<Profile, ConfigError> {
    let path = resolve_profile_path(name_or_path, profiles_dir)?;
    load_profile_file(&path, profiles_dir, overrides)
}

/// [`load_profile_with`] for a file already found (e.g. listed by [`profile_files`]).
pub fn load_profile_file(
    path: &Path,
    profiles_dir: &Path,
    overrides: &[Override],
) -> Result<Profile, ConfigError> {
    let mut loader = Loader::new(profiles_dir, path);
    let root = loader.file(path);
    loader.finish(root, path, overrides)
}

/// A profile from text that is not on disk (e.g. embedded in the binary); `origin` names it in
/// messages, gives its name (file stem) and anchors relative `extends:` paths.
pub fn profile_from_str(
    text: &str,
    origin: &Path,
    profiles_dir: &Path,
) -> Result<Profile, ConfigError> {
    let mut loader = Loader::new(profiles_dir, origin);
    let id = loader.c.add_file(origin.to_path_buf());
    let root = loader
        .c
        .parse(text, id)
        .map(|node| loader.extends(node, origin));
    loader.finish(root, origin, &[])
}

/// Reads one profile and the chain of profiles it extends.
struct Loader<'a> {
    c: Checker,
    profiles_dir: &'a Path,
    /// Files being loaded, outermost first: (canonical path for identity, path as shown).
    chain: Vec<(PathBuf, PathBuf)>,
    /// Part of the profile could not be read (bad `extends:`), so missing keys prove nothing.
    incomplete: bool,
}

impl<'a> Loader<'a> {
    fn new(profiles_dir: &'a Path, root: &Path) -> Self {
        Loader {
            c: Checker::default(),
            profiles_dir,
            chain: vec![(canonical(root), root.to_path_buf())],
            incomplete: false,
        }
    }

    fn file(&mut self, path: &Path) -> Option<Node> {
        let id = self.c.add_file(path.to_path_buf());
        match fs::read_to_string(path) {
            Ok(text) => self.c.parse(&text, id).map(|node| self.extends(node, path)),
            Err(e) => {
                self.c.report(
                    Loc {
                        file: id,
                        ..Loc::default()
                    },
                    "",
                    format!("cannot read: {e}"),
                    None,
                );
                None
            }
        }
    }

    /// Replaces `extends:` by the merge of the target (itself resolved) under this file's keys.
    fn extends(&mut self, mut node: Node, path: &Path) -> Node {
        let Value::Map(entries) = &mut node.value else {
            return node;
        };
        let Some(pos) = entries.iter().position(|(k, _)| k.name == "extends") else {
            return node;
        };
        let (_, target) = entries.remove(pos);
        // Later duplicates were reported already; only the first one counts.
        entries.retain(|(k, _)| k.name != "extends");
        let Some(parent) = self.parent(&target, path) else {
            self.incomplete = true;
            return node;
        };
        merge(parent, node)
    }

    fn parent(&mut self, target: &Node, path: &Path) -> Option<Node> {
        let name = self.c.string(target, "extends")?;
        let file = if is_path(&name) {
            path.parent().unwrap_or(Path::new("")).join(&name)
        } else {
            self.profiles_dir.join(format!("{name}.yaml"))
        };
        if !file.is_file() {
            let available = available_profiles(self.profiles_dir);
            self.c.report(
                target.loc,
                "extends",
                not_found_message(&name, &file, &available),
                None,
            );
            return None;
        }
        let id = canonical(&file);
        if self.chain.iter().any(|(seen, _)| *seen == id) {
            let shown: Vec<String> = self
                .chain
                .iter()
                .map(|(_, p)| p.display().to_string())
                .chain([file.display().to_string()])
                .collect();
            self.c.report(
                target.loc,
                "extends",
                format!("`extends:` cycle: {}", shown.join(" → ")),
                Some("a profile cannot extend itself, directly or through others".into()),
            );
            return None;
        }
        self.chain.push((id, file.clone()));
        let parent = self.file(&file);
        self.chain.pop();
        parent
    }

    fn finish(
        mut self,
        root: Option<Node>,
        path: &Path,
        overrides: &[Override],
    ) -> Result<Profile, ConfigError> {
        let profile = root.and_then(|mut root| {
            for o in overrides {
                self.apply(&mut root, o);
            }
            validate(&mut self.c, &root, path, !self.incomplete)
        });
        self.c.finish(profile)
    }

    fn apply(&mut self, root: &mut Node, o: &Override) {
        let here = Loc {
            file: self.c.add_file(PathBuf::from(o.to_string())),
            ..Loc::default()
        };
        let parts: Vec<&str> = o.key.split('.').collect();
        if let Some(hint) = unknown_override_key(&parts) {
            self.c.report(here, &o.key, "unknown key", Some(hint));
            return;
        }
        match yaml::parse(&o.value, here.file) {
            Ok(mut value) => {
                value.relocate(&|_| here);
                set(root, &parts, value, here);
            }
            Err(e) => self
                .c
                .report(here, &o.key, format!("bad value: {}", e.message), None),
        }
    }
}

/// `None` when `--set` may change this key; otherwise a hint for the message.
fn unknown_override_key(parts: &[&str]) -> Option<String> {
    const SETTABLE: &str = "settable: model, served_model_name, launcher, port_base, api_key_env, \
                            server.KEY, health.KEY, expected.KEY, env.NAME";
    let section_keys = |s: &str| match s {
        "server" => Some(SERVER_KEYS),
        "health" => Some(HEALTH_KEYS),
        "expected" => Some(EXPECTED_KEYS),
        _ => None,
    };
    let did_you_mean = |word: &str, known: &[&str], prefix: &str| {
        Some(match suggest(word, known) {
            Some(s) => format!("did you mean `{prefix}{s}`?"),
            None => SETTABLE.to_string(),
        })
    };
    match parts {
        ["extends"] => Some("`extends:` cannot be set; name another profile instead".into()),
        ["env", name] if is_env_name(name) => None,
        ["env", _] => Some("not an environment variable name: use letters, digits and _".into()),
        [top] if *top == "env" || section_keys(top).is_some() => Some(format!(
            "`{top}` is a section: set one of its keys, e.g. `{top}.KEY=VALUE`"
        )),
        [top] if TOP_KEYS.contains(top) => None,
        [top] => {
            // A bare server key (`--set mem_fraction_static=0.8`) most likely meant server.KEY.
            if let Some(s) = suggest(top, SERVER_KEYS) {
                return Some(format!("did you mean `server.{s}`?"));
            }
            did_you_mean(top, TOP_KEYS, "")
        }
        [section, key] => match section_keys(section) {
            Some(keys) if keys.contains(key) => None,
            Some(keys) => did_you_mean(key, keys, &format!("{section}.")),
            None => Some(SETTABLE.to_string()),
        },
        _ => Some(SETTABLE.to_string()),
    }
}

fn set(node: &mut Node, parts: &[&str], value: Node, here: Loc) {
    if node.value == Value::Null {
        node.value = Value::Map(Vec::new());
    }
    // A section of the wrong type stays as written; validation reports it.
    let (Value::Map(entries), [first, rest @ ..]) = (&mut node.value, parts) else {
        return;
    };
    let i = match entries.iter().position(|(k, _)| k.name == *first) {
        Some(i) => i,
        None => {
            entries.push((
                Key {
                    name: first.to_string(),
                    loc: here,
                },
                Node {
                    loc: here,
                    value: Value::Null,
                },
            ));
            entries.len() - 1
        }
    };
    if rest.is_empty() {
        entries[i].1 = value;
    } else {
        set(&mut entries[i].1, rest, value, here);
    }
}

/// The child's keys over the parent's, recursively for mappings; lists and scalars replace.
fn merge(parent: Node, child: Node) -> Node {
    match (parent.value, child.value) {
        (Value::Map(mut base), Value::Map(over)) => {
            for (key, value) in over {
                match base.iter().position(|(k, _)| k.name == key.name) {
                    Some(i) => {
                        let old = std::mem::replace(&mut base[i].1, Node::new(Value::Null));
                        base[i] = (key, merge(old, value));
                    }
                    None => base.push((key, value)),
                }
            }
            Node {
                loc: child.loc,
                value: Value::Map(base),
            }
        }
        (_, value) => Node {
            loc: child.loc,
            value,
        },
    }
}

fn canonical(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The typed profile, or `None` when the document is not a mapping; problems go to `c`.
fn validate(c: &mut Checker, root: &Node, path: &Path, complete: bool) -> Option<Profile> {
    let top = c.fields_with(root, "", TOP_KEYS, |key| {
        let section = [("server", SERVER_KEYS), ("health", HEALTH_KEYS)]
            .into_iter()
            .find(|(_, keys)| keys.contains(&key))?;
        Some(format!("`{key}` belongs under `{}:`", section.0))
    })?;
    let required = |c: &mut Checker, name: &str| {
        if complete {
            top.required(c, name)
        } else {
            top.get(name)
        }
    };

    let model = required(c, "model")
        .and_then(|n| c.string(n, "model"))
        .unwrap_or_default();
    let served_model_name = top
        .get("served_model_name")
        .and_then(|n| c.string(n, "served_model_name"));
    let launcher = required(c, "launcher")
        .map(|n| launcher(c, n))
        .unwrap_or_default();
    let port_base = top
        .get("port_base")
        .and_then(|n| c.int(n, "port_base", 1, 65535))
        .map_or(DEFAULT_PORT_BASE, |p| p as u16);
    let server = server(c, top.get("server"));
    let env = env(c, top.get("env"));
    let health = health(c, top.get("health"));
    let api_key_env = top.get("api_key_env").and_then(|n| api_key_env(c, n));
    let expected = top.get("expected").and_then(|n| expected(c, n));

    Some(Profile {
        name: stem(path),
        path: path.to_path_buf(),
        model,
        served_model_name,
        launcher,
        port_base,
        server,
        env,
        health,
        api_key_env,
        expected,
    })
}

fn launcher(c: &mut Checker, node: &Node) -> Vec<String> {
    const EXAMPLE: &str = "e.g. [/workspace/venv/bin/python, -m, sglang.launch_server]";
    if let Value::Str(s) = &node.value {
        c.report(
            node.loc,
            "launcher",
            format!("expected a list (an argv), found the string `{s}`"),
            Some(format!("write each word as an item, {EXAMPLE}")),
        );
        return Vec::new();
    }
    let argv = c
        .list(node, "launcher", |c, n, f| c.string(n, f))
        .unwrap_or_default();
    if argv.is_empty() && matches!(&node.value, Value::Seq(items) if items.is_empty()) {
        c.report(
            node.loc,
            "launcher",
            "must not be empty",
            Some(format!("the command that starts SGLang, {EXAMPLE}")),
        );
    }
    argv
}

fn server(c: &mut Checker, node: Option<&Node>) -> ServerSettings {
    let defaults = ServerSettings {
        mem_fraction_static: None,
        context_length: None,
        attention_backend: None,
        mamba_strategy: None,
        max_running_requests: None,
        enable_metrics: true,
        host: None,
        extra_args: Vec::new(),
    };
    let Some(f) = node.and_then(|n| c.fields(n, "server", SERVER_KEYS)) else {
        return defaults;
    };
    let get = |name| f.get(name).map(|n| (n, f.field(name)));
    ServerSettings {
        mem_fraction_static: get("mem_fraction_static").and_then(|(n, field)| {
            let x = c.number(n, &field)?;
            if x > 0.0 && x < 1.0 {
                Some(x)
            } else {
                c.report(
                    n.loc,
                    &field,
                    format!("{x:?} is out of range"),
                    Some("must be between 0 and 1 (exclusive), e.g. 0.85".into()),
                );
                None
            }
        }),
        context_length: get("context_length")
            .and_then(|(n, field)| c.int(n, &field, 1, u32::MAX.into()).map(|v| v as u32)),
        attention_backend: get("attention_backend").and_then(|(n, field)| c.string(n, &field)),
        mamba_strategy: get("mamba_strategy").and_then(|(n, field)| mamba_strategy(c, n, &field)),
        max_running_requests: get("max_running_requests")
            .and_then(|(n, field)| c.int(n, &field, 1, u32::MAX.into()).map(|v| v as u32)),
        enable_metrics: get("enable_metrics")
            .and_then(|(n, field)| c.bool(n, &field))
            .unwrap_or(true),
        host: get("host").and_then(|(n, field)| c.string(n, &field)),
        extra_args: get("extra_args")
            .map(|(n, field)| extra_args(c, n, &field))
            .unwrap_or_default(),
    }
}

fn mamba_strategy(c: &mut Checker, node: &Node, field: &str) -> Option<MambaStrategy> {
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

fn extra_args(c: &mut Checker, node: &Node, field: &str) -> Vec<String> {
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
        if let Some((_, key)) = FLAGS_FLEET_SETS.iter().find(|(f, _)| *f == flag) {
            c.report(
                item.loc,
                &item_field,
                format!("`{flag}` is set by fleet"),
                Some(format!("use `{key}` instead")),
            );
        }
        args.push(arg);
    }
    args
}

fn env(c: &mut Checker, node: Option<&Node>) -> std::collections::BTreeMap<String, String> {
    let mut env = std::collections::BTreeMap::new();
    let Some(node) = node else { return env };
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

fn health(c: &mut Checker, node: Option<&Node>) -> HealthSettings {
    let f = node.and_then(|n| c.fields(n, "health", HEALTH_KEYS));
    let node = |name: &str| {
        f.as_ref()
            .and_then(|f| f.get(name).map(|n| (n, f.field(name))))
    };
    let mut duration = |name: &str, default: Duration| match node(name) {
        Some((n, field)) => c.duration(n, &field).unwrap_or(default),
        None => default,
    };
    let health = HealthSettings {
        startup_timeout: duration("startup_timeout", DEFAULT_STARTUP_TIMEOUT),
        poll: duration("poll", DEFAULT_POLL),
    };
    if health.poll >= health.startup_timeout
        && let Some((n, field)) = node("poll").or_else(|| node("startup_timeout"))
    {
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
    health
}

fn api_key_env(c: &mut Checker, node: &Node) -> Option<String> {
    let name = c.string(node, "api_key_env")?;
    if is_env_name(&name) {
        return Some(name);
    }
    // Never echo the value: it may be the key itself.
    c.report(
        node.loc,
        "api_key_env",
        "must be the name of an environment variable (letters, digits, _)",
        Some(
            "name the variable that holds the key, e.g. FLEET_API_KEY, never the key itself".into(),
        ),
    );
    None
}

fn expected(c: &mut Checker, node: &Node) -> Option<Expected> {
    let f: Fields = c.fields(node, "expected", EXPECTED_KEYS)?;
    let tok = f.required(c, "output_tok_s_per_gpu").and_then(|n| {
        let field = f.field("output_tok_s_per_gpu");
        let x = c.number(n, &field)?;
        if x > 0.0 {
            Some(x)
        } else {
            c.report(
                n.loc,
                &field,
                format!("{x:?} is out of range"),
                Some("must be above 0".into()),
            );
            None
        }
    });
    let cap = f
        .required(c, "max_running_requests")
        .and_then(|n| c.int(n, &f.field("max_running_requests"), 1, u32::MAX.into()));
    Some(Expected {
        output_tok_s_per_gpu: tok?,
        max_running_requests: cap? as u32,
    })
}

impl Profile {
    /// The resolved profile as YAML that `load_profile` reads back to an equal profile.
    pub fn to_yaml(&self) -> String {
        let opt_str = |s: &Option<String>| s.clone().map_or(Value::Null, Value::Str);
        let strs =
            |v: &[String]| Value::Seq(v.iter().map(|s| Node::new(Value::Str(s.clone()))).collect());
        let dur = |d: Duration| Value::Str(humantime::format_duration(d).to_string());
        let s = &self.server;
        let mut doc = vec![("model", Value::Str(self.model.clone()))];
        if self.served_model_name.is_some() {
            doc.push(("served_model_name", opt_str(&self.served_model_name)));
        }
        doc.extend([
            ("launcher", strs(&self.launcher)),
            ("port_base", Value::Int(self.port_base.into())),
            (
                "server",
                Value::map([
                    (
                        "mem_fraction_static",
                        s.mem_fraction_static.map_or(Value::Null, Value::Float),
                    ),
                    (
                        "context_length",
                        s.context_length
                            .map_or(Value::Null, |v| Value::Int(v.into())),
                    ),
                    ("attention_backend", opt_str(&s.attention_backend)),
                    (
                        "mamba_strategy",
                        s.mamba_strategy
                            .map_or(Value::Null, |m| Value::Str(m.as_str().into())),
                    ),
                    (
                        "max_running_requests",
                        s.max_running_requests
                            .map_or(Value::Null, |v| Value::Int(v.into())),
                    ),
                    ("enable_metrics", Value::Bool(s.enable_metrics)),
                    ("host", opt_str(&s.host)),
                    ("extra_args", strs(&s.extra_args)),
                ]),
            ),
            (
                "env",
                Value::map(
                    self.env
                        .iter()
                        .map(|(k, v)| (k.as_str(), Value::Str(v.clone()))),
                ),
            ),
            (
                "health",
                Value::map([
                    ("startup_timeout", dur(self.health.startup_timeout)),
                    ("poll", dur(self.health.poll)),
                ]),
            ),
        ]);
        if self.api_key_env.is_some() {
            doc.push(("api_key_env", opt_str(&self.api_key_env)));
        }
        if let Some(e) = &self.expected {
            doc.push(("expected", expected_value(e)));
        }
        render(&Value::map(doc))
    }

    /// Checks `port_base + i ≤ 65535` for every GPU index the inventory lists (hosts with
    /// `gpus: all` are checked with [`Profile::port_for_gpu`] once their GPUs are known).
    pub fn check_ports(&self, inventory: &Inventory) -> Result<(), ConfigError> {
        let problems: Vec<Problem> = inventory
            .hosts
            .iter()
            .filter_map(|h| match &h.gpus {
                GpuSelection::List(gpus) => gpus.iter().max().map(|g| (h, *g)),
                GpuSelection::All => None,
            })
            .filter_map(|(h, gpu)| self.port_problem(&h.name, gpu))
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// The port GPU `gpu` of `host` listens on.
    pub fn port_for_gpu(&self, host: &str, gpu: u32) -> Result<u16, ConfigError> {
        match self.port_problem(host, gpu) {
            Some(p) => Err(ConfigError::Invalid(vec![p])),
            None => Ok((u32::from(self.port_base) + gpu) as u16),
        }
    }

    fn port_problem(&self, host: &str, gpu: u32) -> Option<Problem> {
        let port = u32::from(self.port_base) + gpu;
        (port > 65535).then(|| Problem {
            file: self.path.clone(),
            line: 0,
            column: 0,
            field: "port_base".into(),
            message: format!(
                "GPU {gpu} of host `{host}` would listen on port {port} ({} + {gpu}), above 65535",
                self.port_base
            ),
            hint: Some(format!("use a port_base of at most {}", 65535 - gpu)),
        })
    }
}

fn expected_value(e: &Expected) -> Value {
    Value::map([
        ("output_tok_s_per_gpu", Value::Float(e.output_tok_s_per_gpu)),
        (
            "max_running_requests",
            Value::Int(e.max_running_requests.into()),
        ),
    ])
}

fn render(doc: &Value) -> String {
    serde_saphyr::to_string(doc).expect("a tree of plain YAML values always serializes")
}

/// A profile that says `extends: <base>` and changes only `overrides` (and records what a sweep
/// measured in `expected:`), for `fleet sweep --write-profile`. A `base` given as a relative path
/// resolves from the written file's directory, so pass a name or an absolute path.
pub fn derived_profile_yaml(
    base: &str,
    overrides: &[Override],
    expected: Option<&Expected>,
    comment: &str,
) -> String {
    let mut root = Node::new(Value::map([("extends", Value::Str(base.to_string()))]));
    for o in overrides {
        let parts: Vec<&str> = o.key.split('.').collect();
        let value = yaml::parse(&o.value, 0).map_or_else(
            |_| Node::new(Value::Str(o.value.clone())),
            |mut n| {
                n.relocate(&|_| Loc::default());
                n
            },
        );
        set(&mut root, &parts, value, Loc::default());
    }
    if let Some(e) = expected {
        set(
            &mut root,
            &["expected"],
            Node::new(expected_value(e)),
            Loc::default(),
        );
    }
    let header: String = comment
        .lines()
        .map(|l| format!("# {l}\n").replace("# \n", "#\n"))
        .collect();
    header + &render(&root.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const BASE: &str = "model: /models/Qwen3.6-27B
served_model_name: qwen3.6-27b
launcher: [/workspace/venv/bin/python, -m, sglang.launch_server]
port_base: 30000
server:
  mem_fraction_static: 0.85
  context_length: 8192
  attention_backend: flashinfer
  mamba_strategy: no_buffer
  max_running_requests: null
  extra_args: [--trust-remote-code]
env: {HF_HUB_OFFLINE: \"1\"}
health: {startup_timeout: 20m, poll: 1s}
api_key_env: FLEET_API_KEY
";

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            fs::File::create(dir.path().join(name))
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        dir
    }

    fn problems(r: Result<Profile, ConfigError>) -> Vec<Problem> {
        match r {
            Err(ConfigError::Invalid(p)) => p,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn the_design_example_loads_with_its_values() {
        let dir = dir_with(&[("base.yaml", BASE)]);
        let p = load_profile("base", dir.path()).unwrap();
        assert_eq!(p.name, "base");
        assert_eq!(
            p.launcher,
            ["/workspace/venv/bin/python", "-m", "sglang.launch_server"]
        );
        assert_eq!(p.server.mem_fraction_static, Some(0.85));
        assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::NoBuffer));
        assert_eq!(p.server.max_running_requests, None);
        assert!(p.server.enable_metrics);
        assert_eq!(p.env["HF_HUB_OFFLINE"], "1");
        assert_eq!(p.health.startup_timeout, Duration::from_secs(1200));
        assert_eq!(p.api_key_env.as_deref(), Some("FLEET_API_KEY"));
    }

    #[test]
    fn extends_overrides_nested_keys_and_keeps_the_rest() {
        let child =
            "extends: base\nserver:\n  mamba_strategy: extra_buffer\nenv:\n  NCCL_DEBUG: WARN\n";
        let dir = dir_with(&[("base.yaml", BASE), ("child.yaml", child)]);
        let p = load_profile("child", dir.path()).unwrap();
        assert_eq!(p.name, "child");
        assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::ExtraBuffer));
        assert_eq!(p.server.context_length, Some(8192));
        assert_eq!(p.env.len(), 2);
    }

    #[test]
    fn problems_in_the_extended_file_name_that_file() {
        let dir = dir_with(&[
            ("base.yaml", "model: m\nlauncher: [x]\nport_base: 0\n"),
            ("child.yaml", "extends: base\n"),
        ]);
        let p = problems(load_profile("child", dir.path()));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].file.ends_with("base.yaml"), "{p:?}");
        assert_eq!(
            (p[0].line, p[0].column, p[0].field.as_str()),
            (3, 12, "port_base")
        );
    }

    #[test]
    fn a_cycle_names_the_chain() {
        let dir = dir_with(&[
            ("a.yaml", "extends: b\nmodel: m\n"),
            ("b.yaml", "extends: a\n"),
        ]);
        let p = problems(load_profile("a", dir.path()));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].message.contains("a.yaml → ") && p[0].message.contains("b.yaml → "),
            "{}",
            p[0].message
        );
        assert!(p[0].file.ends_with("b.yaml"));
    }

    #[test]
    fn overrides_apply_after_extends_and_before_validation() {
        let dir = dir_with(&[("base.yaml", BASE)]);
        let set = |k: &str, v: &str| Override {
            key: k.into(),
            value: v.into(),
        };
        let p = load_profile_with(
            "base",
            dir.path(),
            &[
                set("server.mamba_strategy", "extra_buffer"),
                set("server.max_running_requests", "64"),
                set("env.X", "1"),
            ],
        )
        .unwrap();
        assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::ExtraBuffer));
        assert_eq!(p.server.max_running_requests, Some(64));
        assert_eq!(p.env["X"], "1");

        let p = problems(load_profile_with(
            "base",
            dir.path(),
            &[
                set("server.mem_fraction_statc", "0.9"),
                set("server.mem_fraction_static", "2"),
            ],
        ));
        let shown: Vec<String> = p.iter().map(Problem::to_string).collect();
        assert_eq!(
            shown,
            [
                "--set server.mem_fraction_statc=0.9: server.mem_fraction_statc: unknown key (did you mean `server.mem_fraction_static`?)",
                "--set server.mem_fraction_static=2: server.mem_fraction_static: 2.0 is out of range (must be between 0 and 1 (exclusive), e.g. 0.85)",
            ]
        );
    }

    #[test]
    fn to_yaml_reloads_to_the_same_profile() {
        let dir = dir_with(&[("base.yaml", BASE)]);
        let p = load_profile("base", dir.path()).unwrap();
        let again =
            profile_from_str(&p.to_yaml(), &dir.path().join("base.yaml"), dir.path()).unwrap();
        assert_eq!(again, p, "{}", p.to_yaml());
    }

    #[test]
    fn a_derived_profile_loads_with_its_overrides_and_measurements() {
        let dir = dir_with(&[("base.yaml", BASE)]);
        let expected = Expected {
            output_tok_s_per_gpu: 1180.5,
            max_running_requests: 72,
        };
        let text = derived_profile_yaml(
            "base",
            &[Override {
                key: "server.mamba_strategy".into(),
                value: "extra_buffer".into(),
            }],
            Some(&expected),
            "winner of fleet sweep\n\nmeasured 2026-11-29",
        );
        assert_eq!(
            text,
            "# winner of fleet sweep\n#\n# measured 2026-11-29\nextends: base\nserver:\n  \
             mamba_strategy: extra_buffer\nexpected:\n  output_tok_s_per_gpu: 1180.5\n  \
             max_running_requests: 72\n"
        );
        fs::write(dir.path().join("won.yaml"), &text).unwrap();
        let p = load_profile("won", dir.path()).unwrap();
        assert_eq!(p.server.mamba_strategy, Some(MambaStrategy::ExtraBuffer));
        assert_eq!(p.expected, Some(expected));
        assert_eq!(p.model, "/models/Qwen3.6-27B");
    }

    #[test]
    fn names_and_paths_resolve_and_a_miss_lists_what_exists() {
        let dir = dir_with(&[("blackwell.yaml", BASE)]);
        assert_eq!(
            resolve_profile_path("blackwell", dir.path()).unwrap(),
            dir.path().join("blackwell.yaml")
        );
        let path = dir.path().join("blackwell.yaml");
        assert_eq!(
            resolve_profile_path(path.to_str().unwrap(), Path::new("/nonexistent")).unwrap(),
            path
        );
        let e = resolve_profile_path("blackwel", dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did you mean `blackwell`?") && e.contains("available: blackwell"),
            "{e}"
        );
    }

    #[test]
    fn ports_above_65535_are_refused() {
        let dir = dir_with(&[("p.yaml", "model: m\nlauncher: [x]\nport_base: 65530\n")]);
        let p = load_profile("p", dir.path()).unwrap();
        assert_eq!(p.port_for_gpu("h", 5).unwrap(), 65535);
        let e = p.port_for_gpu("h", 7).unwrap_err().to_string();
        assert!(
            e.contains("port 65537 (65530 + 7), above 65535") && e.contains("at most 65528"),
            "{e}"
        );
    }

    #[test]
    fn the_shipped_blackwell_profiles_match_the_seed_setup() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
        let no = load_profile("blackwell-no-buffer", &dir).unwrap();
        let extra = load_profile("blackwell-extra-buffer", &dir).unwrap();
        assert_eq!(no.model, "/models/Qwen3.6-27B");
        assert_eq!(no.port_base, 30000);
        assert_eq!(no.server.mem_fraction_static, Some(0.85));
        assert_eq!(no.server.attention_backend.as_deref(), Some("flashinfer"));
        assert_eq!(no.server.extra_args, ["--trust-remote-code"]);
        assert_eq!(no.health.startup_timeout, Duration::from_secs(20 * 60));
        assert_eq!(no.server.mamba_strategy, Some(MambaStrategy::NoBuffer));
        assert_eq!(
            extra.server.mamba_strategy,
            Some(MambaStrategy::ExtraBuffer)
        );
        let same_otherwise = Profile {
            name: no.name.clone(),
            path: no.path.clone(),
            server: ServerSettings {
                mamba_strategy: no.server.mamba_strategy,
                ..extra.server.clone()
            },
            ..extra
        };
        assert_eq!(same_otherwise, no);
    }

    #[test]
    fn to_yaml_keeps_strings_that_look_like_other_things() {
        let text = r#"model: "/models/a: b # c"
launcher: ["python", "-c", "print('x'); $(id)", "yes", "no", "null", "~", "1.10", "multi
  line"]
env: {A: "true", B: "0x10", C: "-", D: ""}
"#;
        let dir = dir_with(&[]);
        let p = profile_from_str(text, &dir.path().join("odd.yaml"), dir.path()).unwrap();
        assert_eq!(p.launcher[2], "print('x'); $(id)");
        assert_eq!(p.launcher[8], "multi line");
        let again =
            profile_from_str(&p.to_yaml(), &dir.path().join("odd.yaml"), dir.path()).unwrap();
        assert_eq!(again, p, "{}", p.to_yaml());
    }

    #[test]
    fn override_keys_outside_the_schema_are_named() {
        let dir = dir_with(&[("base.yaml", BASE)]);
        let hints: Vec<Option<String>> = [
            "mem_fraction_static",
            "server",
            "extends",
            "server.tp",
            "gpu.x",
            "env.1X",
        ]
        .iter()
        .map(|k| {
            let o = Override {
                key: k.to_string(),
                value: "1".into(),
            };
            let p = problems(load_profile_with("base", dir.path(), &[o]));
            assert_eq!(
                (p[0].field.as_str(), p[0].message.as_str(), p[0].line),
                (*k, "unknown key", 0)
            );
            assert_eq!(p[0].file, PathBuf::from(format!("--set {k}=1")));
            p[0].hint.clone()
        })
        .collect();
        assert_eq!(
            hints[0].as_deref(),
            Some("did you mean `server.mem_fraction_static`?")
        );
        assert!(
            hints[1]
                .as_deref()
                .unwrap()
                .contains("`server` is a section")
        );
        assert!(hints[2].as_deref().unwrap().contains("cannot be set"));
        assert!(hints[3].as_deref().unwrap().starts_with("settable:"));
        assert!(hints[4].as_deref().unwrap().starts_with("settable:"));
        assert!(
            hints[5]
                .as_deref()
                .unwrap()
                .contains("environment variable")
        );
    }

    #[test]
    fn poll_must_be_shorter_than_the_startup_timeout() {
        let dir = dir_with(&[(
            "p.yaml",
            "model: m\nlauncher: [x]\nhealth: {startup_timeout: 30s, poll: 1m}\n",
        )]);
        let p = problems(load_profile("p", dir.path()));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            (p[0].line, p[0].column, p[0].field.as_str()),
            (3, 38, "health.poll")
        );
        assert_eq!(
            p[0].hint.as_deref(),
            Some("startup_timeout is 30s, poll is 1m")
        );
    }
}

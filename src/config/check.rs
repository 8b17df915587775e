//! Field-by-field validation of a located YAML tree: typed getters that record a [`Problem`] at
//! the node's place instead of stopping, so one pass reports everything wrong with a file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::yaml::{self, Key, Loc, Node, Value};
use super::{ConfigError, Problem};

/// Collects problems across the files of one load (a profile and the ones it extends).
#[derive(Debug, Default)]
pub struct Checker {
    files: Vec<PathBuf>,
    /// With the index of their file, for ordering: files in the order they were read.
    problems: Vec<(usize, Problem)>,
}

impl Checker {
    /// Registers a file (or a pseudo-file such as `--set KEY=V`) that places can point into.
    pub fn add_file(&mut self, path: PathBuf) -> usize {
        self.files.push(path);
        self.files.len() - 1
    }

    pub fn report(
        &mut self,
        loc: Loc,
        field: &str,
        message: impl Into<String>,
        hint: Option<String>,
    ) {
        self.problems.push((
            loc.file,
            Problem {
                file: self.files.get(loc.file).cloned().unwrap_or_default(),
                line: loc.line,
                column: loc.column,
                field: field.to_string(),
                message: message.into(),
                hint,
            },
        ));
    }

    /// `Ok(value)` when nothing was reported; otherwise every problem, in file order.
    pub fn finish<T>(mut self, value: Option<T>) -> Result<T, ConfigError> {
        match value {
            Some(v) if self.problems.is_empty() => Ok(v),
            _ => {
                // Stable: problems at one place keep the order they were found in.
                self.problems
                    .sort_by_key(|(file, p)| (*file, p.line, p.column));
                Err(ConfigError::Invalid(
                    self.problems.into_iter().map(|(_, p)| p).collect(),
                ))
            }
        }
    }

    /// Parses `text` as file `file`; a syntax error is reported and yields `None`.
    pub fn parse(&mut self, text: &str, file: usize) -> Option<Node> {
        match yaml::parse(text, file) {
            Ok(node) => {
                self.duplicates(&node, "");
                Some(node)
            }
            Err(e) => {
                let loc = Loc { file, ..e.loc };
                self.report(loc, "", format!("YAML syntax error: {}", e.message), None);
                None
            }
        }
    }

    /// Reports every repeated key in every mapping of a freshly parsed file.
    fn duplicates(&mut self, node: &Node, path: &str) {
        match &node.value {
            Value::Map(entries) => {
                let mut seen: BTreeMap<&str, Loc> = BTreeMap::new();
                for (key, value) in entries {
                    let field = join(path, &key.name);
                    match seen.get(key.name.as_str()) {
                        Some(first) => self.report(
                            key.loc,
                            &field,
                            "duplicate key",
                            Some(format!(
                                "first set on line {}; keep one of them",
                                first.line
                            )),
                        ),
                        None => {
                            seen.insert(&key.name, key.loc);
                        }
                    }
                    self.duplicates(value, &field);
                }
            }
            Value::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.duplicates(item, &format!("{path}[{i}]"));
                }
            }
            _ => {}
        }
    }

    /// Reads a mapping whose keys must be among `known`; unknown keys are reported with the
    /// closest known one. `None` (reported) when the node is not a mapping; null reads as empty.
    pub fn fields<'n>(&mut self, node: &'n Node, path: &str, known: &[&str]) -> Option<Fields<'n>> {
        self.fields_with(node, path, known, |_| None)
    }

    /// [`Checker::fields`], with `elsewhere` explaining a key that belongs in another section.
    pub fn fields_with<'n>(
        &mut self,
        node: &'n Node,
        path: &str,
        known: &[&str],
        elsewhere: impl Fn(&str) -> Option<String>,
    ) -> Option<Fields<'n>> {
        let entries: &[(Key, Node)] = match &node.value {
            Value::Map(entries) => entries,
            Value::Null => &[],
            other => {
                self.wrong_type(
                    node.loc,
                    if path.is_empty() { "(document)" } else { path },
                    "a mapping",
                    other,
                );
                return None;
            }
        };
        let mut map = BTreeMap::new();
        for (key, value) in entries {
            if known.contains(&key.name.as_str()) {
                map.entry(key.name.as_str()).or_insert((key, value));
                continue;
            }
            let hint = elsewhere(&key.name)
                .or_else(|| suggest(&key.name, known).map(|s| format!("did you mean `{s}`?")))
                .unwrap_or_else(|| format!("known keys: {}", known.join(", ")));
            self.report(key.loc, &join(path, &key.name), "unknown key", Some(hint));
        }
        Some(Fields {
            path: path.to_string(),
            loc: node.loc,
            map,
        })
    }

    /// Reads a mapping with free-form keys (e.g. `env:`), in file order, first of duplicates.
    pub fn entries<'n>(&mut self, node: &'n Node, path: &str) -> Vec<(&'n Key, &'n Node)> {
        match &node.value {
            Value::Map(entries) => {
                let mut seen = std::collections::BTreeSet::new();
                entries
                    .iter()
                    .filter(|(k, _)| seen.insert(k.name.as_str()))
                    .map(|(k, v)| (k, v))
                    .collect()
            }
            Value::Null => Vec::new(),
            other => {
                self.wrong_type(node.loc, path, "a mapping", other);
                Vec::new()
            }
        }
    }

    pub fn wrong_type(&mut self, loc: Loc, field: &str, expected: &str, found: &Value) {
        let hint = match found {
            Value::Str(s) if s.parse::<f64>().is_ok() || s == "true" || s == "false" => {
                Some("write it without quotes".to_string())
            }
            _ => None,
        };
        self.report(
            loc,
            field,
            format!("expected {expected}, found {}", describe(found)),
            hint,
        );
    }

    pub fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) if s.trim().is_empty() => {
                self.report(node.loc, field, "must not be empty", None);
                None
            }
            Value::Str(s) => Some(s.clone()),
            other => {
                self.wrong_type(node.loc, field, "a string", other);
                None
            }
        }
    }

    /// Text for an argv element or environment value: strings, integers and booleans are taken
    /// as written; a float is refused because its text would not survive (`1.10` reads as 1.1).
    pub fn text(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            Value::Int(i) => Some(i.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            other => {
                self.report(
                    node.loc,
                    field,
                    format!("expected a string, found {}", describe(other)),
                    Some("quote it, e.g. \"1.10\"".into()),
                );
                None
            }
        }
    }

    pub fn int(&mut self, node: &Node, field: &str, min: i128, max: i128) -> Option<i128> {
        match &node.value {
            Value::Int(i) if (min..=max).contains(i) => Some(*i),
            Value::Int(i) => {
                self.report(
                    node.loc,
                    field,
                    format!("{i} is out of range"),
                    Some(range(min, max)),
                );
                None
            }
            other => {
                self.wrong_type(node.loc, field, "an integer", other);
                None
            }
        }
    }

    /// A number (integer or float); range checks are the caller's, as they differ in openness.
    pub fn number(&mut self, node: &Node, field: &str) -> Option<f64> {
        match &node.value {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) if f.is_finite() => Some(*f),
            other => {
                self.wrong_type(node.loc, field, "a number", other);
                None
            }
        }
    }

    pub fn bool(&mut self, node: &Node, field: &str) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            other => {
                self.wrong_type(node.loc, field, "true or false", other);
                None
            }
        }
    }

    /// A humane duration (`90s`, `20m`, `1h 30m`), strictly positive.
    pub fn duration(&mut self, node: &Node, field: &str) -> Option<Duration> {
        const HINT: &str = "use a number with a unit, e.g. 90s, 20m, 1h";
        match &node.value {
            Value::Str(s) => match humantime::parse_duration(s.trim()) {
                Ok(d) if d.is_zero() => {
                    self.report(node.loc, field, "must be longer than 0", Some(HINT.into()));
                    None
                }
                Ok(d) => Some(d),
                Err(e) => {
                    self.report(
                        node.loc,
                        field,
                        format!("bad duration `{s}`: {e}"),
                        Some(HINT.into()),
                    );
                    None
                }
            },
            Value::Int(_) | Value::Float(_) => {
                self.report(
                    node.loc,
                    field,
                    "a duration needs a unit",
                    Some(HINT.into()),
                );
                None
            }
            other => {
                self.wrong_type(node.loc, field, "a duration", other);
                None
            }
        }
    }

    /// A list whose items are read with `item`; `None` if the node is not a list or any item
    /// is bad (all of them reported).
    pub fn list<T>(
        &mut self,
        node: &Node,
        field: &str,
        mut item: impl FnMut(&mut Self, &Node, &str) -> Option<T>,
    ) -> Option<Vec<T>> {
        let Value::Seq(items) = &node.value else {
            self.wrong_type(node.loc, field, "a list", &node.value);
            return None;
        };
        let read: Vec<Option<T>> = items
            .iter()
            .enumerate()
            .map(|(i, n)| item(self, n, &format!("{field}[{i}]")))
            .collect();
        read.into_iter().collect()
    }
}

/// The known keys of one mapping, by name.
pub struct Fields<'n> {
    pub path: String,
    /// The mapping's own place, where a missing key is reported.
    pub loc: Loc,
    map: BTreeMap<&'n str, (&'n Key, &'n Node)>,
}

impl<'n> Fields<'n> {
    /// The key's value, `None` when absent or null (null means "not set").
    pub fn get(&self, name: &str) -> Option<&'n Node> {
        self.map
            .get(name)
            .map(|(_, v)| *v)
            .filter(|v| v.value != Value::Null)
    }

    pub fn field(&self, name: &str) -> String {
        join(&self.path, name)
    }

    /// Like `get`, but a missing or null value is reported.
    pub fn required(&self, c: &mut Checker, name: &str) -> Option<&'n Node> {
        let found = self.get(name);
        if found.is_none() {
            let (loc, message) = match self.map.get(name) {
                Some((key, _)) => (key.loc, "must have a value"),
                None => (self.loc, "missing required key"),
            };
            c.report(loc, &self.field(name), message, None);
        }
        found
    }
}

pub fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Str(s) => format!("the string `{s}`"),
        Value::Int(i) => format!("the integer {i}"),
        Value::Float(f) => format!("the number {f}"),
        Value::Bool(b) => format!("`{b}`"),
        other => other.kind().to_string(),
    }
}

fn range(min: i128, max: i128) -> String {
    // A type limit such as u32::MAX tells the user nothing.
    if max >= i128::from(u32::MAX) {
        format!("must be at least {min}")
    } else {
        format!("must be {min}..={max}")
    }
}

/// The known word a misspelt one most likely meant (`mem-fraction-static`, `mem_fraction_statc`
/// and `mamba_scheduler_strategy` all find their key).
pub fn suggest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let word = word.replace('-', "_").to_ascii_lowercase();
    let score = |k: &str| {
        let k = k.to_ascii_lowercase();
        strsim::jaro_winkler(&word, &k).max(strsim::normalized_damerau_levenshtein(&word, &k))
    };
    known
        .iter()
        .map(|k| (*k, score(k)))
        .filter(|(_, score)| *score >= 0.8)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _)| k)
}

/// `[A-Za-z_][A-Za-z0-9_]*`: what a shell accepts as a variable name.
pub fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_find_the_meant_key() {
        let known = [
            "mem_fraction_static",
            "context_length",
            "mamba_strategy",
            "host",
        ];
        assert_eq!(
            suggest("mem_fraction_statc", &known),
            Some("mem_fraction_static")
        );
        assert_eq!(
            suggest("mem-fraction-static", &known),
            Some("mem_fraction_static")
        );
        assert_eq!(
            suggest("mamba_scheduler_strategy", &known),
            Some("mamba_strategy")
        );
        assert_eq!(suggest("contxt_length", &known), Some("context_length"));
        assert_eq!(suggest("tensor_parallel", &known), None);
    }

    #[test]
    fn env_names() {
        assert!(is_env_name("FLEET_API_KEY"));
        assert!(is_env_name("_x1"));
        assert!(!is_env_name("1X"));
        assert!(!is_env_name("sk-abc"));
        assert!(!is_env_name(""));
    }
}

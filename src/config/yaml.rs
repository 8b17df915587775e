//! A located YAML tree: serde-saphyr parses the text and every node and mapping key keeps its
//! line and column, so validation can report all problems at once, each at its place.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_saphyr::{DuplicateKeyPolicy, Spanned};

/// Where a node came from: a file (an index into the loader's file list) and a 1-based line and
/// column; line 0 when the value has no place in a file (a `--set` override).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Loc {
    pub file: usize,
    pub line: usize,
    pub column: usize,
}

impl Loc {
    fn of(l: serde_saphyr::Location) -> Self {
        Loc {
            file: 0,
            line: l.line() as usize,
            column: l.column() as usize,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub loc: Loc,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in file order; duplicates are kept so that validation can report them.
    Map(Vec<(Key, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    pub name: String,
    pub loc: Loc,
}

impl Value {
    /// What the user wrote, in words, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// A YAML text that could not be parsed at all.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub loc: Loc,
    pub message: String,
}

/// Parses one YAML document, tagging every place with `file`. An empty document is `Null`.
pub fn parse(text: &str, file: usize) -> Result<Node, SyntaxError> {
    let mut node = parse_untagged(text)?;
    node.relocate(&|loc| Loc { file, ..loc });
    Ok(node)
}

/// Whether two YAML texts mean the same value (`0.8` and `0.80`, `null` and `~`, `a` and
/// `"a"`); texts that do not parse are compared as written.
pub fn same_value(a: &str, b: &str) -> bool {
    let unplaced = |text: &str| {
        parse(text, 0).ok().map(|mut n| {
            n.relocate(&|_| Loc::default());
            n
        })
    };
    match (unplaced(a), unplaced(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

impl Node {
    /// Rewrites every place in the tree (its own, its items', its keys').
    pub fn relocate(&mut self, f: &impl Fn(Loc) -> Loc) {
        self.loc = f(self.loc);
        match &mut self.value {
            Value::Seq(items) => items.iter_mut().for_each(|n| n.relocate(f)),
            Value::Map(entries) => entries.iter_mut().for_each(|(k, n)| {
                k.loc = f(k.loc);
                n.relocate(f);
            }),
            _ => {}
        }
    }
}

fn parse_untagged(text: &str) -> Result<Node, SyntaxError> {
    // Duplicates pass through so `check` can report each with both places; YAML 1.2 booleans
    // only, so `HF_HUB_OFFLINE: no` stays the string it looks like.
    let options = serde_saphyr::options! {
        duplicate_keys: DuplicateKeyPolicy::PassThrough,
        strict_booleans: true,
        with_snippet: false,
    };
    match serde_saphyr::from_str_with_options::<Option<Spanned<Value>>>(text, options) {
        Ok(Some(s)) => Ok(Node {
            loc: Loc::of(s.referenced),
            value: s.value,
        }),
        Ok(None) => Ok(Node {
            loc: Loc {
                file: 0,
                line: 1,
                column: 1,
            },
            value: Value::Null,
        }),
        Err(e) => {
            let loc = e.location().map(Loc::of).unwrap_or_default();
            Err(SyntaxError {
                loc,
                message: syntax_message(&e),
            })
        }
    }
}

/// serde-saphyr's message, without the location it appends (we print our own `path:line:col`).
fn syntax_message(e: &serde_saphyr::Error) -> String {
    if matches!(e, serde_saphyr::Error::MultipleDocuments { .. }) {
        // Its own text points developers at another API.
        return "more than one YAML document (a `---` line starts a second one; remove it)".into();
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("").trim();
    let cut = first
        .find(" at line ")
        .map(|i| &first[..i])
        .unwrap_or(first);
    cut.trim_end_matches(':').trim().to_string()
}

/// Writes the tree back as YAML (mapping entries in their order), for `Profile::to_yaml`.
impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => match i64::try_from(*i) {
                Ok(i) => s.serialize_i64(i),
                Err(_) => s.serialize_i128(*i),
            },
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(v) => s.serialize_str(v),
            Value::Seq(items) => s.collect_seq(items.iter().map(|n| &n.value)),
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(&k.name, &v.value)?;
                }
                map.end()
            }
        }
    }
}

impl Node {
    /// A node made by fleet rather than read from a file.
    pub fn new(value: Value) -> Self {
        Node {
            loc: Loc::default(),
            value,
        }
    }
}

impl Value {
    /// A mapping made by fleet, entries in the given order.
    pub fn map<'a>(entries: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| {
                    (
                        Key {
                            name: k.to_string(),
                            loc: Loc::default(),
                        },
                        Node::new(v),
                    )
                })
                .collect(),
        )
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Int(v.into()))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        i128::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom("integer too large"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(s) = seq.next_element::<Spanned<Value>>()? {
            items.push(Node {
                loc: Loc::of(s.referenced),
                value: s.value,
            });
        }
        Ok(Value::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(k) = map.next_key::<Spanned<Value>>()? {
            let name = match k.value {
                Value::Str(s) => s,
                // Keys like `1:` or `true:` never name a field; keep their text for the message.
                Value::Int(i) => i.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Float(f) => f.to_string(),
                Value::Null => "null".to_string(),
                Value::Seq(_) | Value::Map(_) => {
                    return Err(de::Error::custom("a mapping key must be a plain scalar"));
                }
            };
            let v = map.next_value::<Spanned<Value>>()?;
            entries.push((
                Key {
                    name,
                    loc: Loc::of(k.referenced),
                },
                Node {
                    loc: Loc::of(v.referenced),
                    value: v.value,
                },
            ));
        }
        Ok(Value::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(n: &Node) -> &[(Key, Node)] {
        match &n.value {
            Value::Map(m) => m,
            other => panic!("not a map: {other:?}"),
        }
    }

    #[test]
    fn scalars_are_typed_and_located() {
        let n = parse(
            "a: 0.85\nb: 30000\nc: no_buffer\nd: \"1\"\ne: ~\nf: true\ng: no\n",
            0,
        )
        .unwrap();
        let m = map(&n);
        let values: Vec<_> = m
            .iter()
            .map(|(k, v)| (k.name.as_str(), v.value.clone()))
            .collect();
        assert_eq!(
            values,
            vec![
                ("a", Value::Float(0.85)),
                ("b", Value::Int(30000)),
                ("c", Value::Str("no_buffer".into())),
                ("d", Value::Str("1".into())),
                ("e", Value::Null),
                ("f", Value::Bool(true)),
                ("g", Value::Str("no".into())),
            ]
        );
        assert_eq!(
            m[1].0.loc,
            Loc {
                file: 0,
                line: 2,
                column: 1
            }
        );
        assert_eq!(
            m[1].1.loc,
            Loc {
                file: 0,
                line: 2,
                column: 4
            }
        );
    }

    #[test]
    fn nested_nodes_keep_their_lines_and_duplicates_survive() {
        let n = parse("server:\n  x: 1\n  y: [a, b]\n  x: 2\n", 0).unwrap();
        let server = map(&n);
        let inner = map(&server[0].1);
        let names: Vec<_> = inner
            .iter()
            .map(|(k, _)| (k.name.as_str(), k.loc.line))
            .collect();
        assert_eq!(names, vec![("x", 2), ("y", 3), ("x", 4)]);
        match &inner[1].1.value {
            Value::Seq(items) => assert_eq!(
                items[1].loc,
                Loc {
                    file: 0,
                    line: 3,
                    column: 10
                }
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn empty_document_is_null() {
        assert_eq!(parse("# nothing\n", 0).unwrap().value, Value::Null);
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let e = parse("a: 1\nb: [1, 2\nc: 3\n", 0).unwrap_err();
        assert!(e.loc.line >= 2, "{e:?}");
        assert!(!e.message.is_empty());
        assert!(!e.message.contains(" at line "), "{e:?}");
        let e = parse("a: 1\n---\nb: 2\n", 0).unwrap_err();
        assert_eq!(e.loc.line, 3);
        assert!(
            e.message.starts_with("more than one YAML document"),
            "{e:?}"
        );
    }
}

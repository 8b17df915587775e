//! The candidate space of a sweep: axes from `--strategies` and `--set server.KEY=V1,V2`, and
//! their product.

use serde::{Deserialize, Serialize};

use crate::config::same_value;

/// One axis: a dotted profile key and the values to try, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Axis {
    pub key: String,
    pub values: Vec<String>,
}

/// One point of the space: a value for every axis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// Stable across runs of the same sweep, so `--resume` can match finished trials.
    pub id: String,
    /// `(key, value)` per axis, in axis order.
    pub settings: Vec<(String, String)>,
    /// 0 for a config's first trial; 1 for the second window a search runs to confirm a close
    /// lead (the ranking pools a config's windows).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeat: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Candidate {
    /// A point of the space, measured for the first time.
    pub fn new(id: String, settings: Vec<(String, String)>) -> Candidate {
        Candidate {
            id,
            settings,
            repeat: 0,
        }
    }

    /// The same config run once more: another id (so that `--resume` tells the windows apart),
    /// the same settings. Its id is this one's with `#2` (the second window) added.
    pub fn again(&self) -> Candidate {
        let repeat = self.repeat + 1;
        Candidate {
            id: format!("{}#{}", self.id, repeat + 1),
            settings: self.settings.clone(),
            repeat,
        }
    }

    /// Short human label: the values joined, e.g. `no_buffer` or `no_buffer mfs=0.85`.
    pub fn label(&self) -> String {
        if self.settings.is_empty() {
            return "base".into();
        }
        self.settings
            .iter()
            .map(|(k, v)| match short_key(k) {
                "mamba_strategy" => v.clone(),
                short => format!("{short}={v}"),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn short_key(key: &str) -> &str {
    key.strip_prefix("server.").unwrap_or(key)
}

/// Why a range does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RangeProblem {
    #[error("an end is not a number")]
    NotANumber,
    #[error("LO must be below HI")]
    Empty,
    #[error("a log scale needs LO above 0")]
    LogNotPositive,
    #[error("only `:log` may follow a range")]
    Suffix,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpaceError {
    #[error("--set {0:?}: expected KEY=V1,V2,... (e.g. server.mem_fraction_static=0.80,0.85)")]
    Syntax(String),
    #[error("--set {0:?}: an axis needs at least one value")]
    Empty(String),
    #[error("axis {key:?} is given twice; list all its values in one flag")]
    Duplicate { key: String },
    #[error("axis {key:?}: value {value:?} is listed twice")]
    DuplicateValue { key: String, value: String },
    #[error("axis {key:?}: {second:?} is the same value as {first:?}; list it once")]
    SameValue {
        key: String,
        first: String,
        second: String,
    },
    #[error(
        "--set {0:?}: a quote or bracket is not closed (quote a value with a comma as \"a,b\" or \
         write a\\,b)"
    )]
    Unclosed(String),
    #[error("--set {raw:?}: {why} (write LO..HI, e.g. 0.80..0.94, or LO..HI:log)")]
    Range { raw: String, why: RangeProblem },
    #[error(
        "--set {0:?}: a range needs the adaptive search (drop --search grid, or list the values)"
    )]
    RangeInGrid(String),
}

/// The mamba strategy axis key; `--strategies` is shorthand for `--set server.mamba_strategy=...`.
pub const STRATEGY_KEY: &str = "server.mamba_strategy";

/// Builds the axes from the command line.
pub fn axes(strategies: &[String], sets: &[String]) -> Result<Vec<Axis>, SpaceError> {
    let mut axes: Vec<Axis> = Vec::new();
    let mut push = |axis: Axis, raw: &str| -> Result<(), SpaceError> {
        if axis.values.is_empty() {
            return Err(SpaceError::Empty(raw.to_string()));
        }
        if axes.iter().any(|a| a.key == axis.key) {
            return Err(SpaceError::Duplicate { key: axis.key });
        }
        for (i, v) in axis.values.iter().enumerate() {
            // `0.8` and `0.80`, `null` and `~` would measure one config twice.
            let Some(first) = axis.values[..i].iter().find(|w| same_value(w, v)) else {
                continue;
            };
            return Err(if first == v {
                SpaceError::DuplicateValue {
                    key: axis.key.clone(),
                    value: v.clone(),
                }
            } else {
                SpaceError::SameValue {
                    key: axis.key.clone(),
                    first: first.clone(),
                    second: v.clone(),
                }
            });
        }
        axes.push(axis);
        Ok(())
    };
    if !strategies.is_empty() {
        let values = strategies
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        push(
            Axis {
                key: STRATEGY_KEY.into(),
                values,
            },
            "--strategies",
        )?;
    }
    for raw in sets {
        let (key, values) = raw
            .split_once('=')
            .ok_or_else(|| SpaceError::Syntax(raw.clone()))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(SpaceError::Syntax(raw.clone()));
        }
        let values = split_values(values).ok_or_else(|| SpaceError::Unclosed(raw.clone()))?;
        push(
            Axis {
                key: key.to_string(),
                values,
            },
            raw,
        )?;
    }
    Ok(axes)
}

/// Splits `V1,V2,...` at the commas between values: not one escaped as `\,`, nor one inside a
/// value that starts with a quote (`"a,b"`, `'a,b'`, kept as the YAML they are) or a flow
/// collection (`[a, b]`, `{k: v}`). Values are trimmed and empty ones dropped; `None` when a
/// quote or bracket is not closed.
fn split_values(text: &str) -> Option<Vec<String>> {
    let mut values = Vec::new();
    let mut value = String::new();
    let mut quote: Option<char> = None;
    let mut depth = 0usize;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let starts_value = value.trim().is_empty();
        match quote {
            Some(q) => {
                value.push(c);
                if q == '"' && c == '\\' {
                    value.extend(chars.next());
                } else if c == q {
                    // `''` is a quote inside a single-quoted YAML scalar.
                    if q == '\'' && chars.peek() == Some(&'\'') {
                        value.extend(chars.next());
                    } else {
                        quote = None;
                    }
                }
            }
            None => match c {
                '"' | '\'' if starts_value || depth > 0 => {
                    quote = Some(c);
                    value.push(c);
                }
                '[' | '{' if starts_value || depth > 0 => {
                    depth += 1;
                    value.push(c);
                }
                ']' | '}' if depth > 0 => {
                    depth -= 1;
                    value.push(c);
                }
                ',' if depth == 0 => values.push(std::mem::take(&mut value)),
                '\\' if depth == 0 && chars.peek() == Some(&',') => {
                    value.extend(chars.next());
                }
                _ => value.push(c),
            },
        }
    }
    if quote.is_some() || depth > 0 {
        return None;
    }
    values.push(value);
    Some(
        values
            .iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// The product of the axes, first axis varying slowest. No axes: the base profile alone.
pub fn candidates(axes: &[Axis]) -> Vec<Candidate> {
    let mut points: Vec<Vec<(String, String)>> = vec![vec![]];
    for axis in axes {
        points = points
            .into_iter()
            .flat_map(|p| {
                axis.values.iter().map(move |v| {
                    let mut p = p.clone();
                    p.push((axis.key.clone(), v.clone()));
                    p
                })
            })
            .collect();
    }
    points
        .into_iter()
        .map(|settings| {
            let id = if settings.is_empty() {
                "base".to_string()
            } else {
                settings
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(";")
            };
            Candidate::new(id, settings)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn product_of_strategies_and_a_set_axis() {
        let a = axes(
            &s(&["extra_buffer", "no_buffer"]),
            &s(&["server.mem_fraction_static=0.80,0.85"]),
        )
        .unwrap();
        let c = candidates(&a);
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].label(), "extra_buffer mem_fraction_static=0.80");
        assert_eq!(c[3].label(), "no_buffer mem_fraction_static=0.85");
        assert_eq!(
            c[1].id,
            "server.mamba_strategy=extra_buffer;server.mem_fraction_static=0.85"
        );
    }

    #[test]
    fn no_axes_is_the_base_profile() {
        let c = candidates(&[]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].label(), "base");
    }

    #[test]
    fn bad_axes_are_named() {
        assert_eq!(
            axes(&[], &s(&["server.x"])),
            Err(SpaceError::Syntax("server.x".into()))
        );
        assert_eq!(
            axes(&[], &s(&["server.x="])),
            Err(SpaceError::Empty("server.x=".into()))
        );
        assert!(matches!(
            axes(
                &s(&["no_buffer"]),
                &s(&["server.mamba_strategy=extra_buffer"])
            ),
            Err(SpaceError::Duplicate { .. })
        ));
        assert!(matches!(
            axes(&s(&["no_buffer", "no_buffer"]), &[]),
            Err(SpaceError::DuplicateValue { .. })
        ));
        assert_eq!(
            axes(&[], &s(&["server.mem_fraction_static=0.8,0.85,0.80"])),
            Err(SpaceError::SameValue {
                key: "server.mem_fraction_static".into(),
                first: "0.8".into(),
                second: "0.80".into()
            })
        );
        assert!(matches!(
            axes(&[], &s(&["server.max_running_requests=null,~"])),
            Err(SpaceError::SameValue { .. })
        ));
        assert_eq!(
            axes(&[], &s(&["env.X=\"a,b"])),
            Err(SpaceError::Unclosed("env.X=\"a,b".into()))
        );
    }

    #[test]
    fn a_comma_inside_a_value_is_quoted_escaped_or_in_brackets() {
        let values = |raw: &str| axes(&[], &s(&[raw])).unwrap().remove(0).values;
        assert_eq!(values("env.X=a, b ,,c"), ["a", "b", "c"]);
        assert_eq!(values("env.X=\"a,b\",c"), ["\"a,b\"", "c"]);
        assert_eq!(values("env.X='it''s, ok',c"), ["'it''s, ok'", "c"]);
        assert_eq!(values("env.X=a\\,b,c"), ["a,b", "c"]);
        assert_eq!(
            values("server.extra_args=[--a, 1],[--b, \"x,y\"]"),
            ["[--a, 1]", "[--b, \"x,y\"]"]
        );
        // A quote inside a plain value is just a character.
        assert_eq!(values("env.X=it's,fine"), ["it's", "fine"]);
        // `"a,b"` reaches the profile as the string a,b.
        assert_eq!(
            candidates(&axes(&[], &s(&["env.X=\"a,b\",c"])).unwrap())[0].settings,
            [("env.X".to_string(), "\"a,b\"".to_string())]
        );
    }
}

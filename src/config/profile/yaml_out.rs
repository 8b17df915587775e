//! Writing profiles as YAML: the resolved profile for `fleet profile show` (in schema order,
//! reloading to an equal profile) and the small profile `fleet sweep --write-profile` derives
//! from a base.

use super::super::yaml::{self, Loc, Node, Value};
use super::super::{Expected, Profile};
use super::{Override, resolve, schema};

impl Profile {
    /// The resolved profile as YAML that `load_profile` reads back to an equal profile.
    pub fn to_yaml(&self) -> String {
        render(&schema::to_value(self))
    }
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
        resolve::set(&mut root, &parts, value, Loc::default());
    }
    if let Some(e) = expected {
        resolve::set(
            &mut root,
            &["expected"],
            Node::new(schema::expected_value(e)),
            Loc::default(),
        );
    }
    let header: String = comment
        .lines()
        .map(|l| format!("# {l}\n").replace("# \n", "#\n"))
        .collect();
    header + &render(&root.value)
}

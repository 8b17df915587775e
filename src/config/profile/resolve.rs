//! Reading a profile as a tree: a file and the chain it `extends:` (merged key by key, cycles
//! and missing targets reported at the `extends:` line), then `--set` overrides applied to the
//! merged tree, before [`schema::validate`] types it.

use std::fs;
use std::path::{Path, PathBuf};

use super::super::ConfigError;
use super::super::Profile;
use super::super::check::Checker;
use super::super::yaml::{self, Key, Loc, Node, Value};
use super::{Override, available_profiles, is_path, not_found_message, schema};

/// Reads one profile and the chain of profiles it extends.
pub(super) struct Loader<'a> {
    pub c: Checker,
    profiles_dir: &'a Path,
    /// Files being loaded, outermost first: (canonical path for identity, path as shown).
    chain: Vec<(PathBuf, PathBuf)>,
    /// Part of the profile could not be read (bad `extends:`), so missing keys prove nothing.
    incomplete: bool,
}

impl<'a> Loader<'a> {
    pub fn new(profiles_dir: &'a Path, root: &Path) -> Self {
        Loader {
            c: Checker::default(),
            profiles_dir,
            chain: vec![(canonical(root), root.to_path_buf())],
            incomplete: false,
        }
    }

    pub fn file(&mut self, path: &Path) -> Option<Node> {
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
    pub fn extends(&mut self, mut node: Node, path: &Path) -> Node {
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

    pub fn finish(
        mut self,
        root: Option<Node>,
        path: &Path,
        overrides: &[Override],
    ) -> Result<Profile, ConfigError> {
        let profile = root.and_then(|mut root| {
            for o in overrides {
                self.apply(&mut root, o);
            }
            schema::validate(&mut self.c, &root, path, !self.incomplete)
        });
        self.c.finish(profile)
    }

    fn apply(&mut self, root: &mut Node, o: &Override) {
        let here = Loc {
            file: self.c.add_file(PathBuf::from(o.to_string())),
            ..Loc::default()
        };
        let parts: Vec<&str> = o.key.split('.').collect();
        if let Some(hint) = schema::override_problem(&parts) {
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

pub(super) fn set(node: &mut Node, parts: &[&str], value: Node, here: Loc) {
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

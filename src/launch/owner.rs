//! Whose servers are whose: the [`Owner`] every server records when fleet starts it (the fleet's
//! id, who started it, from which inventory), how a fleet's id is derived, and how a server is
//! described to someone who does not own it.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Inventory;
use crate::launch::state::InstanceRecord;

/// Who started a server, as its record keeps it; the record itself has the profile, the GPUs
/// and the start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The fleet's id: the inventory's `fleet:`, or derived from the file and the user.
    pub fleet: String,
    /// `user@machine` that ran fleet.
    pub by: String,
    /// The inventory file, as an absolute path on that machine.
    pub inventory: String,
}

impl Owner {
    /// The owner of what `inventory` starts, run by `user` on `machine`, the inventory being at
    /// `absolute`. Without `fleet:`, the id is the file's stem and a short hash of the three,
    /// so that it stays the same for one file and one user and differs between two files of
    /// one name.
    pub fn derive(inventory: &Inventory, absolute: &str, user: &str, machine: &str) -> Owner {
        let by = format!("{user}@{machine}");
        let fleet = inventory.fleet.clone().unwrap_or_else(|| {
            let stem = inventory
                .path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let stem: String = stem
                .chars()
                .map(|c| match c.is_ascii_alphanumeric() || "._-".contains(c) {
                    true => c,
                    false => '_',
                })
                .collect();
            let hash = Sha256::digest(format!("{by}\0{absolute}").as_bytes());
            let short: String = hash.iter().take(3).map(|b| format!("{b:02x}")).collect();
            format!("{stem}-{short}")
        });
        Owner {
            fleet,
            by,
            inventory: absolute.to_string(),
        }
    }

    /// The owner of what `inventory` starts from this process: this user on this machine.
    pub fn here(inventory: &Inventory) -> Owner {
        let absolute = std::fs::canonicalize(&inventory.path)
            .or_else(|_| std::path::absolute(&inventory.path))
            .unwrap_or_else(|_| inventory.path.clone());
        let user = crate::remote::local_user().unwrap_or_else(|| "unknown".into());
        let machine = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost".into());
        Owner::derive(inventory, &absolute.display().to_string(), &user, &machine)
    }
}

/// Whether `record` is a server of fleet `fleet`; a server from before owners were recorded is
/// no fleet's.
pub fn is_of(record: &InstanceRecord, fleet: &str) -> bool {
    record.owner.as_ref().is_some_and(|o| o.fleet == fleet)
}

/// A server as someone else's, for lists and refusals: `ct200 gpu0 :30000 (fleet a-1f2e3d,
/// alice@box, profile acc)`, or `(started before fleet recorded owners, profile acc)`.
pub fn describe(record: &InstanceRecord) -> String {
    match &record.owner {
        Some(o) => format!(
            "{} (fleet {}, {}, profile {})",
            record.label(),
            o.fleet,
            o.by,
            record.profile
        ),
        None => format!(
            "{} (started before fleet recorded owners, profile {})",
            record.label(),
            record.profile
        ),
    }
}

/// The one note a command gives about servers recorded without an owner (started by a fleet
/// from before owners were recorded): they count as another fleet's. `None` when there are none.
pub fn unowned_note<'a>(records: impl IntoIterator<Item = &'a InstanceRecord>) -> Option<String> {
    let labels = records.into_iter().filter(|r| r.owner.is_none());
    unowned_labels_note(labels.map(InstanceRecord::label).collect())
}

/// [`unowned_note`] of the servers labelled `unowned`.
pub fn unowned_labels_note(unowned: Vec<String>) -> Option<String> {
    (!unowned.is_empty()).then(|| {
        format!(
            "note: {} server(s) were started before fleet recorded owners ({}): they count as \
             another fleet's, left alone by `fleet down` and refused to `fleet up`; `fleet down \
             --all` stops them",
            unowned.len(),
            unowned.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn inventory(path: &str, fleet: Option<&str>) -> Inventory {
        Inventory {
            path: PathBuf::from(path),
            fleet: fleet.map(str::to_string),
            hosts: Vec::new(),
        }
    }

    #[test]
    fn a_fleet_id_is_stable_for_one_file_and_one_user_and_differs_otherwise() {
        let a = inventory("a.yaml", None);
        let id = |file: &str, user: &str| Owner::derive(&a, file, user, "box").fleet;
        assert_eq!(id("/w/a.yaml", "alice"), id("/w/a.yaml", "alice"));
        assert!(id("/w/a.yaml", "alice").starts_with("a-"));
        assert_eq!(id("/w/a.yaml", "alice").len(), "a-".len() + 6);
        assert_ne!(id("/w/a.yaml", "alice"), id("/w/a.yaml", "bob"));
        assert_ne!(id("/w/a.yaml", "alice"), id("/v/a.yaml", "alice"));
        let owner = Owner::derive(&a, "/w/a.yaml", "alice", "box");
        assert_eq!(
            (owner.by.as_str(), owner.inventory.as_str()),
            ("alice@box", "/w/a.yaml")
        );
    }

    #[test]
    fn fleet_in_the_inventory_names_the_fleet_whoever_runs_it() {
        let named = inventory("fleet.yaml", Some("team-27b"));
        assert_eq!(
            Owner::derive(&named, "/w/fleet.yaml", "alice", "x").fleet,
            "team-27b"
        );
        assert_eq!(
            Owner::derive(&named, "/v/fleet.yaml", "bob", "y").fleet,
            "team-27b"
        );
    }

    #[test]
    fn the_inventory_may_name_its_fleet_and_a_bad_name_is_an_error_at_its_line() {
        let read = |text: &str| crate::config::inventory_from_str(text, "a.yaml".as_ref());
        let named = read("fleet: alice-27b\nhosts:\n  - name: local\n").unwrap();
        assert_eq!(named.fleet.as_deref(), Some("alice-27b"));
        assert_eq!(read("hosts:\n  - name: local\n").unwrap().fleet, None);
        let Err(e) = read("fleet: \"a b\"\nhosts:\n  - name: local\n") else {
            panic!("a fleet name with a space was accepted");
        };
        let shown = e.to_string();
        assert!(
            shown.contains("a.yaml:1:8: fleet: `a b` is not a fleet name")
                && shown.contains("e.g. `fleet: alice-27b`"),
            "{shown}"
        );
    }

    #[test]
    fn servers_without_an_owner_are_noted_once_and_are_no_fleets() {
        use crate::launch::backend::fake::record;
        let old = InstanceRecord {
            owner: None,
            ..record("ct200", 4, 30004, "f")
        };
        let mut new = record("ct200", 5, 30005, "f");
        new.owner = Some(Owner::derive(
            &inventory("a.yaml", None),
            "/w/a.yaml",
            "u",
            "m",
        ));
        assert!(!is_of(&old, "a"));
        assert!(is_of(&new, &new.owner.clone().unwrap().fleet));
        let note = unowned_note([&old, &new]).unwrap();
        assert!(note.starts_with("note: 1 server(s)"), "{note}");
        assert!(
            note.contains("ct200 gpu4 :30004") && !note.contains("gpu5"),
            "{note}"
        );
        assert!(note.contains("`fleet down --all`"), "{note}");
        assert_eq!(unowned_note([&new]), None);
        assert!(describe(&new).contains("(fleet a-"), "{}", describe(&new));
    }
}

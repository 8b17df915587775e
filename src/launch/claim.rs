//! Whether a planned server may start where it is planned: what already holds its GPUs and its
//! port (a server of this fleet, of another fleet, a process fleet did not start), decided
//! before anything starts, and every refusal at once, each with its holder and the way out.

use std::collections::BTreeSet;

use crate::gpu::GpuProcess;
use crate::launch::backend::Seen;
use crate::launch::down::RELEASED_MIB;
use crate::launch::owner::{describe, is_of};
use crate::launch::plan::Instance;
use crate::launch::state::{Handle, InstanceRecord, Liveness};

/// What already runs on a host, looked at once (under the `up` lock) before starting anything.
#[derive(Debug, Default)]
pub struct Survey {
    pub seen: Vec<Seen>,
    pub ports_in_use: BTreeSet<u16>,
    /// What uses each GPU's memory; empty where it could not be read.
    pub processes: Vec<GpuProcess>,
}

#[derive(Debug, PartialEq)]
pub enum Action<'a> {
    Start,
    Keep(&'a InstanceRecord),
    /// Stop this fleet's servers that hold the GPUs or the port, then start.
    Replace(Vec<&'a InstanceRecord>),
    /// The host could not be looked at.
    Unavailable(String),
    /// Interrupted before the host could be looked at.
    Interrupted,
}

/// Why a planned server cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// This fleet's server runs another config of the same profile on the port.
    DifferentConfig {
        label: String,
        handle: Handle,
        profile: String,
    },
    /// This fleet's server of another profile (or on another port) holds some of its GPUs.
    OwnServer {
        label: String,
        /// The GPUs it holds, as `ct200 gpu0`.
        at: String,
        holder: String,
        profile: String,
    },
    /// Another fleet's server, or one from before owners were recorded, holds some of its GPUs
    /// or its port.
    OtherFleet {
        label: String,
        at: String,
        /// The holder as [`describe`] says it.
        holder: String,
        /// Its fleet; `None` for a server from before owners were recorded.
        fleet: Option<String>,
    },
    /// Processes fleet did not start use more than [`RELEASED_MIB`] of a GPU's memory.
    Processes {
        label: String,
        at: String,
        processes: Vec<GpuProcess>,
    },
    /// Something fleet did not start listens on the port.
    ForeignPort { label: String },
}

/// Why `up` started nothing: every conflict on every GPU and port, at once.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
}

/// `ct200 gpu0+1` for the GPUs `gpus` of `instance`'s host.
fn at(instance: &Instance, gpus: &[u32]) -> String {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    format!("{} gpu{}", instance.host(), list.join("+"))
}

/// Whose `seen` servers hold `instance`'s GPUs or port, and what else uses its GPUs' memory:
/// keep a live server of this fleet (`me`) with the same config; replace this fleet's others
/// when `replace`, else refuse; always refuse another fleet's server, a server from before
/// owners, processes fleet did not start, and a port something else listens on.
pub fn decide<'a>(
    instance: &Instance,
    s: &'a Survey,
    replace: bool,
    me: &str,
) -> Result<Action<'a>, Vec<Conflict>> {
    let mut conflicts = Vec::new();
    let mut keep = None;
    let mut stop = Vec::new();
    let mut held = BTreeSet::new();
    // Ours while it runs, or while what it started still does.
    for x in s.seen.iter().filter(|x| x.holds_gpu()) {
        let r = &x.record;
        let shared: Vec<u32> = (instance.group.gpus.iter())
            .filter(|g| r.gpus().contains(g))
            .copied()
            .collect();
        let on_port = r.port == instance.port;
        if shared.is_empty() && !on_port {
            continue;
        }
        held.extend(shared.iter().copied());
        let where_ = match shared.is_empty() {
            true => format!("{} :{}", instance.host(), instance.port),
            false => at(instance, &shared),
        };
        if !is_of(r, me) {
            conflicts.push(Conflict::OtherFleet {
                label: instance.label(),
                at: where_,
                holder: describe(r),
                fleet: r.owner.as_ref().map(|o| o.fleet.clone()),
            });
        } else if x.liveness != Liveness::Running {
            // What is left of a server that lost a rank (SGLang's other ranks need not exit,
            // issue #3099): it never serves again, so it goes and the server starts anew.
            stop.push(r);
        } else if on_port && r.fingerprint == instance.fingerprint {
            keep = Some(r);
        } else if replace {
            stop.push(r);
        } else if on_port && r.profile == instance.profile {
            conflicts.push(Conflict::DifferentConfig {
                label: instance.label(),
                handle: r.handle.clone(),
                profile: r.profile.clone(),
            });
        } else {
            conflicts.push(Conflict::OwnServer {
                label: instance.label(),
                at: where_,
                holder: format!("{} ({})", r.label(), r.handle),
                profile: r.profile.clone(),
            });
        }
    }
    // A GPU a recorded server holds is that server's: the processes on it are its own.
    for &gpu in instance.group.gpus.iter().filter(|g| !held.contains(*g)) {
        let on: Vec<GpuProcess> = (s.processes.iter())
            .filter(|p| p.gpu == gpu)
            .cloned()
            .collect();
        if on.iter().map(|p| p.used_mib).sum::<u64>() > RELEASED_MIB {
            conflicts.push(Conflict::Processes {
                label: instance.label(),
                at: at(instance, &[gpu]),
                processes: on,
            });
        }
    }
    let port_recorded = (s.seen.iter()).any(|x| x.holds_gpu() && x.record.port == instance.port);
    if !port_recorded && s.ports_in_use.contains(&instance.port) {
        conflicts.push(Conflict::ForeignPort {
            label: instance.label(),
        });
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    Ok(match (keep, stop.is_empty()) {
        (Some(r), true) => Action::Keep(r),
        (_, true) => Action::Start,
        (kept, false) => Action::Replace(stop.into_iter().chain(kept).collect()),
    })
}

/// Every conflict, one line each with what holds what and the way out.
pub fn conflicts_message(conflicts: &[Conflict]) -> String {
    let mut out = String::from("nothing was started:");
    let mut different = false;
    let out_of = "or leave it out (--gpus, or the inventory's gpus)";
    for c in conflicts {
        let line = match c {
            Conflict::DifferentConfig {
                label,
                handle,
                profile,
            } => {
                different = true;
                format!("{label}: already running a different config (profile {profile}, {handle})")
            }
            Conflict::OwnServer {
                label,
                at,
                holder,
                profile,
            } => format!(
                "{at} (for {label}): taken by this fleet's server of profile {profile}, {holder}; \
                 --replace stops it and starts this one, `fleet down --profile {profile}` stops it"
            ),
            Conflict::OtherFleet {
                label,
                at,
                holder,
                fleet: Some(fleet),
            } => format!(
                "{at} (for {label}): taken by {holder}; its owner's `fleet down` frees it \
                 (`fleet down --fleet {fleet}` from here), {out_of}"
            ),
            Conflict::OtherFleet {
                label, at, holder, ..
            } => format!(
                "{at} (for {label}): taken by {holder}; `fleet down --all` stops it, {out_of}"
            ),
            Conflict::Processes {
                label,
                at,
                processes,
            } => {
                let who: Vec<String> = (processes.iter())
                    .map(|p| format!("pid {} ({}) {} MiB", p.pid, p.name, p.used_mib))
                    .collect();
                format!(
                    "{at} (for {label}): its memory is in use by a process fleet did not start: \
                     {}; stop it (fleet never does), {out_of}",
                    who.join(", ")
                )
            }
            Conflict::ForeignPort { label } => format!(
                "{label}: the port is in use by a process fleet did not start; stop it or change port_base"
            ),
        };
        out.push_str("\n  ");
        out.push_str(&line);
    }
    if different {
        out.push_str("\n  hint: --replace restarts them with this config; `fleet down` stops them");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::backend::fake::{planned, record};
    use crate::launch::owner::Owner;

    fn seen(port: u16, liveness: Liveness, lingering: bool) -> Seen {
        Seen {
            record: record("h", 0, port, "aaa"),
            liveness,
            lingering,
        }
    }

    fn instance(port: u16, fingerprint: &str) -> Instance {
        planned("h", 0, port, fingerprint)
    }

    fn decide1<'a>(i: &Instance, s: &'a Survey, replace: bool) -> Result<Action<'a>, Conflict> {
        decide(i, s, replace, "test").map_err(|mut c| {
            assert_eq!(c.len(), 1, "{c:?}");
            c.remove(0)
        })
    }

    #[test]
    fn same_config_is_kept_another_is_refused_or_replaced() {
        let survey = Survey {
            seen: vec![seen(30000, Liveness::Running, false)],
            ports_in_use: [30000].into(),
            ..Survey::default()
        };
        let same = instance(30000, "aaa");
        let ours = &survey.seen[0].record;
        assert_eq!(decide1(&same, &survey, false), Ok(Action::Keep(ours)));
        let other = instance(30000, "bbb");
        assert_eq!(
            decide1(&other, &survey, true),
            Ok(Action::Replace(vec![ours]))
        );
        assert_eq!(
            decide1(&other, &survey, false),
            Err(Conflict::DifferentConfig {
                label: "h gpu0 :30000".into(),
                handle: ours.handle.clone(),
                profile: "p".into()
            })
        );
    }

    #[test]
    fn what_outlives_its_leader_or_a_lost_rank_is_ours_and_is_stopped_and_started_anew() {
        let survey = Survey {
            seen: vec![seen(30000, Liveness::Dead, true)],
            ports_in_use: [30000].into(),
            ..Survey::default()
        };
        let left = &survey.seen[0].record;
        assert_eq!(
            decide1(&instance(30000, "aaa"), &survey, false),
            Ok(Action::Replace(vec![left]))
        );
    }

    #[test]
    fn dead_or_reused_records_free_the_port_unless_someone_else_listens() {
        let survey = Survey {
            seen: vec![
                seen(30000, Liveness::Reused, false),
                seen(30001, Liveness::Dead, false),
            ],
            ports_in_use: [30000].into(),
            ..Survey::default()
        };
        assert_eq!(
            decide1(&instance(30000, "aaa"), &survey, true),
            Err(Conflict::ForeignPort {
                label: "h gpu0 :30000".into()
            })
        );
        assert_eq!(
            decide1(&instance(30001, "aaa"), &survey, false),
            Ok(Action::Start)
        );
        assert_eq!(
            decide1(&instance(30002, "aaa"), &Survey::default(), false),
            Ok(Action::Start)
        );
    }

    fn owned_by(fleet: Option<&str>, port: u16, profile: &str) -> Seen {
        let mut r = record("h", 0, port, "aaa");
        r.profile = profile.into();
        r.owner = fleet.map(|f| Owner {
            fleet: f.into(),
            by: "alice@box".into(),
            inventory: "/w/a.yaml".into(),
        });
        Seen {
            record: r,
            liveness: Liveness::Running,
            lingering: false,
        }
    }

    #[test]
    fn another_fleets_server_on_the_gpu_is_refused_even_with_replace_and_the_same_config() {
        for fleet in [Some("a-1f2e3d"), None] {
            let survey = Survey {
                seen: vec![owned_by(fleet, 30000, "acc")],
                ..Survey::default()
            };
            // Its GPU, another port; and its GPU and port with the very same config.
            for planned in [instance(31000, "bbb"), instance(30000, "aaa")] {
                let Err(c) = decide1(&planned, &survey, true) else {
                    panic!("started beside {fleet:?}'s server");
                };
                let message = conflicts_message(&[c]);
                assert!(message.contains("h gpu0 (for h gpu0 :"), "{message}");
                match fleet {
                    Some(f) => {
                        assert!(message.contains(&format!("`fleet down --fleet {f}`")));
                        assert!(message.contains("(fleet a-1f2e3d, alice@box, profile acc)"));
                    }
                    None => assert!(message.contains("before fleet recorded owners")),
                }
            }
        }
    }

    #[test]
    fn this_fleets_server_of_another_profile_needs_replace_which_stops_it_first() {
        let survey = Survey {
            seen: vec![owned_by(Some("test"), 30000, "acc")],
            ..Survey::default()
        };
        let mut other = instance(31000, "bbb");
        other.profile = "accb".into();
        let Err(c) = decide1(&other, &survey, false) else {
            panic!("started beside its own server of another profile");
        };
        let message = conflicts_message(&[c]);
        assert!(
            message.contains("this fleet's server of profile acc")
                && message.contains("--replace stops it"),
            "{message}"
        );
        assert_eq!(
            decide1(&other, &survey, true),
            Ok(Action::Replace(vec![&survey.seen[0].record]))
        );
    }

    #[test]
    fn memory_held_by_processes_fleet_did_not_start_refuses_the_gpu_and_names_them() {
        let process = |gpu, pid, used_mib| GpuProcess {
            gpu,
            pid,
            used_mib,
            name: "python3".into(),
        };
        let survey = Survey {
            processes: vec![process(0, 4242, 30_000), process(1, 77, 300)],
            ..Survey::default()
        };
        let Err(c) = decide1(&instance(30000, "aaa"), &survey, true) else {
            panic!("started on a GPU in use");
        };
        let message = conflicts_message(&[c]);
        assert!(
            message.contains("h gpu0 (for h gpu0 :30000): its memory is in use by a process fleet did not start: pid 4242 (python3) 30000 MiB"),
            "{message}"
        );
        // A driver's or a tool's few hundred MiB do not take a GPU.
        assert_eq!(
            decide1(&planned("h", 1, 30001, "aaa"), &survey, false),
            Ok(Action::Start)
        );
        // On a GPU its own server holds, the processes are that server's.
        let ours = Survey {
            seen: vec![seen(30000, Liveness::Running, false)],
            ports_in_use: [30000].into(),
            processes: vec![process(0, 4242, 30_000)],
        };
        assert_eq!(
            decide1(&instance(30000, "aaa"), &ours, false),
            Ok(Action::Keep(&ours.seen[0].record))
        );
    }

    #[test]
    fn conflicts_name_each_instance_and_the_way_out() {
        let message = conflicts_message(&[
            Conflict::DifferentConfig {
                label: "ct200 gpu0 :30000".into(),
                handle: Handle::Process {
                    pid: 7,
                    start_ticks: 1,
                },
                profile: "old".into(),
            },
            Conflict::ForeignPort {
                label: "ct200 gpu1 :30001".into(),
            },
        ]);
        assert_eq!(
            message,
            "nothing was started:\n  \
             ct200 gpu0 :30000: already running a different config (profile old, pid 7)\n  \
             ct200 gpu1 :30001: the port is in use by a process fleet did not start; stop it or change port_base\n  \
             hint: --replace restarts them with this config; `fleet down` stops them"
        );
    }
}

//! `fleet down`: stop what this fleet started on its inventory's GPUs (or, with `--all` or
//! `--fleet NAME`, what others started there, said before it is stopped), from the records on
//! each host, and list what is left running.

use std::sync::Arc;

use crate::cli::DownArgs;
use crate::config::{self, GpuSelection, HostSpec};
use crate::launch::Fleet;
use serde::Serialize;

use crate::launch::backend::{Backend, Seen, StopState};
use crate::launch::down::{
    Choice, RELEASED_MIB, StopOutcome, Whose, choose, confirm_gpus_released, left_running, stop,
};
use crate::launch::owner::{describe, unowned_note};
use crate::launch::report;
use crate::launch::state::InstanceRecord;
use crate::render::Model;

use super::output::eoutln;
use super::{Ctx, Outcome};

/// `fleet down --dry-run`'s result: the records of what would be stopped, and (in text) what
/// would be left running.
#[derive(Serialize)]
#[serde(transparent)]
pub struct WouldStop<'a> {
    stop: Vec<&'a InstanceRecord>,
    #[serde(skip)]
    left: Vec<&'a InstanceRecord>,
}

impl Model for WouldStop<'_> {
    fn title(&self) -> String {
        "fleet down --dry-run".into()
    }

    fn text(&self) -> String {
        let stop = self.stop.iter().map(|r| {
            format!(
                "would stop {} ({}, profile {})\n",
                r.label(),
                r.handle,
                r.profile
            )
        });
        let left = (self.left.iter()).map(|r| format!("would leave running {}\n", describe(r)));
        stop.chain(left).collect()
    }
}

/// `fleet down`'s result: how each instance stopped, and those left running.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Stopped(pub Vec<StopOutcome>);

impl Model for Stopped {
    fn title(&self) -> String {
        "fleet down".into()
    }

    /// The table; nothing when nothing was stopped or left (stderr says so).
    fn text(&self) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            report::down_table(&self.0)
        }
    }
}

/// The GPUs the inventory gives `host`; `None` for all of them (`gpus: all`, a Slurm host).
fn inventory_gpus(hosts: &[HostSpec], host: &str) -> Option<Vec<u32>> {
    match hosts.iter().find(|h| h.name() == host) {
        Some(HostSpec::Machine(m)) => match &m.gpus {
            GpuSelection::List(list) => Some(list.clone()),
            GpuSelection::All => None,
        },
        _ => None,
    }
}

pub async fn run(ctx: &Ctx, args: &DownArgs) -> anyhow::Result<Outcome> {
    // Records carry the profile's name; a path given to --profile means the same profile.
    let profile = match &args.profile {
        Some(p) => Some(config::load_profile(p, &ctx.global.profiles_dir)?.name),
        None => None,
    };
    let fleet = Fleet::open(&ctx.global.config, &ctx.connect_options()).await?;
    let mut partial = fleet.log_unreachable();
    let whose = match (&args.fleet, args.all) {
        (_, true) => Whose::All,
        (Some(name), false) => Whose::Fleet(name),
        (None, false) => Whose::Mine(&fleet.owner.fleet),
    };
    let looks = fleet
        .backends()
        .map(|b| async move { (b, b.survey().await) });
    let mut hosts: Vec<(&Arc<dyn Backend>, Vec<Seen>)> = Vec::new();
    for (b, seen) in futures::future::join_all(looks).await {
        match seen {
            Ok(seen) => hosts.push((b, seen)),
            Err(e) => {
                tracing::error!("{e}");
                partial = true;
            }
        }
    }
    let choices: Vec<(&Arc<dyn Backend>, Choice)> = hosts
        .iter()
        .map(|(b, seen)| {
            let gpus = inventory_gpus(&fleet.inventory.hosts, b.host());
            (*b, choose(seen, whose, profile.as_deref(), gpus.as_deref()))
        })
        .collect();
    if whose != Whose::All
        && let Some(note) = unowned_note(hosts.iter().flat_map(|(_, s)| s).map(|s| &s.record))
    {
        eoutln!("{note}");
    }
    if args.dry_run {
        let would = WouldStop {
            stop: choices.iter().flat_map(|(_, c)| c.stop.clone()).collect(),
            left: choices.iter().flat_map(|(_, c)| c.left.clone()).collect(),
        };
        super::emit(ctx, &would)?;
        return Ok(if partial {
            Outcome::Partial
        } else {
            Outcome::Ok
        });
    }
    // First, so nothing is routed to a server that is going.
    partial |= !super::router::down(ctx, &fleet, args.grace).await;
    let doomed: Vec<&InstanceRecord> = choices.iter().flat_map(|(_, c)| c.stop.clone()).collect();
    if whose != Whose::Mine(&fleet.owner.fleet) && !doomed.is_empty() {
        eoutln!("{}", announce(whose, &doomed));
    }
    let grace = args.grace;
    let stops = choices.iter().map(|(b, choice)| async move {
        let stops = choice.stop.iter().map(|r| stop(b.as_ref(), r, grace));
        let mut outcomes = futures::future::join_all(stops).await;
        confirm_gpus_released(b.as_ref(), &mut outcomes).await;
        // What holds the host's servers goes only once none is left, whoever's.
        if choice.left.is_empty() && outcomes.iter().all(|o| o.state != StopState::Failed) {
            match b.release().await {
                Ok(Some(what)) => tracing::info!("{}: {what}", b.host()),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        outcomes.extend(choice.left.iter().map(|r| left_running(r)));
        Ok::<_, crate::launch::state::StateError>(outcomes)
    });
    let mut outcomes = Vec::new();
    for result in futures::future::join_all(stops).await {
        match result {
            Ok(o) => outcomes.extend(o),
            Err(e) => {
                tracing::error!("{e}");
                partial = true;
            }
        }
    }
    for o in &outcomes {
        let label = o.id.label(o.port);
        if let Some(e) = &o.error {
            tracing::error!("{label}: {e}");
        }
        if let Some(used) = o.gpu_memory_used_mib.filter(|m| *m > RELEASED_MIB) {
            tracing::warn!("{label}: still {used} MiB in use on its GPU after stopping");
        }
    }
    let stopped = Stopped(outcomes);
    super::emit(ctx, &stopped)?;
    let outcomes = stopped.0;
    let (left, done): (Vec<&StopOutcome>, Vec<&StopOutcome>) = outcomes
        .iter()
        .partition(|o| o.state == StopState::LeftRunning);
    if ctx.format() == crate::render::Format::Text {
        if done.is_empty() {
            eoutln!("nothing to stop");
        }
        if !left.is_empty() {
            eoutln!(
                "left running: {} server(s) that are not this fleet's to stop (see FLEET); \
                 `fleet down --fleet NAME` or `--all` stops those on this inventory's GPUs",
                left.len()
            );
        }
    }
    partial |= done
        .iter()
        .any(|o| o.state == StopState::Failed || !o.port_closed);
    Ok(if partial {
        Outcome::Partial
    } else {
        Outcome::Ok
    })
}

/// What `--all` or `--fleet NAME` is about to stop, one server a line.
fn announce(whose: Whose<'_>, doomed: &[&InstanceRecord]) -> String {
    let what = match whose {
        Whose::Fleet(name) => format!("fleet {name}'s servers"),
        _ => "every server fleet started".to_string(),
    };
    let mut out = format!(
        "stopping {what} on this inventory's GPUs: {} server(s)",
        doomed.len()
    );
    for r in doomed {
        out.push_str(&format!("\n  {}", describe(r)));
    }
    out
}

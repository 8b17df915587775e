//! `fleet status`: liveness, health and load of every instance fleet started.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::cli::StatusArgs;
use crate::launch::owner::unowned_labels_note;
use crate::launch::report;
use crate::launch::state::Liveness;
use crate::launch::status::{InstanceStatus, Look, attach_gpus, host_status};
use crate::launch::{Fleet, PROBE_HTTP};
use crate::sglang::client::http_client;

use serde::Serialize;

use crate::render::Model;

use super::output::{eout, eoutln};
use super::{Ctx, Outcome};

/// `fleet status`'s result: every instance fleet started, as its host reports it.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Statuses(pub Vec<InstanceStatus>);

impl Model for Statuses {
    fn title(&self) -> String {
        "fleet status".into()
    }

    /// The table; nothing when there is no instance (stderr says so).
    fn text(&self) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            report::status_table(&self.0)
        }
    }
}

pub async fn run(ctx: &Ctx, args: &StatusArgs) -> anyhow::Result<Outcome> {
    let fleet = Fleet::open(&ctx.global.config, &ctx.connect_options()).await?;
    let mut partial = fleet.log_unreachable();
    let http = http_client(PROBE_HTTP)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let look = Look {
        dead_log_tails: ctx.global.verbose > 0,
        now_unix: now,
        me: &fleet.owner.fleet,
        only_mine: args.mine,
    };
    let http = &http;
    let looks = fleet.backends().map(|b| async move {
        let (status, gpus) = tokio::join!(host_status(b.as_ref(), http, look), b.gpus());
        (b.host(), status, gpus)
    });
    let results = tokio::select! {
        r = futures::future::join_all(looks) => r,
        _ = ctx.cancel.cancelled() => return Ok(Outcome::Interrupted),
    };
    let mut statuses: Vec<InstanceStatus> = Vec::new();
    for (host, status, gpus) in results {
        match status {
            Ok(mut s) => {
                match gpus {
                    Ok(readings) => attach_gpus(&mut s, host, &readings),
                    // GPU columns are extra; a host without a readable driver still has a status.
                    Err(e) => tracing::debug!("{e}"),
                }
                statuses.extend(s);
            }
            Err(e) => {
                tracing::error!("{e}");
                partial = true;
            }
        }
    }
    let text = ctx.format() == crate::render::Format::Text;
    let statuses = Statuses(statuses);
    super::emit(ctx, &statuses)?;
    let statuses = statuses.0;
    if text && statuses.is_empty() {
        eoutln!("no instances: `fleet up --profile P` starts some");
    } else if text {
        eout!("{}", report::dead_tails(&statuses));
        let others = statuses.iter().filter(|s| !s.mine).count();
        if others > 0 {
            eoutln!(
                "{others} server(s) marked (other) are not this fleet's ({}): `fleet down` \
                 leaves them, `fleet generate` does not use them; --mine hides them",
                fleet.owner.fleet
            );
        }
        let unowned = statuses.iter().filter(|s| s.owner.is_none());
        if let Some(note) = unowned_labels_note(unowned.map(|s| s.id.label(s.port)).collect()) {
            eoutln!("{note}");
        }
    }
    partial |= !super::router::status(ctx, &fleet).await?;
    // Loading is not a failure; dead, gone or unreachable is, for this fleet's servers: another
    // fleet's trouble is shown, not this fleet's failure.
    partial |= statuses
        .iter()
        .filter(|s| s.mine)
        .any(|s| s.liveness != Liveness::Running || s.health.is_none());
    Ok(if partial {
        Outcome::Partial
    } else {
        Outcome::Ok
    })
}

//! `fleet up`: preflight, start one server per GPU, show live progress, print the fleet.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::cli::UpArgs;
use crate::config;
use crate::launch::plan::{self, Instance};
use crate::launch::preflight;
use crate::launch::report;
use crate::launch::up::{self, Run, UpEvent, UpOptions, UpOutcome, UpState};
use crate::launch::{Fleet, PROBE_HTTP, env};
use crate::render::Model;
use crate::sglang::client::http_client;

use super::output::eout;
use super::{Ctx, Outcome, UsageError};

/// Each host's SGLang version, for the tables.
type Versions = BTreeMap<String, Option<String>>;

/// `fleet up --dry-run`'s result: the instances it would start, with their argv.
#[derive(Serialize)]
#[serde(transparent)]
struct Planned<'a> {
    plan: serde_json::Value,
    #[serde(skip)]
    instances: &'a [Instance],
    #[serde(skip)]
    versions: &'a Versions,
}

impl Model for Planned<'_> {
    fn title(&self) -> String {
        "fleet up --dry-run".into()
    }

    fn text(&self) -> String {
        report::plan_text(self.instances, self.versions)
    }
}

/// `fleet up`'s result: how each instance came up.
#[derive(Serialize)]
#[serde(transparent)]
struct Started<'a> {
    outcomes: Vec<UpOutcome>,
    #[serde(skip)]
    versions: &'a Versions,
}

impl Model for Started<'_> {
    fn title(&self) -> String {
        "fleet up".into()
    }

    fn text(&self) -> String {
        report::up_table(&self.outcomes, self.versions)
    }
}

/// Grace given to servers fleet stops on its own (a replaced config, an interrupted `up`).
const STOP_GRACE: Duration = Duration::from_secs(30);

pub async fn run(ctx: &Ctx, args: &UpArgs) -> anyhow::Result<Outcome> {
    let profile = config::load_profile(&args.profile, &ctx.global.profiles_dir)?;
    let api_key = env::api_key(&profile).map_err(UsageError::new)?;
    // Where the time goes, phase by phase, for `-v`.
    let began = std::time::Instant::now();
    let mut fleet = Fleet::open(&ctx.global.config, &ctx.connect_options()).await?;
    tracing::debug!("phase connect: {:.2}s", began.elapsed().as_secs_f64());
    let mut partial = fleet.log_unreachable();
    let learning = std::time::Instant::now();
    let learn = preflight::Learn::for_profile(&profile, !args.skip_preflight);
    // Each host's run directory is locked and looked at while its facts are learnt: both are
    // commands in a row on the host, and on a Proxmox host every command pays `pct exec`'s own
    // start before the servers' can.
    let backends: Vec<_> = fleet.backends().cloned().collect();
    let holding = async {
        match args.dry_run {
            true => None,
            false => Some(up::hold(backends, &ctx.cancel).await),
        }
    };
    let learned = async {
        tokio::select! {
            failed = fleet.learn(&learn) => Some(failed),
            _ = ctx.cancel.cancelled() => None,
        }
    };
    let (learned, mut held) = tokio::join!(learned, holding);
    tracing::debug!(
        "phase preflight and lock (--help, version, GPUs, address; hosts in parallel): {:.2}s",
        learning.elapsed().as_secs_f64()
    );
    let Some(failed) = learned else {
        if let Some(held) = held {
            held.release().await;
        }
        return Ok(Outcome::Interrupted);
    };
    // Whichever way this ends, a hold `up::start` did not take is given back after.
    let result: anyhow::Result<Outcome> = async {
        for e in &failed {
            tracing::error!("{e}");
            partial = true;
        }
        let hosts = fleet.hosts();
        if hosts.is_empty() {
            anyhow::bail!("no host could be prepared; nothing was started");
        }
        let instances = plan::plan(
            &profile,
            &hosts,
            args.gpus.as_deref(),
            api_key.as_deref(),
            fleet.run_root(),
        )
        .map_err(UsageError::new)?;
        for (host, why) in plan::contiguous_fallbacks(&hosts, &instances) {
            tracing::warn!(
                "{host}: no GPU topology ({why}); each server takes contiguous GPUs in bus order"
            );
        }
        let versions: Versions = fleet
            .facts()
            .iter()
            .map(|(name, f)| (name.clone(), f.version.clone()))
            .collect();
        for instance in &instances {
            tracing::debug!(
                "{}: {}",
                instance.label(),
                instance.display_argv().join(" ")
            );
        }
        preflight::preflight(&instances, fleet.facts()).map_err(UsageError::new)?;
        super::router::preflight(&fleet, &profile, !args.skip_preflight)
            .await
            .map_err(UsageError::new)?;
        if args.dry_run {
            let planned = Planned {
                plan: report::plan_json(&instances),
                instances: &instances,
                versions: &versions,
            };
            super::emit(ctx, &planned)?;
            super::router::dry_run(ctx, &fleet, &profile, &instances).map_err(UsageError::new)?;
            return Ok(if partial {
                Outcome::Partial
            } else {
                Outcome::Ok
            });
        }

        let http = http_client(PROBE_HTTP)?;
        let opts = UpOptions {
            replace: args.replace,
            keep_on_interrupt: args.keep_on_interrupt,
            grace: STOP_GRACE,
        };
        let (events, receiver) = mpsc::unbounded_channel();
        let live = std::io::stderr().is_terminal() && !ctx.global.quiet;
        let progress = tokio::spawn(show_progress(labels(&instances), receiver, live));
        let run = Run {
            fleet: &fleet,
            http: &http,
            api_key: api_key.as_deref(),
            events: &events,
            cancel: &ctx.cancel,
        };
        let starting = std::time::Instant::now();
        let held = held.take().expect("held unless a dry run");
        let result = up::start(&instances, held, &profile.health, &opts, &run).await;
        drop(events);
        progress.await.context("the progress display failed")?;
        let outcomes = result?;
        for o in &outcomes {
            tracing::debug!("phases {}: {}", o.id.label(o.port), o.phases.summary());
        }
        tracing::debug!(
            "phase up (lock, survey, spawns, readiness, server_info): {:.2}s; {:.2}s in all",
            starting.elapsed().as_secs_f64(),
            began.elapsed().as_secs_f64()
        );

        let started = Started {
            outcomes,
            versions: &versions,
        };
        super::emit(ctx, &started)?;
        let outcomes = started.outcomes;
        eout!("{}", report::up_failures(&outcomes));
        if outcomes.iter().any(|o| o.state == UpState::Interrupted) {
            if !args.keep_on_interrupt {
                tracing::warn!("interrupted: stopped the servers this run started");
            }
            return Ok(Outcome::Interrupted);
        }
        partial |= outcomes.iter().any(|o| o.state == UpState::Failed);
        partial |=
            !super::router::up(ctx, &fleet, &profile, api_key.as_deref(), args.watch).await?;
        if ctx.cancel.is_cancelled() {
            return Ok(Outcome::Interrupted);
        }
        Ok(if partial {
            Outcome::Partial
        } else {
            Outcome::Ok
        })
    }
    .await;
    if let Some(held) = held {
        held.release().await;
    }
    result
}

fn labels(instances: &[Instance]) -> Vec<String> {
    instances.iter().map(Instance::label).collect()
}

/// Renders progress events: live bars on a terminal, otherwise one log line per change.
async fn show_progress(
    labels: Vec<String>,
    mut events: mpsc::UnboundedReceiver<UpEvent>,
    live: bool,
) {
    let multi = MultiProgress::with_draw_target(if live {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let style = ProgressStyle::with_template("{spinner} {prefix} {msg} {elapsed}")
        .expect("a valid template");
    let done = ProgressStyle::with_template("  {prefix} {msg}").expect("a valid template");
    let bars: Vec<ProgressBar> = labels
        .iter()
        .map(|label| {
            let bar = multi.add(ProgressBar::new_spinner());
            bar.set_style(style.clone());
            bar.set_prefix(label.clone());
            bar.set_message("starting");
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        })
        .collect();
    let finish = |key: usize, msg: String| {
        if let Some(bar) = bars.get(key) {
            bar.set_style(done.clone());
            bar.finish_with_message(msg);
        }
    };
    while let Some(event) = events.recv().await {
        match event {
            UpEvent::Started { key, handle } => {
                if let Some(bar) = bars.get(key) {
                    bar.set_message("loading");
                }
                if !live {
                    tracing::info!("{}: started ({handle}), loading", labels[key]);
                }
            }
            UpEvent::AlreadyRunning { key, handle } => {
                finish(key, format!("already running ({handle})"));
                if !live {
                    tracing::info!("{}: already running this config ({handle})", labels[key]);
                }
            }
            UpEvent::Ready { key, after } => {
                finish(key, format!("ready {}s", after.as_secs()));
                if !live {
                    tracing::info!("{}: ready after {:.1}s", labels[key], after.as_secs_f64());
                }
            }
            UpEvent::Failed { key, reason } => {
                finish(key, format!("failed: {reason}"));
                if !live {
                    tracing::warn!("{}: failed: {reason}", labels[key]);
                }
            }
        }
    }
    for bar in &bars {
        if !bar.is_finished() {
            bar.finish_and_clear();
        }
    }
}

//! `fleet up`: preflight, start one server per GPU, show live progress, print the fleet.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::mpsc;

use crate::cli::UpArgs;
use crate::config::{self, Profile};
use crate::launch::hosts::connect_all;
use crate::launch::plan::{self, HostFacts, Instance};
use crate::launch::preflight::{self, host_facts};
use crate::launch::report;
use crate::launch::up::{self, Run, UpEvent, UpOptions, UpState};
use crate::sglang::client::{HttpOptions, http_client};

use super::{Ctx, Outcome, UsageError};

/// Health, `/server_info` and `/metrics` answer fast or not at all.
pub(super) const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Grace given to servers fleet stops on its own (a replaced config, an interrupted `up`).
const STOP_GRACE: Duration = Duration::from_secs(30);

pub async fn run(ctx: &Ctx, args: &UpArgs) -> anyhow::Result<Outcome> {
    let profile = config::load_profile(&args.profile, &ctx.global.profiles_dir)?;
    let inventory = config::load_inventory(&ctx.global.config)?;
    let api_key = api_key(&profile)?;
    let run_root = run_root();
    let connected = connect_all(&inventory.hosts, &ctx.connect_options()).await;
    let mut partial = false;
    for e in &connected.failed {
        tracing::error!("{e}");
        partial = true;
    }
    let (launcher, env) = (&profile.launcher, &profile.env);
    let looks = inventory.hosts.iter().filter_map(|h| {
        let t = connected.transports.get(&h.name)?;
        Some(async move {
            (
                h.clone(),
                host_facts(t, h, launcher, env, !args.skip_preflight).await,
            )
        })
    });
    let looked = tokio::select! {
        looked = futures::future::join_all(looks) => looked,
        _ = ctx.cancel.cancelled() => return Ok(Outcome::Interrupted),
    };
    let mut hosts: Vec<(config::HostSpec, HostFacts)> = Vec::new();
    for (host, facts) in looked {
        match facts {
            Ok(f) => hosts.push((host, f)),
            Err(e) => {
                tracing::error!("{e}");
                partial = true;
            }
        }
    }
    if hosts.is_empty() {
        anyhow::bail!("no host could be prepared; nothing was started");
    }
    let instances = plan::plan(
        &profile,
        &hosts,
        args.gpus.as_deref(),
        api_key.as_deref(),
        &run_root,
    )
    .map_err(|e| UsageError(e.to_string()))?;
    let facts: BTreeMap<String, HostFacts> = hosts.into_iter().map(|(h, f)| (h.name, f)).collect();
    let versions: BTreeMap<String, Option<String>> = facts
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
    preflight::preflight(&instances, &facts).map_err(|e| UsageError(e.to_string()))?;
    if args.dry_run {
        if ctx.global.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&report::plan_json(&instances))?
            );
        } else {
            print!("{}", report::plan_text(&instances, &versions));
        }
        return Ok(if partial {
            Outcome::Partial
        } else {
            Outcome::Ok
        });
    }

    let http = http_client(HttpOptions {
        connect_timeout: PROBE_CONNECT_TIMEOUT,
        request_timeout: PROBE_TIMEOUT,
    })?;
    let opts = UpOptions {
        replace: args.replace,
        keep_on_interrupt: args.keep_on_interrupt,
        grace: STOP_GRACE,
    };
    let (events, receiver) = mpsc::unbounded_channel();
    let live = std::io::stderr().is_terminal() && !ctx.global.quiet;
    let progress = tokio::spawn(show_progress(labels(&instances), receiver, live));
    let run = Run {
        transports: &connected.transports,
        http: &http,
        api_key: api_key.as_deref(),
        run_root: &run_root,
        events: &events,
        cancel: &ctx.cancel,
    };
    let result = up::up(&instances, &profile.health, &opts, &run).await;
    drop(events);
    progress.await.context("the progress display failed")?;
    let outcomes = result?;

    if ctx.global.json {
        println!("{}", serde_json::to_string_pretty(&outcomes)?);
    } else {
        print!("{}", report::up_table(&outcomes, &versions));
    }
    eprint!("{}", report::up_failures(&outcomes));
    if outcomes.iter().any(|o| o.state == UpState::Interrupted) {
        if !args.keep_on_interrupt {
            tracing::warn!("interrupted: stopped the servers this run started");
        }
        return Ok(Outcome::Interrupted);
    }
    partial |= outcomes.iter().any(|o| o.state == UpState::Failed);
    Ok(if partial {
        Outcome::Partial
    } else {
        Outcome::Ok
    })
}

/// The API key's value from the environment variable the profile names; registered as a
/// secret so no log line shows it.
pub(super) fn api_key(profile: &Profile) -> anyhow::Result<Option<String>> {
    let Some(var) = &profile.api_key_env else {
        return Ok(None);
    };
    match std::env::var(var) {
        Ok(key) if !key.is_empty() => {
            crate::remote::add_secret(&key);
            Ok(Some(key))
        }
        _ => Err(UsageError(format!(
            "{}: api_key_env is {var}, but {var} is not set (or empty) in this environment",
            profile.path.display()
        ))
        .into()),
    }
}

/// The run directory root on every target: `FLEET_RUN_DIR`, else `/tmp/fleet`.
pub(super) fn run_root() -> String {
    std::env::var("FLEET_RUN_DIR")
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| plan::DEFAULT_RUN_ROOT.to_string())
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
            UpEvent::Started { key, pid } => {
                if let Some(bar) = bars.get(key) {
                    bar.set_message("loading");
                }
                if !live {
                    tracing::info!("{}: started (pid {pid}), loading", labels[key]);
                }
            }
            UpEvent::AlreadyRunning { key, pid } => {
                finish(key, format!("already running (pid {pid})"));
                if !live {
                    tracing::info!("{}: already running this config (pid {pid})", labels[key]);
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

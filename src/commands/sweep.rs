//! `fleet sweep`: turns the arguments into a planned search, connects the hosts, runs it with
//! progress on stderr, prints the ranked report (or the `--dry-run` plan), and writes the
//! winner's profile.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::cli::{SearchMethod, SweepArgs};
use crate::config::{self, Profile};
use crate::launch::{Fleet, preflight};
use crate::render::{Format, Model};
use crate::report::page::{self as report_page, Page, Sources};
use crate::sglang::client::Api;
use crate::sweep::event::Event;
use crate::sweep::file::{FileError, Store};
use crate::sweep::load::{Workload, WorkloadSpec};
use crate::sweep::plan::{self, Planned, Request};
use crate::sweep::predict::Predictor;
use crate::sweep::profiles::{self, Profiles};
use crate::sweep::range;
use crate::sweep::rank::{self, Dataset, Failure, Outcome, Trial};
use crate::sweep::report;
use crate::sweep::run;
use crate::sweep::search::{Limits, SearchSpec, Stop};
use crate::sweep::servers::{self, Setup};
use crate::sweep::slo::{self, Slo};
use crate::sweep::trial::Timing;

use super::output::eoutln;
use super::{Ctx, Outcome as CommandOutcome, UsageError};
use crate::launch::env::api_key;

/// `fleet sweep --dry-run`'s result: the candidates and their GPUs.
#[derive(Serialize)]
#[serde(transparent)]
struct DryRun(report::Plan);

impl Model for DryRun {
    fn title(&self) -> String {
        "fleet sweep --dry-run".into()
    }

    fn text(&self) -> String {
        report::plan_text(&self.0)
    }
}

/// `fleet sweep`'s result: the ranked report (its JSON), with why the search stopped and where
/// sweep.json is for the text, and for `--format html` the sweep's report page.
#[derive(Serialize)]
#[serde(transparent)]
struct Swept {
    report: report::Report,
    #[serde(skip)]
    stopped: Option<Stop>,
    #[serde(skip)]
    out: PathBuf,
    #[serde(skip)]
    page: Option<Page>,
}

impl Model for Swept {
    fn title(&self) -> String {
        "fleet sweep".into()
    }

    fn text(&self) -> String {
        let mut text = report::text(&self.report);
        if let Some(stop) = self.stopped {
            text.push_str(&format!("search stopped: {stop}\n"));
        }
        text.push_str(&format!("results: {}\n", self.out.display()));
        text.push_str(&super::report::hint(&[&self.out]));
        text.push('\n');
        text
    }

    fn page(&self) -> Option<String> {
        self.page.as_ref().map(crate::report::html::render)
    }
}

fn usage(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> anyhow::Error {
    UsageError::new(e).into()
}

fn check_args(args: &SweepArgs) -> anyhow::Result<()> {
    if args.duration.is_zero() {
        return Err(usage("--duration must be longer than 0s"));
    }
    if args.sample == 0 {
        return Err(usage("--sample must be at least 1"));
    }
    if args.max_tokens == 0 || args.output_len == 0 || args.input_len == 0 {
        return Err(usage(
            "--max-tokens, --input-len and --output-len must be at least 1",
        ));
    }
    if let Some(e) = args.expected_output_tokens
        && (e.is_nan() || e <= 0.0)
    {
        return Err(usage("--expected-output-tokens must be positive"));
    }
    if let Some(p) = &args.prompts
        && !p.is_file()
    {
        return Err(usage(format!("--prompts {}: no such file", p.display())));
    }
    if args.resume && args.dry_run {
        return Err(usage("--resume and --dry-run do not go together"));
    }
    Ok(())
}

fn workload_spec(args: &SweepArgs) -> WorkloadSpec {
    match &args.prompts {
        Some(path) => WorkloadSpec::Prompts {
            path: path.clone(),
            sample: args.sample,
            seed: args.seed,
            max_tokens: args.max_tokens,
        },
        None => WorkloadSpec::Synthetic {
            input_len: args.input_len,
            output_len: args.output_len,
        },
    }
}

pub async fn run(ctx: &Ctx, args: &SweepArgs) -> anyhow::Result<CommandOutcome> {
    check_args(args)?;
    if args.trials == 0 {
        return Err(usage("--trials must be at least 1"));
    }
    let limits = Limits {
        trials: args.trials,
        budget_s: args.budget.map(|b| b.as_secs_f64()),
    };
    let slo = match &args.slo {
        Some(text) => slo::parse(text).map_err(usage)?,
        None => Slo::default(),
    };
    let adaptive = args.search.map(|m| m == SearchMethod::Adaptive);
    let mut search = plan::search(&args.strategies, &args.set, adaptive, limits).map_err(usage)?;
    let (base_name, base, early) = base_profile(ctx, args).await?;
    plan::seed(&mut search, &base);
    let profiles = Profiles::load(&base_name, &ctx.global.profiles_dir, &search.space())?;
    let workload_spec = workload_spec(args);
    let workload = workload(args, &base, &workload_spec)?;
    let key = api_key(&base).map_err(UsageError::new)?;
    let mut fleet = match early {
        Some(found) => found,
        None => connect_every_host(ctx).await?,
    };
    // Every host's facts (SGLang's `--help` and version, GPUs) for the base's launcher, and
    // the board where a candidate's server spans GPUs.
    let sizes = servers::sizes(&profiles, &search.space());
    let learn = preflight::Learn {
        topology: sizes.iter().any(|s| *s > 1),
        ..preflight::Learn::for_profile(&base, true)
    };
    if let Some(e) = fleet.learn(&learn).await.into_iter().next() {
        return Err(e.into());
    }
    let hosts = fleet.hosts();
    let root = fleet.run_root();
    check_flag_axes(&search, &hosts)?;
    let request = Request {
        profile: base_name,
        search,
        sequential: args.sequential,
        prune: !args.no_prune,
        workload: workload_spec,
        warmup: args.warmup,
        duration: args.duration,
        slo,
    };
    let planned = plan::plan(request, &servers::host_gpus(&hosts), &sizes).map_err(usage)?;
    if args.dry_run {
        let p = plan::dry_run(&planned, &profiles, &hosts, key.as_deref(), root);
        super::emit(ctx, &DryRun(p))?;
        return Ok(CommandOutcome::Ok);
    }
    let (predictor, notes) = Predictor::read(&fleet, &base).await;
    for note in notes {
        tracing::warn!("{note}");
    }
    let mut store = open_store(args, &planned)?;
    let mut strategy = plan::strategy(&planned, store.search(), store.trials());
    let setup = Setup {
        profiles,
        slots: planned.assignment.slots.clone(),
        hosts: &hosts,
        fleet: &fleet,
        api_key: key,
        health: base.health.clone(),
        workload: Arc::new(workload.clone()),
        timing: Timing {
            warmup: args.warmup,
            duration: args.duration,
        },
        first_window: planned.first_window,
        grace: args.grace,
        predictor,
    };
    let (events, receiver) = mpsc::unbounded_channel();
    let live = std::io::stderr().is_terminal() && !ctx.global.quiet;
    let shown = tokio::spawn(show(receiver, args.warmup, args.duration, live));
    let winner = |trials: &[Trial]| {
        rank::rank_within(trials, None, &planned.spec.slo)
            .into_iter()
            .find(|r| r.winner)
            .map(|r| r.trial.candidate.id)
    };
    let ended = run::run(
        &setup,
        &mut store,
        strategy.as_mut(),
        args.apply,
        winner,
        &events,
        &ctx.cancel,
    )
    .await;
    drop(events);
    shown.await.context("the progress display failed")?;
    let ended = ended?;

    let trials = store.trials();
    let dataset = args.total.or(workload.total_lines).and_then(|prompts| {
        let cap = planned.spec.workload.max_output_tokens();
        rank::output_tokens(trials, args.expected_output_tokens, cap, prompts)
            .map(|length| Dataset::new(prompts, length, setup.slots.len()))
    });
    let mut r = report::build(&planned.spec, &store.search().proposed, trials, dataset);
    r.unfit = workload.unfit();
    r.repeated = workload.repeated();
    // The page is read back from sweep.json, as `fleet report` reads it.
    let page = match ctx.format() {
        Format::Html => Some(report_page::build(Sources {
            sweep: Some((
                args.out.display().to_string(),
                crate::sweep::file::read(&args.out)?,
            )),
            total: args.total,
            ..Sources::default()
        })),
        Format::Text | Format::Json => None,
    };
    let swept = Swept {
        report: r,
        stopped: store.search().stopped,
        out: args.out.clone(),
        page,
    };
    super::emit(ctx, &swept)?;
    let r = swept.report;
    // An interrupted sweep has no winner yet: the missing trials might beat the best so far.
    let winner = r.winning().filter(|_| !ended.interrupted);
    if let (Some(path), Some(w)) = (&args.write_profile, winner) {
        let profile = setup.profiles.of(&w.trial.candidate)?;
        // The output lengths depend on the model, the prompts and the sampling, not on the
        // config: every trial's requests tell, and a job from this profile starts from them.
        let lengths = rank::length_prior(store.trials(), planned.spec.workload.max_output_tokens());
        profiles::write_winner(path, &setup.profiles, &base, &w.trial, &profile, lengths)?;
        eoutln!("wrote {}", path.display());
    } else if args.write_profile.is_some() {
        tracing::warn!("no winner: no profile written");
    }
    Ok(outcome(&r, &ended, &planned.spec.search))
}

/// What the sweep measures from: `--profile`, or without it the profile of the fleet `fleet
/// up` started (which takes connecting to the hosts: the connection comes back for reuse).
async fn base_profile(
    ctx: &Ctx,
    args: &SweepArgs,
) -> anyhow::Result<(String, Profile, Option<Fleet>)> {
    let dir = &ctx.global.profiles_dir;
    if let Some(p) = &args.profile {
        return Ok((p.clone(), config::load_profile(p, dir)?, None));
    }
    let fleet = connect_every_host(ctx).await?;
    let name = fleet_profile(&fleet).await?;
    tracing::info!("measuring from profile {name}, the one the running fleet was started with");
    let base = config::load_profile(&name, dir).with_context(|| {
        format!("the running fleet's profile `{name}`, read from its records on the hosts")
    })?;
    Ok((name, base, Some(fleet)))
}

/// The trials' workload, with requests for the base's model.
fn workload(args: &SweepArgs, base: &Profile, spec: &WorkloadSpec) -> anyhow::Result<Workload> {
    let endpoint = args
        .endpoint
        .as_deref()
        .map(str::parse::<Api>)
        .transpose()
        .map_err(usage)?;
    let model = base.served_model_name.as_deref().unwrap_or(&base.model);
    let workload = spec.load(endpoint, Some(model)).map_err(usage)?;
    if workload.malformed > 0 {
        tracing::warn!(
            "{} lines of the prompt file are not usable prompts; they are not sampled",
            workload.malformed
        );
    }
    Ok(workload)
}

/// Every `flag.NAME` axis checked against each host's `--help` before anything starts; every
/// problem on every host at once.
fn check_flag_axes(
    search: &SearchSpec,
    hosts: &[(config::HostSpec, crate::launch::plan::HostFacts)],
) -> anyhow::Result<()> {
    let dims = match search {
        SearchSpec::Adaptive { dims, .. } => dims.clone(),
        SearchSpec::Grid { axes } => axes
            .iter()
            .map(|a| range::Dim {
                key: a.key.clone(),
                domain: range::Domain::List {
                    values: a.values.clone(),
                },
            })
            .collect(),
    };
    let mut lines = Vec::new();
    for (host, facts) in hosts {
        let Some(help) = &facts.help else { continue };
        for p in range::check_flags(&dims, help) {
            lines.push(format!("  {}: {p}", host.name()));
        }
    }
    if lines.is_empty() {
        return Ok(());
    }
    Err(usage(format!(
        "preflight: {} axis problem(s); nothing was started\n{}",
        lines.len(),
        lines.join("\n")
    )))
}

/// `--out`, fresh or (`--resume`) with the search it continues.
fn open_store(args: &SweepArgs, planned: &Planned) -> anyhow::Result<Store> {
    let spec = planned.spec.clone();
    let store = Store::open(&args.out, spec, args.resume).map_err(|e| match e {
        FileError::Exists { .. }
        | FileError::Mismatch { .. }
        | FileError::Parse { .. }
        | FileError::NotAGrid { .. }
        | FileError::Newer { .. } => usage(e),
        other => other.into(),
    })?;
    let space = planned.spec.search.space();
    // A search's space is not known in advance: its trials so far count, of at most --trials.
    let (skipped, of) = match &planned.spec.search {
        SearchSpec::Adaptive { limits, .. } => (store.trials().len(), limits.trials),
        SearchSpec::Grid { .. } => (
            space.iter().filter(|c| store.is_done(&c.id)).count(),
            space.len(),
        ),
    };
    if skipped > 0 {
        tracing::info!(
            "resuming: {skipped} of {of} trials already finished in {}",
            args.out.display()
        );
    }
    store.save()?;
    Ok(store)
}

/// Says how `--apply` went and what the exit code is.
/// Exit 1 when a candidate failed, except where an adaptive search ran into the memory edges
/// it explores: those failures are what it learns from, and the table shows them.
fn outcome(r: &report::Report, ended: &run::Ended, search: &SearchSpec) -> CommandOutcome {
    if let Some(applied) = &ended.applied {
        let failed = applied
            .iter()
            .filter(|o| o.error.is_some())
            .collect::<Vec<_>>();
        for o in &failed {
            tracing::error!(
                "--apply: {}: {}",
                o.id.label(o.port),
                o.error.as_deref().unwrap_or("")
            );
        }
        if failed.is_empty() && !ended.interrupted {
            eoutln!(
                "--apply: the fleet runs {} on {} GPUs",
                r.winner.as_deref().unwrap_or("?"),
                applied.len()
            );
        }
    }
    if ended.interrupted {
        eoutln!(
            "interrupted: stopped the servers the sweep started; continue with the same command plus --resume"
        );
        return CommandOutcome::Interrupted;
    }
    let any_failed = r.rows.iter().any(|row| match row.trial.outcome {
        // A layout predicted not to fit was skipped, as asked: no failure of the sweep.
        Outcome::Failed {
            kind: Failure::Predicted,
            ..
        } => false,
        Outcome::Failed { kind, .. } => {
            !matches!(search, SearchSpec::Adaptive { .. })
                || !matches!(kind, Failure::OutOfMemory | Failure::NotEnoughMemory)
        }
        _ => false,
    }) || ended
        .applied
        .as_ref()
        .is_some_and(|a| a.iter().any(|o| o.error.is_some()));
    if any_failed {
        CommandOutcome::Partial
    } else {
        CommandOutcome::Ok
    }
}

/// A connection to every host of the inventory: a sweep compares like for like, and a missing
/// host would change the assignment.
async fn connect_every_host(ctx: &Ctx) -> anyhow::Result<Fleet> {
    let fleet = Fleet::open(&ctx.global.config, &ctx.connect_options()).await?;
    fleet.every_host().map_err(|e| {
        anyhow::anyhow!("{e}\n  a sweep needs every host of the inventory; nothing was started")
    })
}

/// The profile the running fleet was started with, from the live records on every host.
async fn fleet_profile(fleet: &Fleet) -> anyhow::Result<String> {
    let registry = fleet.servers_of(None).await.whole()?;
    let inventory = fleet.inventory.path.clone();
    registry
        .running_profile(inventory, fleet.run_root())
        .map_err(|e| UsageError::new(e).into())
}

/// Progress on stderr: one line per step and per finished trial, and on a terminal a clock
/// while trials are loaded.
async fn show(
    mut events: mpsc::UnboundedReceiver<Event>,
    warmup: std::time::Duration,
    duration: std::time::Duration,
    live: bool,
) {
    let mut clock: Option<ProgressBar> = None;
    while let Some(e) = events.recv().await {
        if !matches!(e, Event::Measuring { .. })
            && let Some(bar) = clock.take()
        {
            bar.finish_and_clear();
        }
        match e {
            Event::Starting { labels, servers } => {
                tracing::info!("starting {} on {servers} servers", labels.join(", "))
            }
            Event::Measuring { labels } => {
                // Rounds measure batches that overlap: the clock is the latest one's.
                if let Some(bar) = clock.take() {
                    bar.finish_and_clear();
                }
                tracing::info!(
                    "measuring {}: warm-up {}, then {}",
                    labels.join(", "),
                    humantime::format_duration(warmup),
                    humantime::format_duration(duration)
                );
                if live {
                    let bar = ProgressBar::new_spinner().with_style(
                        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                            .expect("a valid template"),
                    );
                    bar.set_message(format!(
                        "loading (results after {})",
                        humantime::format_duration(warmup + duration)
                    ));
                    bar.enable_steady_tick(std::time::Duration::from_millis(200));
                    clock = Some(bar);
                }
            }
            Event::TrialDone(t) => match &t.outcome {
                Outcome::Ok(m) => tracing::info!(
                    "{}: {:.1} output tok/s per GPU (cap {}, {} GPUs)",
                    t.candidate.label(),
                    m.output_tok_s_per_gpu,
                    m.cap,
                    m.gpus
                ),
                Outcome::Pruned(p) => tracing::info!(
                    "{}: pruned after its first window: {:.1} output tok/s per GPU, clearly behind {} ({:.1})",
                    t.candidate.label(),
                    p.measured.output_tok_s_per_gpu,
                    p.leader_label,
                    p.leader_estimate.mean
                ),
                Outcome::Failed { reason, .. } => {
                    tracing::warn!("{}: failed: {reason}", t.candidate.label())
                }
            },
            Event::Applying { label, servers } => {
                tracing::info!("--apply: starting {label} on all {servers} GPUs")
            }
        }
    }
    if let Some(bar) = clock {
        bar.finish_and_clear();
    }
}

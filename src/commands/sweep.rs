//! `fleet sweep`: builds the candidates and the workload, assigns GPUs, runs the trials with
//! progress on stderr, prints the ranked report, and writes the winner's profile.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;

use crate::cli::SweepArgs;
use crate::config::{self, Expected, HostSpec, Override, Profile};
use crate::launch::Fleet;
use crate::launch::plan::HostFacts;
use crate::launch::preflight;
use crate::sglang::client::Api;
use crate::sweep::assign::{self, Mode};
use crate::sweep::file::{FileError, Store, SweepSpec};
use crate::sweep::load::{self, WorkloadSpec};
use crate::sweep::rank::{self, Dataset, Outcome, Trial};
use crate::sweep::report::{self, Plan, PlannedCandidate};
use crate::sweep::run::{self, Event};
use crate::sweep::servers::{self, Setup};
use crate::sweep::space::{self, Candidate};
use crate::sweep::trial::Timing;
use crate::sweep::{prune, schedule};

use super::output::{eoutln, out, outln};
use super::{Ctx, Outcome as CommandOutcome, UsageError};
use crate::launch::env::api_key;

fn usage(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> anyhow::Error {
    UsageError::new(e).into()
}

/// Each candidate's profile: the base with the candidate's settings applied and validated.
fn candidate_profiles(
    base: &str,
    dir: &Path,
    candidates: &[Candidate],
) -> anyhow::Result<Vec<(Candidate, Profile)>> {
    candidates
        .iter()
        .map(|c| {
            let overrides = overrides(c);
            let mut p = config::load_profile_with(base, dir, &overrides)
                .with_context(|| format!("candidate {}", c.label()))?;
            // `fleet status`/`down` show which candidate a server runs, not just the base.
            if !c.settings.is_empty() {
                p.name = format!("{}[{}]", p.name, c.label());
            }
            Ok((c.clone(), p))
        })
        .collect()
}

fn overrides(c: &Candidate) -> Vec<Override> {
    c.settings
        .iter()
        .map(|(key, value)| Override {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
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

pub async fn run(ctx: &Ctx, args: &SweepArgs) -> anyhow::Result<CommandOutcome> {
    check_args(args)?;
    let axes = space::axes(&args.strategies, &args.set).map_err(usage)?;
    let candidates = space::candidates(&axes);
    let dir = &ctx.global.profiles_dir;
    // Without --profile the sweep measures from what `fleet up` started, which takes the hosts.
    let (profile_arg, early) = match &args.profile {
        Some(p) => (p.clone(), None),
        None => {
            let fleet = connect_every_host(ctx).await?;
            let name = fleet_profile(&fleet).await?;
            tracing::info!(
                "measuring from profile {name}, the one the running fleet was started with"
            );
            (name, Some(fleet))
        }
    };
    let base = match &args.profile {
        Some(_) => config::load_profile(&profile_arg, dir)?,
        None => config::load_profile(&profile_arg, dir).with_context(|| {
            format!(
                "the running fleet's profile `{profile_arg}`, read from its records on the hosts"
            )
        })?,
    };
    let profiles = candidate_profiles(&profile_arg, dir, &candidates)?;
    let endpoint = args
        .endpoint
        .as_deref()
        .map(str::parse::<Api>)
        .transpose()
        .map_err(usage)?;
    let model = base
        .served_model_name
        .clone()
        .unwrap_or_else(|| base.model.clone());
    let (workload, workload_spec) = match &args.prompts {
        Some(path) => (
            load::sample_prompts(
                path,
                args.sample,
                args.seed,
                args.max_tokens,
                endpoint,
                Some(&model),
            )
            .map_err(usage)?,
            WorkloadSpec::Prompts {
                path: path.clone(),
                sample: args.sample,
                seed: args.seed,
                max_tokens: args.max_tokens,
            },
        ),
        None => (
            load::synthetic(args.input_len, args.output_len, endpoint, Some(&model)),
            WorkloadSpec::Synthetic {
                input_len: args.input_len,
                output_len: args.output_len,
            },
        ),
    };
    if workload.malformed > 0 {
        tracing::warn!(
            "{} lines of the prompt file are not usable prompts; they are not sampled",
            workload.malformed
        );
    }

    let key = api_key(&base).map_err(UsageError::new)?;
    let mut fleet = match early {
        Some(found) => found,
        None => connect_every_host(ctx).await?,
    };
    if let Some(e) = fleet
        .learn(&base.launcher, &base.env, true)
        .await
        .into_iter()
        .next()
    {
        return Err(e.into());
    }
    let hosts = fleet.hosts();
    let root = fleet.run_root();
    let gpus = servers::host_gpus(&hosts);
    let total_gpus: usize = gpus.iter().map(|(_, g)| g.len()).sum();
    let mode = assign::choose_mode(candidates.len(), total_gpus, args.sequential);
    let assignment = assign::assign(&gpus, candidates.len(), mode).map_err(usage)?;
    // Pruning saves time only where a freed GPU has a next candidate to take it.
    let first_window =
        (mode == Mode::Rounds && !args.no_prune).then(|| prune::first_window(args.duration));
    let spec = SweepSpec {
        profile: profile_arg.clone(),
        candidates: candidates.clone(),
        mode,
        workload: workload_spec,
        warmup_s: args.warmup.as_secs_f64(),
        duration_s: args.duration.as_secs_f64(),
        first_window_s: first_window.map(|d| d.as_secs_f64()),
    };

    if args.dry_run {
        return dry_run(
            ctx,
            &spec,
            &profiles,
            &assignment,
            &hosts,
            key.as_deref(),
            root,
        );
    }

    let mut store = Store::open(&args.out, spec.clone(), args.resume).map_err(|e| match e {
        FileError::Exists { .. } | FileError::Mismatch { .. } | FileError::Parse { .. } => usage(e),
        other => other.into(),
    })?;
    let skipped = candidates.iter().filter(|c| store.is_done(&c.id)).count();
    if skipped > 0 {
        tracing::info!(
            "resuming: {skipped} of {} trials already finished in {}",
            candidates.len(),
            args.out.display()
        );
    }
    store.save()?;
    let setup = Setup {
        candidates: profiles.clone(),
        assignment: &assignment,
        hosts: &hosts,
        fleet: &fleet,
        api_key: key,
        health: base.health.clone(),
        workload: Arc::new(workload.clone()),
        timing: Timing {
            warmup: args.warmup,
            duration: args.duration,
        },
        first_window,
        grace: args.grace,
    };
    let (events, receiver) = mpsc::unbounded_channel();
    let live = std::io::stderr().is_terminal() && !ctx.global.quiet;
    let shown = tokio::spawn(show(receiver, args.warmup, args.duration, live));
    let winner = |trials: &[Trial]| {
        rank::rank(trials, None)
            .into_iter()
            .find(|r| r.winner)
            .map(|r| r.trial.candidate.id)
    };
    let ended = run::run(&setup, &mut store, args.apply, winner, &events, &ctx.cancel).await;
    drop(events);
    shown.await.context("the progress display failed")?;
    let ended = ended?;

    let trials = store.trials();
    let dataset = args
        .total
        .or(workload.total_lines)
        .zip(report::output_tokens_per_prompt(
            trials,
            args.expected_output_tokens,
        ))
        .map(|(prompts, tokens)| Dataset {
            prompts,
            output_tokens_per_prompt: tokens,
            gpus: total_gpus,
        });
    let mut r = report::build(&spec, trials, dataset);
    r.unfit = workload.unfit();
    r.repeated = workload.repeated();
    if ctx.global.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        out!("{}", report::text(&r));
        outln!("results: {}", args.out.display());
    }
    // An interrupted sweep has no winner yet: the missing trials might beat the best so far.
    let winner = r.winning().filter(|_| !ended.interrupted);
    if let (Some(path), Some(w)) = (&args.write_profile, winner) {
        let profile = &profiles
            .iter()
            .find(|(c, _)| c.id == w.trial.candidate.id)
            .expect("the winner is a candidate")
            .1;
        write_profile(path, &profile_arg, &base, &w.trial, profile, dir)?;
        eoutln!("wrote {}", path.display());
    } else if args.write_profile.is_some() {
        tracing::warn!("no winner: no profile written");
    }
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
        return Ok(CommandOutcome::Interrupted);
    }
    let any_failed = r
        .rows
        .iter()
        .any(|row| matches!(row.trial.outcome, Outcome::Failed { .. }))
        || ended
            .applied
            .as_ref()
            .is_some_and(|a| a.iter().any(|o| o.error.is_some()));
    Ok(if any_failed {
        CommandOutcome::Partial
    } else {
        CommandOutcome::Ok
    })
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
    let registry = fleet.servers().await.whole()?;
    let inventory = fleet.inventory.path.clone();
    registry
        .running_profile(inventory, fleet.run_root())
        .map_err(|e| UsageError::new(e).into())
}

fn dry_run(
    ctx: &Ctx,
    spec: &SweepSpec,
    profiles: &[(Candidate, Profile)],
    assignment: &assign::Assignment,
    hosts: &[(HostSpec, HostFacts)],
    key: Option<&str>,
    root: &str,
) -> anyhow::Result<CommandOutcome> {
    let facts = servers::facts_by_host(hosts);
    let queue = assignment.needs.iter().cloned().enumerate().collect();
    let rounds = schedule::rounds(queue, assignment.slots.clone());
    let mut planned: Vec<PlannedCandidate> = Vec::new();
    for (round, members) in rounds.iter().enumerate() {
        for (c, slots) in members {
            let (candidate, profile) = &profiles[*c];
            let instances = servers::plan_on(profile, hosts, slots, key, root);
            let (argv, problem) = match &instances {
                Ok(i) => (
                    i.first().map(|i| i.display_argv()).unwrap_or_default(),
                    preflight::preflight(i, &facts).err().map(|e| e.to_string()),
                ),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            planned.push(PlannedCandidate {
                id: candidate.id.clone(),
                label: candidate.label(),
                round: round + 1,
                gpus: slots.clone(),
                argv,
                problem,
            });
        }
    }
    let plan = Plan {
        mode: assignment.mode,
        gpus: assignment.slots.len(),
        rounds: match assignment.mode {
            Mode::Rounds => rounds.len(),
            Mode::Parallel | Mode::Sequential => 1,
        },
        warmup_s: spec.warmup_s,
        duration_s: spec.duration_s,
        first_window_s: spec.first_window_s,
        candidates: planned,
    };
    if ctx.global.json {
        outln!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        out!("{}", report::plan_text(&plan));
    }
    Ok(CommandOutcome::Ok)
}

/// `extends:` names the base the way `fleet profile show` will find it from the new file: by
/// name when the new file sits in the profiles directory, else by absolute path.
fn base_reference(profile_arg: &str, base: &Profile, path: &Path, dir: &Path) -> String {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let same_dir = match (
        parent.map(std::fs::canonicalize),
        std::fs::canonicalize(dir),
    ) {
        (Some(Ok(a)), Ok(b)) => a == b,
        _ => false,
    };
    let by_name = !profile_arg.contains('/') && !profile_arg.ends_with(".yaml");
    if same_dir && by_name {
        profile_arg.to_string()
    } else {
        std::fs::canonicalize(&base.path)
            .unwrap_or_else(|_| PathBuf::from(&base.path))
            .display()
            .to_string()
    }
}

fn write_profile(
    path: &Path,
    profile_arg: &str,
    base: &Profile,
    trial: &Trial,
    profile: &Profile,
    dir: &Path,
) -> anyhow::Result<()> {
    let Outcome::Ok(m) = &trial.outcome else {
        unreachable!("a winner is always measured")
    };
    let expected = Expected {
        output_tok_s_per_gpu: (m.output_tok_s_per_gpu * 10.0).round() / 10.0,
        max_running_requests: m.cap,
    };
    let comment = format!(
        "Written by `fleet sweep` from {}: the winner {} ({:.1} output tok/s per GPU, cap {}).",
        profile_arg,
        trial.candidate.label(),
        m.output_tok_s_per_gpu,
        m.cap
    );
    let text = config::derived_profile_yaml(
        &base_reference(profile_arg, base, path, dir),
        &overrides(&trial.candidate),
        Some(&expected),
        &comment,
    );
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    // The written file must load back to the winner's config.
    let back = config::load_profile_file(path, dir, &[])
        .with_context(|| format!("{} does not load back", path.display()))?;
    if back.server != profile.server {
        anyhow::bail!(
            "{} loads back with other server settings than the winner's",
            path.display()
        );
    }
    Ok(())
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

//! `fleet generate`: validates arguments, runs the generation engine over the given endpoints,
//! and renders its events (a progress bar on a terminal, a log line every 30 s otherwise).

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cli::GenerateArgs;
use crate::config::{self, Profile};
use crate::generate::concurrency::FileBudget;
use crate::generate::input::InputError;
use crate::generate::journal::{JournalError, OutputFormat};
use crate::generate::lock::LockError;
use crate::generate::progress::Progress;
use crate::generate::upload::{Destination, UploadEvent};
use crate::generate::{
    self, ConcurrencyMode, End, Endpoint, Event, GenerateConfig, GenerateError, PlacementChoice,
    PlacementMode, RetryFailed, Targets,
};
use crate::launch::{Fleet, deadline};
use crate::render::{Format, Model};
use crate::report::page::{self, Page, Sources};
use crate::server::ServerId;
use crate::sglang::client::Api;

use super::nofile;
use super::output::eoutln;
use super::{Ctx, Outcome, UsageError};

const LOG_EVERY: Duration = Duration::from_secs(30);

/// `fleet generate`'s result: the job's progress at its end (its JSON), with where its output
/// is for the text, and for `--format html` the job's report page.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Ended {
    progress: Progress,
    #[serde(skip)]
    out: PathBuf,
    /// Where every shard went, when the upload is complete and the job done.
    #[serde(skip)]
    uploaded_to: Option<String>,
    #[serde(skip)]
    report: Option<Page>,
}

impl Ended {
    /// The end of the job in `out`; its report page is read from there when `format` is HTML.
    fn of(progress: Progress, out: &Path, format: Format) -> anyhow::Result<Self> {
        let report = match format {
            Format::Html => Some(page::build(Sources {
                job: Some(super::report::job(out)?),
                ..Sources::default()
            })),
            Format::Text | Format::Json => None,
        };
        Ok(Ended {
            progress,
            out: out.to_path_buf(),
            uploaded_to: None,
            report,
        })
    }
}

impl Model for Ended {
    fn title(&self) -> String {
        "fleet generate".into()
    }

    fn text(&self) -> String {
        let p = &self.progress;
        let mut text = format!(
            "{}\noutput: {}\n{}\n",
            summary_line(p),
            self.out.display(),
            super::report::hint(&[&self.out])
        );
        if let Some(dest) = &self.uploaded_to {
            text.push_str(&format!(
                "uploaded: {} shards, {} bytes to {dest}\n",
                p.s3_uploaded, p.s3_bytes
            ));
        }
        text
    }

    fn page(&self) -> Option<String> {
        self.report.as_ref().map(crate::report::html::render)
    }
}

pub async fn run(ctx: &Ctx, args: &GenerateArgs) -> anyhow::Result<Outcome> {
    if let (Some(name), false) = (&args.fleet, args.url.is_empty()) {
        return Err(UsageError::new(format!(
            "--fleet {name} and --url both say which servers to use: give one of them"
        ))
        .into());
    }
    if args.detach {
        // The flags are checked here; the prompts may be HOST:PATH, checked where they are.
        config_from(args)?;
        return super::jobs::detach(ctx, args).await;
    }
    prompts_file(&args.prompts).map_err(UsageError::new)?;
    let mut config = config_from(args)?;
    if args.dry_run {
        return dry_run(ctx, &config);
    }
    let profile = args
        .profile
        .as_deref()
        .map(|p| config::load_profile(p, &ctx.global.profiles_dir))
        .transpose()?;
    if let Some(p) = &profile {
        config.expected = p.expected.clone();
        if p.expected.is_none() && !ctx.global.quiet {
            eoutln!(
                "note: profile {} records no measured throughput (`expected:`, written by \
                 `fleet sweep --write-profile`); the watchdog judges by the servers' own capacity",
                p.name
            );
        }
    }
    // Without --url: every instance this fleet's `fleet up` started, through port forwards held
    // for the run over the fleet's connections, which outlive it.
    let keep_stop = ctx.cancel.child_token();
    let mut keeper = None;
    let (fleet, targets, serving) = match args.url.is_empty() {
        true if args.via_router => {
            let fleet =
                std::sync::Arc::new(Fleet::open(&ctx.global.config, &ctx.connect_options()).await?);
            fleet.log_unreachable();
            let (endpoint, tunnel, k) =
                super::router::target(fleet.clone(), keep_stop.clone()).await?;
            keeper = Some(k);
            let targets = Targets {
                endpoints: vec![endpoint],
                tunnels: vec![tunnel],
                links: vec![],
            };
            (Some(fleet), targets, BTreeSet::new())
        }
        true => {
            let (fleet, targets, serving, profiles) =
                fleet_targets(ctx, args.fleet.as_deref()).await?;
            // The profile `up` started the servers from carries the sweep's numbers: the
            // watchdog's expectation and the ETA's prior.
            if profile.is_none()
                && let [name] = profiles.as_slice()
            {
                match config::load_profile(name, &ctx.global.profiles_dir) {
                    Ok(p) => config.expected = p.expected,
                    Err(e) => tracing::warn!(
                        "the fleet runs profile {name}, which cannot be read here ({e}): the \
                         watchdog and the ETA go without its sweep's numbers"
                    ),
                }
            }
            (Some(std::sync::Arc::new(fleet)), targets, serving)
        }
        false => (
            None,
            endpoints_from(args, profile.as_ref())?.into(),
            BTreeSet::new(),
        ),
    };
    // Through fleet's own forwards a request holds two descriptors: the client's socket and
    // the one the forward accepts.
    let fds_per_request = if targets.tunnels.is_empty() { 1 } else { 2 };
    config.files = nofile::soft_limit().map(|limit| {
        FileBudget::new(
            limit,
            nofile::open_now().unwrap_or(0),
            targets.endpoints.len(),
            fds_per_request,
        )
    });
    let json = ctx.format() == Format::Json;
    let view = Mutex::new(View::new(
        !ctx.global.quiet && !json && std::io::stderr().is_terminal(),
    ));
    // A run on servers whose allocation ends stops ahead of the end (the watch cancels it).
    let stop = ctx.cancel.child_token();
    let backends = fleet.iter().flat_map(|f| f.backends().cloned()).collect();
    let (mut ends, eta) = deadline::Watch::start(backends, &serving, stop.clone()).await;
    let show = |e: Event| {
        if let Event::Progress(p) = &e {
            eta.observe(p.eta_hours.map(|h| Duration::from_secs_f64(h * 3600.0)));
        }
        view.lock().unwrap_or_else(|p| p.into_inner()).show(e)
    };
    let result = {
        let run = generate::run(config, targets, show, stop);
        tokio::pin!(run);
        loop {
            tokio::select! {
                r = &mut run => break r,
                note = ends.next_note() => {
                    view.lock().unwrap_or_else(|p| p.into_inner()).say(&note.message());
                }
            }
        }
    };
    let stopped_for_end = ends.finish().await;
    keep_stop.cancel();
    if let Some(k) = keeper {
        k.await.context("the gateway's worker watch failed")?;
    }
    let view = view.into_inner().unwrap_or_else(|p| p.into_inner());
    drop(fleet);
    let summary = result.map_err(|e| match e {
        // The user's input or --out choice, not a failure of the fleet.
        GenerateError::Journal(JournalError::NotEmpty { .. })
        | GenerateError::Input(InputError::Duplicate { .. })
        | GenerateError::Lock(LockError::Held { .. })
        | GenerateError::InputChanged { .. }
        | GenerateError::FormatChanged { .. }
        | GenerateError::OutNotADirectory { .. }
        | GenerateError::OutUnusable { .. } => UsageError::new(e).into(),
        other => anyhow::Error::new(other),
    })?;
    view.finish();
    let mut ended = Ended::of(summary.progress, &args.out, ctx.format())?;
    if summary.not_uploaded.is_empty() && summary.ended == End::Done {
        ended.uploaded_to = args.upload.clone();
    }
    super::emit(ctx, &ended)?;
    let p = &ended.progress;
    if let Some(dest) = &args.upload
        && !summary.not_uploaded.is_empty()
    {
        eoutln!(
            "{} shards are not uploaded to {dest} (they are kept in {}):",
            summary.not_uploaded.len(),
            args.out.display()
        );
        for (shard, why) in &summary.not_uploaded {
            eoutln!("  {shard}: {why}");
        }
        eoutln!("upload them with the same command plus --resume");
    }
    let uploads_missing = !summary.not_uploaded.is_empty();
    match summary.ended {
        End::Done if uploads_missing => {
            anyhow::bail!(
                "the upload to {} is incomplete",
                args.upload.as_deref().unwrap_or("?")
            )
        }
        End::Done if p.waiting_retry > 0 => {
            eoutln!(
                "{} prompts are waiting for a retry: the servers kept failing them (see {}); \
                 the same command plus --resume sends them again",
                p.waiting_retry,
                args.out.join("retry.jsonl").display()
            );
            Ok(Outcome::Partial)
        }
        End::Done if p.failed > 0 => {
            eoutln!(
                "{} prompts failed: see {}",
                p.failed,
                args.out.join("failed.jsonl").display()
            );
            Ok(Outcome::Partial)
        }
        End::Done => Ok(Outcome::Ok),
        End::Interrupted if stopped_for_end.is_some() && !ctx.cancel.is_cancelled() => {
            eoutln!(
                "stopped ahead of the allocation's end: after `fleet up` in a new allocation, \
                 continue with the same command plus --resume"
            );
            Ok(Outcome::Interrupted)
        }
        End::Interrupted => {
            eoutln!("interrupted: continue with the same command plus --resume");
            Ok(Outcome::Interrupted)
        }
        End::Stalled => {
            eoutln!(
                "interrupted: no instance was healthy for --stall-timeout ({}); nothing was \
                 recorded as failed; continue with the same command plus --resume",
                humantime::format_duration(args.stall_timeout)
            );
            Ok(Outcome::Interrupted)
        }
        End::BelowExpected(f) => {
            anyhow::bail!(
                "stopped by --abort-below: {}; output so far is kept",
                f.message()
            )
        }
    }
}

/// The running servers of this fleet (or of fleet `name`) on every host of the inventory, each
/// behind a port forward (none is a usage error), the hosts serving, and the profiles the
/// servers run. Other fleets' servers are theirs: a job never shares them unasked.
async fn fleet_targets(
    ctx: &Ctx,
    name: Option<&str>,
) -> anyhow::Result<(Fleet, Targets, BTreeSet<String>, Vec<String>)> {
    let fleet = Fleet::open(&ctx.global.config, &ctx.connect_options()).await?;
    fleet.log_unreachable();
    let all = fleet.servers().await;
    all.log_unread();
    let whose = name.unwrap_or(&fleet.owner.fleet).to_string();
    let others: BTreeSet<String> = all
        .running()
        .filter(|s| !crate::launch::owner::is_of(&s.record, &whose))
        .map(|s| (s.record.owner.as_ref()).map_or("unknown".into(), |o| o.fleet.clone()))
        .collect();
    let registry = all.only(&whose);
    let targets = fleet.reach(&registry).await;
    if targets.endpoints.is_empty() {
        let besides = match others.is_empty() {
            true => String::new(),
            false => format!(
                "; other fleets run servers there ({}): --fleet NAME uses theirs",
                others.into_iter().collect::<Vec<_>>().join(", ")
            ),
        };
        return Err(UsageError::new(format!(
            "no running instances of fleet {whose} found on the hosts of {} (run directory {}): \
             start them with `fleet up --profile P`, or pass --url http://HOST:PORT once per \
             server{besides}",
            ctx.global.config.display(),
            fleet.run_root()
        ))
        .into());
    }
    let serving = registry
        .running()
        .map(|s| s.record.host().to_string())
        .collect();
    let profiles: BTreeSet<String> = registry
        .running()
        .map(|s| s.record.profile.clone())
        .collect();
    Ok((fleet, targets, serving, profiles.into_iter().collect()))
}

/// Why the prompts cannot be read: the job reads them twice (the id pre-pass, then the run)
/// and resumes by byte offset, which a pipe or standard input cannot give.
#[derive(Debug, thiserror::Error)]
enum PromptsFileError {
    #[error("--prompts -: standard input cannot be used: {WHY}")]
    Stdin,
    #[error("--prompts {}: not a regular file (a pipe or a directory): {WHY}", .0.display())]
    NotRegular(std::path::PathBuf),
    #[error("--prompts {}: no such file", .0.display())]
    Missing(std::path::PathBuf),
}

const WHY: &str = "fleet reads the prompts twice (an id check before any request, then the \
                   job) and resumes by byte offset, so it needs a regular file; save the stream \
                   to a file first";

fn prompts_file(path: &std::path::Path) -> Result<(), PromptsFileError> {
    if path.as_os_str() == "-" {
        return Err(PromptsFileError::Stdin);
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(PromptsFileError::NotRegular(path.to_path_buf())),
        Err(_) => Err(PromptsFileError::Missing(path.to_path_buf())),
    }
}

fn config_from(args: &GenerateArgs) -> anyhow::Result<GenerateConfig> {
    let usage = |m: String| anyhow::Error::new(UsageError::new(m));
    let concurrency: ConcurrencyMode = args.concurrency.parse().map_err(UsageError::new)?;
    let api = args
        .endpoint
        .as_deref()
        .map(str::parse::<Api>)
        .transpose()
        .map_err(UsageError::new)?;
    let output_format = args
        .output_format
        .as_deref()
        .map(str::parse::<OutputFormat>)
        .transpose()
        .map_err(UsageError::new)?;
    if output_format == Some(OutputFormat::OpenaiBatch) && api == Some(Api::Generate) {
        return Err(usage(
            "--output-format openai-batch writes OpenAI response bodies, which /generate does \
             not answer\n  hint: use --endpoint chat or completions, or --output-format fleet"
                .into(),
        ));
    }
    if let Some(f) = args.abort_below
        && !(f > 0.0 && f <= 1.0)
    {
        return Err(usage(format!(
            "--abort-below must be a fraction in (0, 1], got {f}"
        )));
    }
    if args.max_tokens == 0 {
        return Err(usage("--max-tokens must be at least 1".into()));
    }
    if args.shard_lines == 0 {
        return Err(usage("--shard-lines must be at least 1".into()));
    }
    let upload = args
        .upload
        .as_deref()
        .map(Destination::open)
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    let mut c = GenerateConfig::new(args.prompts.clone(), args.out.clone());
    c.api = api;
    c.max_tokens = args.max_tokens;
    c.temperature = args.temperature;
    c.top_p = args.top_p;
    c.limit = args.limit;
    c.concurrency = concurrency;
    c.max_retries = args.max_retries;
    c.stall_timeout = args.stall_timeout;
    c.resume = args.resume;
    c.allow_changed_input = args.allow_changed_input;
    c.retry_failed = match args.retry_failed.as_deref() {
        None => RetryFailed::No,
        Some("all") => RetryFailed::All,
        Some(_) => RetryFailed::Changed,
    };
    c.warmup = args.warmup;
    c.abort_below = args.abort_below;
    c.grace = args.grace;
    c.sync.shard_lines = args.shard_lines;
    c.upload = upload;
    c.output_format = output_format;
    c.placement = args.placement.parse().map_err(UsageError::new)?;
    // Benchmarks and tests watch a sim run k times faster than real time with every cadence
    // (progress, metrics, the rate window) k times shorter: a user's first minute, sped up.
    if let Some(k) = std::env::var("FLEET_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|k| k.is_finite() && *k > 0.0)
    {
        c.timing = c.timing.scaled(k);
    }
    Ok(c)
}

/// `--url` endpoints; the API key comes from the profile's `api_key_env`, else `FLEET_API_KEY`.
fn endpoints_from(args: &GenerateArgs, profile: Option<&Profile>) -> anyhow::Result<Vec<Endpoint>> {
    let key_var = profile
        .and_then(|p| p.api_key_env.as_deref())
        .unwrap_or("FLEET_API_KEY");
    let api_key = std::env::var(key_var).ok().filter(|k| !k.is_empty());
    args.url
        .iter()
        .map(|given| {
            // `NAME=URL` names the server as a job on `fleet up` instances does (`host:gpuN`):
            // a detached job is given its servers this way.
            let (name, u) = match given.split_once("=http://") {
                Some((name, rest)) if !name.is_empty() => (Some(name), format!("http://{rest}")),
                _ => (None, given.clone()),
            };
            let u = &u;
            if !u.starts_with("http://") {
                return Err(UsageError::new(format!(
                    "--url {u:?}: expected http://HOST:PORT (servers are reached over plain HTTP, \
                     or through fleet's SSH forwards when --url is left out)"
                ))
                .into());
            }
            let mut e = Endpoint::from_url(u);
            if let Some(name) = name {
                e.id = ServerId::named(name);
            }
            e.api_key = api_key.clone();
            Ok(e)
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .context("invalid --url")
}

/// `--dry-run`: the input's prefix groups and what a radix cache could serve, without a server.
fn dry_run(ctx: &Ctx, c: &GenerateConfig) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let plan = generate::input::prefix::scan(&c.prompts, c.limit, c.max_tokens)?;
    let report = generate::input::prefix::Report::of(&plan, c.placement, started.elapsed());
    super::emit(ctx, &Planned(report))?;
    Ok(Outcome::Ok)
}

/// `fleet generate --dry-run`'s result.
#[derive(Serialize)]
#[serde(transparent)]
struct Planned(generate::input::prefix::Report);

impl Model for Planned {
    fn title(&self) -> String {
        "fleet generate --dry-run".into()
    }

    fn text(&self) -> String {
        self.0.render() + "\n"
    }
}

fn summary_line(p: &Progress) -> String {
    let eta = p.eta_text().unwrap_or_else(|| "unknown".into());
    let saved = if p.cached_tokens > 0 {
        format!(", {} prefill tokens saved by the cache", p.cached_tokens)
    } else {
        String::new()
    };
    format!(
        "{}: {}/{} completed, {} failed, {:.2} req/s, {} output tokens (avg {}), ETA {}, elapsed {:.2} h{saved}",
        p.status.as_str(),
        p.completed,
        p.total,
        p.failed,
        p.rate_per_sec,
        p.total_output_tokens,
        p.avg_output_tokens,
        eta,
        p.elapsed_hours
    )
}

/// The first line of a job: its placement, and for `auto` why.
fn placement_line(c: &PlacementChoice) -> String {
    let found = format!(
        "{} prefix groups hold {} of {} prompts, {:.0}% of prompt tokens cacheable",
        c.groups,
        c.grouped_prompts,
        c.prompts,
        c.expected_cached_fraction * 100.0
    );
    match (c.mode, c.prefix) {
        (PlacementMode::Auto, true) => format!("placement: prefix (auto: {found})"),
        (PlacementMode::Auto, false) => {
            format!("placement: least-loaded (auto: {found}, too few to be worth it)")
        }
        (_, true) => format!("placement: prefix ({found})"),
        (_, false) => "placement: least-loaded".into(),
    }
}

/// Renders engine events on stderr.
struct View {
    bar: Option<ProgressBar>,
    last_log: Instant,
    malformed: u64,
}

const MALFORMED_SHOWN: u64 = 20;

impl View {
    fn new(terminal: bool) -> Self {
        View {
            bar: terminal.then(ProgressBar::hidden),
            last_log: Instant::now(),
            malformed: 0,
        }
    }

    fn say(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eoutln!("{line}")),
            None => eoutln!("{line}"),
        }
    }

    fn show(&mut self, event: Event) {
        match event {
            Event::Placement(c) => self.say(&placement_line(&c)),
            Event::Started {
                total,
                already_done,
                truncated_bytes,
                instances,
            } => {
                if truncated_bytes > 0 {
                    self.say(&format!(
                        "resume: cut a torn final line ({truncated_bytes} bytes) left by a crash"
                    ));
                }
                if already_done > 0 {
                    self.say(&format!(
                        "resume: {already_done} of {total} prompts already done"
                    ));
                }
                for i in &instances {
                    let line = match &i.unavailable {
                        Some(why) => format!("  {:<24} unavailable: {why}", i.name),
                        None => format!(
                            "  {:<24} cap {:>5}  in-flight {:>5}  context {:>6}  sglang {}",
                            i.name,
                            i.server_cap.map_or("?".into(), |c| c.to_string()),
                            i.concurrency,
                            i.context_length.map_or("?".into(), |c| c.to_string()),
                            i.version.as_deref().unwrap_or("?")
                        ),
                    };
                    self.say(&line);
                }
                if let Some(bar) = &self.bar {
                    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                    bar.set_length(total);
                    bar.set_position(already_done);
                    bar.set_style(
                        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                            .expect("valid template"),
                    );
                }
            }
            Event::MalformedLine { line, error } => {
                self.malformed += 1;
                if self.malformed <= MALFORMED_SHOWN {
                    self.say(&format!(
                        "warning: prompts line {line}: {error} (recorded in failed.jsonl)"
                    ));
                } else if self.malformed == MALFORMED_SHOWN + 1 {
                    self.say("warning: more malformed lines; see failed.jsonl");
                }
            }
            Event::InstanceDown { name, reason } => self.say(&format!(
                "warning: {name} taken out: {reason}; its requests go elsewhere"
            )),
            Event::InstanceUp { name, server_cap } => self.say(&format!(
                "{name} is healthy again (cap {})",
                server_cap.map_or("?".into(), |c| c.to_string())
            )),
            Event::Paused {
                stall_timeout,
                instance,
                reason,
            } => self.say(&format!(
                "warning: paused: no instance is healthy (last out: {instance}: {reason}); probing, and \
                 going on by itself when one is back; interrupted after {} (resume with --resume)",
                humantime::format_duration(stall_timeout)
            )),
            Event::HostLost { host, reason } => self.say(&format!(
                "warning: host {host} lost ({reason}): its requests move to the other hosts; \
                 reconnecting"
            )),
            Event::HostBack { host } => self.say(&format!("host {host} is back")),
            Event::InputGrew { bytes } => self.say(&format!(
                "warning: {bytes} bytes were appended to the prompts after the job began; they \
                 are not part of it (run a new job over them)"
            )),
            Event::Resumed => self.say("an instance is back: resuming"),
            Event::Watchdog(f) => {
                let rule = "!".repeat(78);
                self.say(&format!("{rule}\nWATCHDOG: {}\n{rule}", f.message()));
            }
            Event::Stopping { reason, in_flight } => self.say(&format!(
                "stopping ({reason}): waiting for {in_flight} requests in flight"
            )),
            Event::FileBudget {
                open_files_limit,
                max_in_flight,
                wanted,
                per_server,
            } => self.say(&format!(
                "note: the open-file limit ({open_files_limit}) leaves room for {max_in_flight} \
                 requests in flight over all servers: {per_server} per server where \
                 --concurrency wants {wanted}; raise the hard limit (`ulimit -Hn`, or \
                 LimitNOFILE= in a unit) to send more"
            )),
            Event::OutOfFiles { error } => self.say(&format!(
                "warning: fleet ran out of open files ({error}); the requests wait and go \
                 again, and no server is taken out for it"
            )),
            Event::Progress(p) => self.progress(&p),
            Event::Upload(e) => self.upload(e),
        }
    }

    fn progress(&mut self, p: &Progress) {
        let tok_s = p.output_tok_s;
        let eta = p.eta_text().unwrap_or_else(|| "?".into());
        match &self.bar {
            Some(bar) => {
                bar.set_position(p.completed + p.failed);
                bar.set_message(format!(
                    "{:.1} req/s  {:.0} tok/s  ETA {eta}  failed {}",
                    p.rate_per_sec, tok_s, p.failed
                ));
            }
            None => {
                if self.last_log.elapsed() >= LOG_EVERY {
                    self.last_log = Instant::now();
                    eoutln!(
                        "{}/{} done ({} failed), {:.2} req/s, {:.0} output tok/s, ETA {eta}",
                        p.completed + p.failed,
                        p.total,
                        p.failed,
                        p.rate_per_sec,
                        tok_s
                    );
                }
            }
        }
    }

    fn upload(&mut self, e: UploadEvent) {
        match e {
            UploadEvent::Uploaded {
                shard,
                bytes,
                elapsed,
            } => {
                let secs = elapsed.as_secs_f64();
                let mb = bytes as f64 / 1e6;
                let rate = if secs > 0.0 { mb / secs } else { f64::INFINITY };
                self.say(&format!(
                    "uploaded {shard}: {mb:.1} MB in {secs:.1} s ({rate:.1} MB/s)"
                ));
            }
            UploadEvent::AlreadyThere { shard, .. } => {
                self.say(&format!("{shard} is already uploaded"))
            }
            UploadEvent::Retrying {
                shard,
                attempt,
                wait,
                error,
            } => self.say(&format!(
                "warning: uploading {shard} failed (try {attempt}): {error}; retrying in {}",
                humantime::format_duration(wait)
            )),
            UploadEvent::Failed { shard, error } => self.say(&format!(
                "warning: {shard} is not uploaded: {error}; it stays in the output directory"
            )),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

//! Detached jobs from anywhere: `generate --detach` (start one on a GPU host), `jobs`, `stop`,
//! `fetch`, and the job halves of `progress` and `logs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::cli::{FetchArgs, GenerateArgs, StopArgs};
use crate::config;
use crate::generate::progress::{PROGRESS_FILE, Progress};
use crate::jobs::place::place;
use crate::jobs::{self, JobError, JobSpec, JobView, transfer};
use crate::launch::Fleet;
use crate::remote::Transport;
use crate::render::{Format, Model};
use crate::report::table;

use super::output::eoutln;
use super::{Ctx, Outcome, UsageError};

/// `fleet generate --detach`'s result: the job started, where, and writing where.
#[derive(Serialize)]
pub struct Detached {
    pub job: String,
    pub host: String,
    pub out: String,
    #[serde(skip)]
    pub pid: u32,
}

impl Model for Detached {
    fn title(&self) -> String {
        format!("fleet generate --detach: job {}", self.job)
    }

    fn text(&self) -> String {
        let id = &self.job;
        format!(
            "job {id} runs on {} (pid {}), writing {}\n  \
             follow: fleet progress {id}   (or: fleet logs {id} -f, fleet jobs)\n  \
             stop:   fleet stop {id}\n  \
             fetch:  fleet fetch {id} DIR\n",
            self.host, self.pid, self.out
        )
    }
}

/// `fleet jobs`'s result: every detached job found.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Jobs(pub Vec<JobView>);

impl Model for Jobs {
    fn title(&self) -> String {
        "fleet jobs".into()
    }

    fn text(&self) -> String {
        let rows = self.0.iter().map(|v| {
            let p = v.progress.as_ref();
            vec![
                v.record.id.clone(),
                v.record.host.clone(),
                v.state.clone(),
                p.map_or("-".into(), |p| {
                    format!("{}/{}", p.completed + p.failed, p.total)
                }),
                p.map_or("-".into(), |p| format!("{:.2}", p.rate_per_sec)),
                p.and_then(|p| p.eta_text()).unwrap_or_else(|| "-".into()),
                ago(v.record.started_unix),
                v.record.out.clone(),
            ]
        });
        table(
            &[
                "JOB", "HOST", "STATUS", "DONE", "REQ/S", "ETA", "STARTED", "OUT",
            ],
            rows,
        )
    }
}

/// `fleet stop`'s result: the job as it is after the stop.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Stopped(pub JobView);

impl Model for Stopped {
    fn title(&self) -> String {
        format!("fleet stop {}", self.0.record.id)
    }

    fn text(&self) -> String {
        let after = &self.0;
        let done = after.progress.as_ref().map_or("no progress".into(), |p| {
            format!("{}/{} done", p.completed + p.failed, p.total)
        });
        let mut text = format!("job {}: {} ({done})\n", after.record.id, after.state);
        if after.alive {
            text.push_str(
                "  still finishing its requests in flight; `fleet jobs` shows when it ends\n",
            );
        } else if after.state != "done" {
            text.push_str(&format!(
                "  continue it with: fleet generate --detach --resume --prompts {}:{} --out {}\n",
                after.record.host, after.record.prompts, after.record.out
            ));
        }
        text
    }
}

/// Every host of the inventory that answers; the others are logged. None answering is an error:
/// nothing to report on, so the command failed rather than half-succeeded.
async fn connect(ctx: &Ctx) -> anyhow::Result<Fleet> {
    let fleet = Fleet::open(&ctx.global.config, &ctx.connect_options()).await?;
    Ok(fleet.some_host()?)
}

/// A new job's id: when it started (UTC), and four random hex digits.
fn new_id() -> String {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let stamp: String = stamp.chars().filter(char::is_ascii_alphanumeric).collect();
    format!(
        "{}-{:04x}",
        stamp.trim_end_matches('Z').replace('T', "-"),
        rand::random::<u16>()
    )
}

/// The flags of `fleet generate` the detached job does not get as they were given, and why.
/// Every other flag given reaches it as the user wrote it.
const REWRITTEN: [(&str, &str); 6] = [
    (
        "prompts",
        "a local file is sent into the job's directory; HOST:PATH becomes PATH",
    ),
    (
        "url",
        "without --url, the URLs of the host's instances as the job reaches them there",
    ),
    (
        "profile",
        "the profile is written into the job's directory: the host has no profiles directory",
    ),
    (
        "detach",
        "dropped: the job itself runs in the foreground there",
    ),
    ("host", "dropped: the job already runs on that host"),
    (
        "fleet",
        "dropped: the job's --url already names that fleet's servers",
    ),
];

/// The `fleet generate` command line of this process, as clap parsed it: the detached job's
/// argv is derived from it, so a new flag reaches the job without a line here.
fn given_generate() -> anyhow::Result<clap::ArgMatches> {
    use clap::CommandFactory;
    let matches = crate::cli::Cli::command().try_get_matches_from(std::env::args_os())?;
    matches
        .subcommand_matches("generate")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("--detach outside `fleet generate`"))
}

/// The detached job's argv: `binary generate`, each flag of `generate` that `given` holds from
/// the command line (or the environment) as it was given, but those of [`REWRITTEN`], which
/// take their values from `rewritten` (a name missing there is dropped), and `-q`.
fn job_argv(
    binary: String,
    given: &clap::ArgMatches,
    rewritten: &[(&str, Vec<String>)],
) -> Vec<String> {
    use clap::parser::ValueSource;
    let command = <GenerateArgs as clap::Args>::augment_args(clap::Command::new("generate"));
    let mut argv = vec![binary, "generate".to_string()];
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else {
            continue;
        };
        if REWRITTEN.iter().any(|(name, _)| *name == id) {
            let values = rewritten.iter().filter(|(name, _)| *name == id);
            for value in values.flat_map(|(_, v)| v) {
                argv.push(format!("--{long}={value}"));
            }
            continue;
        }
        let from_user = matches!(
            given.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if !from_user {
            // Not given: the job's own default, the same binary's.
            continue;
        }
        if arg.get_action().takes_values() {
            let occurrences = given.get_raw_occurrences(id).into_iter().flatten();
            for values in occurrences {
                for value in values {
                    argv.push(format!("--{long}={}", value.to_string_lossy()));
                }
            }
        } else if given.get_flag(id) {
            argv.push(format!("--{long}"));
        }
    }
    argv.push("-q".into());
    argv
}

/// `fleet generate --detach`: starts the job on a host of the inventory, beside its servers.
pub async fn detach(ctx: &Ctx, args: &GenerateArgs) -> anyhow::Result<Outcome> {
    let fleet = connect(ctx).await?;
    let transports = fleet.shells();
    let run_root = fleet.run_root().to_string();
    // This fleet's servers (or --fleet's), per host, as the job will reach them there.
    let registry = fleet.servers_of(args.fleet.as_deref()).await.whole()?;
    let answered: Vec<&str> = transports.keys().map(String::as_str).collect();
    let placed = place(
        &registry,
        &answered,
        args.host.as_deref(),
        &args.url,
        &ctx.global.config,
    )
    .map_err(UsageError::new)?;
    let host = placed.host.clone();
    if !placed.unused.is_empty() && args.host.is_none() && !ctx.global.quiet {
        eoutln!(
            "note: the job runs on {host}, with its {} instances; the instances of {} are not \
             used (pass --host for a job there)",
            placed.servers,
            placed.unused.join(", ")
        );
    }
    let t = transports[&host].clone();
    let out = args.out.display().to_string();
    let earlier = jobs::list(t.as_ref(), &run_root).await?;
    let same_out = earlier.iter().find(|v| v.record.out == out);
    if let Some(v) = same_out.filter(|v| v.alive) {
        return Err(UsageError::new(JobError::AlreadyRunning {
            host: host.clone(),
            id: v.record.id.clone(),
            pid: v.record.pid,
            out: out.clone(),
        })
        .into());
    }
    // A resumed job keeps its id and directory.
    let id = match same_out.filter(|_| args.resume) {
        Some(v) => v.record.id.clone(),
        None => new_id(),
    };
    let dir = jobs::job_dir(&run_root, &id);
    let binary = jobs::fleet_on(t.as_ref(), &dir).await?;

    let given = args.prompts.display().to_string();
    let prompts = match given.split_once(':') {
        Some((h, path)) if transports.contains_key(h) => {
            if h != host {
                return Err(UsageError::new(format!(
                    "--prompts {given}: the file is on {h}, but the job runs on {host}"
                ))
                .into());
            }
            path.to_string()
        }
        _ => {
            if !args.prompts.is_file() {
                return Err(UsageError::new(format!(
                    "--prompts {given}: no such file here (a file on the host is HOST:PATH)"
                ))
                .into());
            }
            let remote = format!("{dir}/prompts.jsonl");
            transfer::upload(t.as_ref(), &args.prompts, &remote).await?;
            remote
        }
    };
    let mut rewritten = vec![("prompts", vec![prompts.clone()]), ("url", placed.urls)];
    let mut env = BTreeMap::new();
    if let Some(key) = placed
        .api_key_env
        .as_ref()
        .and_then(|v| std::env::var(v).ok())
    {
        crate::remote::add_secret(&key);
        env.insert("FLEET_API_KEY".to_string(), key);
    }
    if let Some(p) = &args.profile {
        let profile = config::load_profile(p, &ctx.global.profiles_dir)?;
        let remote = format!("{dir}/profile.yaml");
        let script = r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#;
        let sh = ["sh", "-c", script, "sh", &remote].map(String::from);
        let written = t.run_input(&sh, profile.to_yaml().as_bytes()).await?;
        if !written.success() {
            anyhow::bail!(
                "{host}: cannot write {remote}: {}",
                written.stderr_lossy().trim()
            );
        }
        rewritten.push(("profile", vec![remote]));
    }
    let generate = job_argv(binary.clone(), &given_generate()?, &rewritten);
    let backend = fleet
        .backend(&host)
        .expect("a job is placed on a host of the fleet");
    let command = backend.job_command(&id, generate).await?;
    let record = jobs::start(
        t.as_ref(),
        &run_root,
        JobSpec {
            id: id.clone(),
            out: out.clone(),
            prompts,
            binary,
            argv: command.argv,
            env,
            stop: command.stop,
        },
    )
    .await?;
    jobs::settle(t.as_ref(), &run_root, &id).await?;
    let started = Detached {
        job: id,
        host,
        out,
        pid: record.pid,
    };
    super::emit(ctx, &started)?;
    Ok(Outcome::Ok)
}

fn ago(unix: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let secs = now.saturating_sub(unix);
    humantime::format_duration(Duration::from_secs(secs))
        .to_string()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        + " ago"
}

/// `fleet jobs`: every job on every reachable host.
pub async fn list(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let fleet = connect(ctx).await?;
    let mut partial = !fleet.unreachable.is_empty();
    let lists = fleet
        .backends()
        .map(|b| jobs::list(b.shell().as_ref(), b.run_root()));
    let mut views: Vec<JobView> = Vec::new();
    for found in futures::future::join_all(lists).await {
        match found {
            Ok(v) => views.extend(v),
            Err(e) => {
                tracing::error!("{e}");
                partial = true;
            }
        }
    }
    let jobs = Jobs(views);
    super::emit(ctx, &jobs)?;
    let views = jobs.0;
    if ctx.format() == Format::Text {
        for v in &views {
            if let Some(tail) = &v.log_tail {
                eoutln!(
                    "{} on {}: dead; its log ends:\n{tail}",
                    v.record.id,
                    v.record.host
                );
            }
            for w in v.progress.iter().flat_map(|p| &p.warnings) {
                eoutln!("{} on {}: {w}", v.record.id, v.record.host);
            }
        }
    }
    Ok(if partial {
        Outcome::Partial
    } else {
        Outcome::Ok
    })
}

/// The job `id`, wherever it is.
async fn find(ctx: &Ctx, id: &str) -> anyhow::Result<(Arc<dyn Transport>, JobView)> {
    let fleet = connect(ctx).await?;
    match jobs::find(&fleet.shells(), fleet.run_root(), id).await {
        Ok(found) => Ok(found),
        Err(e @ JobError::NotFound { .. }) => Err(UsageError::new(e).into()),
        Err(e) => Err(e.into()),
    }
}

/// `fleet progress JOB`: the job's progress.json, as `fleet progress DIR` shows a local one.
pub async fn progress(ctx: &Ctx, id: &str) -> anyhow::Result<Option<Progress>> {
    let (_, view) = find(ctx, id).await?;
    if view.progress.is_none() {
        eoutln!(
            "job {id} on {}: {} (no progress yet)",
            view.record.host,
            view.state
        );
    }
    if let Some(tail) = &view.log_tail {
        eoutln!(
            "job {id} on {} is dead; its log ends:\n{tail}",
            view.record.host
        );
    }
    Ok(view.progress)
}

/// `fleet stop JOB`.
pub async fn stop(ctx: &Ctx, args: &StopArgs) -> anyhow::Result<Outcome> {
    let (t, view) = find(ctx, &args.job).await?;
    let after = jobs::stop(&t, &view, args.wait).await?;
    super::emit(ctx, &Stopped(after))?;
    Ok(Outcome::Ok)
}

/// What a job's output directory holds that `fetch` copies.
fn fetched_name(name: &str) -> bool {
    (name.starts_with("completions-") && name.ends_with(".jsonl"))
        || ["failed.jsonl", "retry.jsonl", PROGRESS_FILE, "input.json"].contains(&name)
}

/// `fleet fetch JOB DIR`.
pub async fn fetch(ctx: &Ctx, args: &FetchArgs) -> anyhow::Result<Outcome> {
    let (t, view) = find(ctx, &args.job).await?;
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| UsageError::new(format!("{}: {e}", args.dir.display())))?;
    let script = r#"cd -- "$1" 2>/dev/null && ls -1A; true"#;
    let listing = t
        .run(&["sh", "-c", script, "sh", &view.record.out].map(String::from))
        .await?
        .stdout_lossy();
    let (mut copied, mut complete) = (0u32, 0u32);
    for name in listing.lines().filter(|n| fetched_name(n)) {
        let local = args.dir.join(name);
        // progress.json is rewritten in place: always the latest.
        if name == PROGRESS_FILE {
            let _ = std::fs::remove_file(&local);
        }
        let got =
            transfer::download(t.as_ref(), &format!("{}/{name}", view.record.out), &local).await?;
        match got {
            _ if name == PROGRESS_FILE => {}
            transfer::Fetched::Complete => complete += 1,
            transfer::Fetched::Copied(_) => copied += 1,
            transfer::Fetched::Missing => {}
        }
    }
    if !ctx.global.quiet {
        eoutln!(
            "job {} ({}): {copied} files copied, {complete} already complete, and its \
             progress.json, into {}",
            view.record.id,
            view.state,
            args.dir.display()
        );
    }
    Ok(Outcome::Ok)
}

/// Whether `arg` names a local output directory (or progress file) rather than a job.
pub fn is_local(arg: &str) -> bool {
    Path::new(arg).exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory, Parser};

    /// A value `fleet generate` accepts for the flag `id`, unlike its default.
    fn sample(arg: &clap::Arg) -> Option<String> {
        if !arg.get_action().takes_values() {
            return None;
        }
        if let Some(last) = arg.get_possible_values().last() {
            return Some(last.get_name().to_string());
        }
        let value = match arg.get_id().as_str() {
            "prompts" => "in.jsonl",
            "out" => "/srv/out",
            "url" => "http://10.0.0.9:30000",
            "profile" => "blackwell",
            "endpoint" => "completions",
            "max_tokens" => "77",
            "temperature" => "0.5",
            "top_p" => "0.9",
            "limit" => "12",
            "concurrency" => "8",
            "max_retries" => "5",
            "stall_timeout" => "7m",
            "upload" => "file:///srv/up",
            "shard_lines" => "99",
            "warmup" => "11s",
            "abort_below" => "0.25",
            "grace" => "13s",
            "host" => "ct201",
            "fleet" => "a-1f2e3d",
            other => panic!("a new flag of generate, {other}: give it a sample value here"),
        };
        Some(value.to_string())
    }

    fn generate(argv: &[String]) -> (GenerateArgs, clap::ArgMatches, bool) {
        let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let matches = Cli::command().get_matches_from(argv);
        let Command::Generate(args) = cli.command else {
            panic!("not generate: {argv:?}");
        };
        let sub = matches.subcommand_matches("generate").unwrap().clone();
        (args, sub, cli.global.quiet)
    }

    #[test]
    fn every_generate_flag_reaches_the_detached_job_or_is_rewritten_on_purpose() {
        let command = <GenerateArgs as clap::Args>::augment_args(clap::Command::new("generate"));
        let mut argv: Vec<String> = vec!["fleet".into(), "generate".into()];
        let mut walked = Vec::new();
        for arg in command.get_arguments() {
            // A job through the gateway is never detached: clap refuses the two together.
            if arg.get_id() == "via_router" {
                continue;
            }
            let long = arg.get_long().expect("every flag of generate is long");
            argv.push(format!("--{long}"));
            argv.extend(sample(arg));
            walked.push(arg.get_id().to_string());
        }
        let (given, matches, _) = generate(&argv);
        let rewritten = [
            (
                "prompts",
                vec!["/run/fleet/jobs/j/prompts.jsonl".to_string()],
            ),
            ("url", vec!["http://10.0.0.9:30000".to_string()]),
            (
                "profile",
                vec!["/run/fleet/jobs/j/profile.yaml".to_string()],
            ),
        ];
        let job = job_argv("fleet".into(), &matches, &rewritten);
        let (on_host, _, quiet) = generate(&job);
        assert!(quiet, "the job logs only warnings: {job:?}");

        let mut expected = given.clone();
        expected.prompts = "/run/fleet/jobs/j/prompts.jsonl".into();
        expected.profile = Some("/run/fleet/jobs/j/profile.yaml".into());
        expected.detach = false;
        expected.host = None;
        expected.fleet = None;
        assert_eq!(format!("{on_host:?}"), format!("{expected:?}"), "{job:?}");
        for id in &walked {
            let dropped = ["detach", "host", "fleet"].contains(&id.as_str());
            let long = format!("--{}", id.replace('_', "-"));
            let present = job
                .iter()
                .any(|a| a == &long || a.starts_with(&format!("{long}=")));
            assert_eq!(present, !dropped, "{long} in {job:?}");
        }
        for (name, why) in REWRITTEN {
            assert!(walked.iter().any(|w| w == name), "{name} is no flag: {why}");
        }
    }

    #[test]
    fn a_flag_left_at_its_default_is_left_to_the_jobs_own_default() {
        let argv = [
            "fleet",
            "generate",
            "--prompts",
            "in.jsonl",
            "--out",
            "o",
            "--detach",
        ]
        .map(String::from);
        let (_, matches, _) = generate(&argv);
        let urls = vec!["http://a:1".to_string(), "http://b:2".to_string()];
        let job = job_argv(
            "bin".into(),
            &matches,
            &[("prompts", vec!["p".into()]), ("url", urls)],
        );
        assert_eq!(
            job,
            [
                "bin",
                "generate",
                "--prompts=p",
                "--out=o",
                "--url=http://a:1",
                "--url=http://b:2",
                "-q"
            ]
        );
    }
}

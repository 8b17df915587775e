//! Command-line definitions (clap derive) for the `fleet` binary; no behaviour lives here.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::render::Format;

/// A duration flag clap could not read, with the forms it takes.
#[derive(Debug, thiserror::Error)]
#[error("{0} (use e.g. 90s, 20m, 1h)")]
pub struct DurationArgError(#[from] humantime::DurationError);

fn parse_duration(s: &str) -> Result<Duration, DurationArgError> {
    Ok(humantime::parse_duration(s)?)
}

#[derive(Debug, Parser)]
#[command(
    name = "fleet",
    version,
    about = "Launch, tune and drive fleets of SGLang inference servers on GPU hosts",
    after_help = "Manual: docs/SUMMARY.md; each command's page: docs/reference/COMMAND.md",
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Inventory file: where things run.
    #[arg(
        long,
        global = true,
        env = "FLEET_CONFIG",
        default_value = "fleet.yaml"
    )]
    pub config: PathBuf,
    /// Directory that `--profile NAME` resolves in.
    #[arg(
        long,
        global = true,
        env = "FLEET_PROFILES_DIR",
        default_value = "profiles"
    )]
    pub profiles_dir: PathBuf,
    /// How results are printed on stdout: text (tables), json, or html (one self-contained page).
    ///
    /// Live progress and messages stay on stderr.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,
    /// Same as --format json.
    #[arg(long, global = true, conflicts_with = "format")]
    pub json: bool,
    /// More logs on stderr (-v: every remote command as sent, secrets masked; -vv: debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only warnings and errors on stderr, no live progress.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Trust and record the host key of an SSH host seen for the first time.
    ///
    /// OpenSSH's StrictHostKeyChecking=accept-new. A changed key is always refused.
    #[arg(long, global = true)]
    pub accept_new_host_key: bool,
    /// How long to wait for an SSH connection before giving up on a host.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
}

impl GlobalArgs {
    /// The format asked for, `--json` being `--format json`; `None` when neither was given.
    pub fn asked_format(&self) -> Option<Format> {
        self.format.or(self.json.then_some(Format::Json))
    }

    /// The format results are printed in: text unless `--format` or `--json` says otherwise.
    pub fn format(&self) -> Format {
        self.asked_format().unwrap_or(Format::Text)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Preflight, start one server per GPU, wait until ready and print the fleet.
    #[command(after_help = "Manual: docs/reference/up.md")]
    Up(UpArgs),
    /// Health, load and GPU use of every server fleet started on the hosts, whosever.
    #[command(after_help = "Manual: docs/reference/status.md")]
    Status(StatusArgs),
    /// Stop what this fleet started (SIGTERM, then SIGKILL after the grace period).
    #[command(after_help = "Manual: docs/reference/down.md")]
    Down(DownArgs),
    /// Show an instance's server log.
    #[command(after_help = "Manual: docs/reference/logs.md")]
    Logs(LogsArgs),
    /// GPU table for every host of the inventory.
    #[command(after_help = "Manual: docs/reference/gpus.md")]
    Gpus,
    /// Run a command on every host (inside the container for pct hosts).
    #[command(after_help = "Manual: docs/reference/exec.md")]
    Exec(ExecArgs),
    /// Inspect and validate profiles.
    #[command(subcommand, after_help = "Manual: docs/reference/profile.md")]
    Profile(ProfileCommand),
    /// Measure candidate server configs side by side and pick the fastest.
    #[command(after_help = "Manual: docs/reference/sweep.md")]
    Sweep(SweepArgs),
    /// Run a resumable batch generation job over every healthy instance.
    #[command(after_help = "Manual: docs/reference/generate.md")]
    Generate(GenerateArgs),
    /// Summarise a generate job: a detached job by id, or a local output directory.
    #[command(after_help = "Manual: docs/reference/progress.md")]
    Progress(ProgressArgs),
    /// Every detached generate job on every reachable host.
    #[command(after_help = "Manual: docs/reference/jobs.md")]
    Jobs,
    /// Stop a detached job as Ctrl-C would: in-flight requests finish, it ends interrupted.
    #[command(after_help = "Manual: docs/reference/stop.md")]
    Stop(StopArgs),
    /// Copy a detached job's shards, failed.jsonl and progress.json here (resumable).
    #[command(after_help = "Manual: docs/reference/fetch.md")]
    Fetch(FetchArgs),
    /// One page of a sweep and a job: text, JSON or a self-contained offline HTML file.
    #[command(after_help = "Manual: docs/reference/report.md")]
    Report(ReportArgs),
    /// The whole flow on a local simulated fleet of 8 GPUs: no GPU, config or network needed.
    #[command(after_help = "Manual: docs/reference/demo.md")]
    Demo(DemoArgs),
    /// Print shell completions.
    #[command(after_help = "Manual: docs/reference/completions.md")]
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// A sweep.json, a `fleet generate --out` directory (local or `fleet fetch`ed), or one of each.
    #[arg(required = true, value_name = "SOURCE")]
    pub sources: Vec<PathBuf>,
    /// Write the report to this file instead of stdout.
    ///
    /// HTML unless --format or --json says otherwise; without -o, text unless they do.
    #[arg(short, long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Prompts the sweep's ETAs are for (default: the job's total, when a job is given).
    #[arg(long)]
    pub total: Option<u64>,
    /// What one GPU-hour costs: adds each candidate's cost per 1M output tokens.
    #[arg(long, value_name = "COST")]
    pub gpu_hour_cost: Option<f64>,
}

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Profile name (resolved in --profiles-dir) or path to a profile file.
    #[arg(long)]
    pub profile: String,
    /// Only these GPU indices, e.g. 0,1,5.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<u32>>,
    /// Restart instances that run a different config.
    #[arg(long)]
    pub replace: bool,
    /// Print the plan and start nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not check flags against the launcher's --help before starting.
    #[arg(long)]
    pub skip_preflight: bool,
    /// Leave started servers running when interrupted (Ctrl-C, SIGTERM, SIGHUP).
    #[arg(long)]
    pub keep_on_interrupt: bool,
    /// Then keep the gateway's worker list true (lost servers out, new ones in) until Ctrl-C.
    #[arg(long)]
    pub watch: bool,
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Only this fleet's servers; without it, every server on the hosts, others marked.
    #[arg(long)]
    pub mine: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DownArgs {
    /// Only instances started with this profile.
    #[arg(long)]
    pub profile: Option<String>,
    /// Stop every server fleet started on the inventory's GPUs, whichever fleet started it.
    ///
    /// Servers from before fleet recorded owners too. Says what it stops before stopping it.
    #[arg(long, conflicts_with = "fleet")]
    pub all: bool,
    /// Stop fleet NAME's servers on the inventory's GPUs instead of this fleet's.
    ///
    /// NAME is the FLEET column of `fleet status`. Says what it stops before stopping it.
    #[arg(long, value_name = "NAME")]
    pub fleet: Option<String>,
    /// How long to wait after SIGTERM before SIGKILL.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Print what would be stopped and stop nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// `host:gpu` (e.g. ct200:5), a port (e.g. 30005), `router`, or a detached job's id.
    pub instance: String,
    /// Number of lines from the end.
    #[arg(short = 'n', long, default_value_t = 100)]
    pub lines: usize,
    /// Keep printing new lines as they arrive.
    #[arg(short, long)]
    pub follow: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// Only this host (by inventory name); default: every host.
    #[arg(long)]
    pub host: Option<String>,
    /// The command and its arguments, passed as an argv (never through a local shell).
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    pub argv: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Print the resolved profile (after `extends:`).
    #[command(after_help = "Manual: docs/reference/profile.md")]
    Show {
        /// Profile name (resolved in --profiles-dir) or path to a profile file.
        name: String,
    },
    /// Validate the named profiles, or every profile in --profiles-dir.
    #[command(after_help = "Manual: docs/reference/profile.md")]
    Check {
        /// Profile names or paths (default: every *.yaml in --profiles-dir).
        names: Vec<String>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// The base profile every candidate starts from (name in --profiles-dir, or a path).
    ///
    /// Default: the profile of the fleet `fleet up` started.
    #[arg(long)]
    pub profile: Option<String>,
    /// Mamba strategies to compare, e.g. extra_buffer,no_buffer.
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Another axis: KEY=V1,V2,... or a range KEY=LO..HI (LO..HI:log for a log scale).
    ///
    /// KEY is a profile key (server.mem_fraction_static) or flag.NAME for any SGLang flag without its
    /// dashes (flag.cuda-graph-max-bs-decode=16..512); repeatable. Values are YAML; a value with a comma is quoted
    /// ('env.X="a,b"',c) or escaped (a\,b), and commas inside [...] or {...} do not split.
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Measure with a sample of these prompts (JSONL, as for `fleet generate`).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// How many prompts to sample from --prompts.
    ///
    /// A trial draws them without repetition (a
    /// repeated prompt's prefill comes from SGLang's radix cache); one that needs more says so.
    #[arg(long, default_value_t = 10_000)]
    pub sample: usize,
    /// Seed of the --prompts sample: the same seed gives the same sample.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Synthetic prompt length in tokens (without --prompts).
    #[arg(long, default_value_t = 1024)]
    pub input_len: u32,
    /// Synthetic output length in tokens (without --prompts; EOS is ignored).
    #[arg(long, default_value_t = 988)]
    pub output_len: u32,
    /// max_tokens of --prompts requests, as `fleet generate --max-tokens`.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: u32,
    /// generate | chat | completions, as `fleet generate --endpoint`.
    ///
    /// Default: chat for messages, generate for prompt.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// How long each trial is measured, after the warm-up.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Load before measuring, so that batches are full when the window opens.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Run candidates side by side on disjoint GPUs (the default).
    ///
    /// In rounds, one GPU each, when they outnumber the GPUs.
    #[arg(long, conflicts_with = "sequential")]
    pub parallel: bool,
    /// Restart the whole fleet for each candidate, one at a time.
    #[arg(long)]
    pub sequential: bool,
    /// In rounds, give every candidate the full --duration: no successive halving.
    ///
    /// Without it, those clearly behind the leader stop after a first window of a quarter of it.
    #[arg(long)]
    pub no_prune: bool,
    /// Dataset size for the ETA projection (default: lines in --prompts).
    #[arg(long)]
    pub total: Option<u64>,
    /// Output tokens per prompt for the ETA (default: the mean the trials measured).
    #[arg(long)]
    pub expected_output_tokens: Option<f64>,
    /// Save the winner as a profile that extends --profile and records the measured numbers.
    #[arg(long)]
    pub write_profile: Option<PathBuf>,
    /// Leave the fleet running the winner on every GPU.
    #[arg(long)]
    pub apply: bool,
    /// Continue the sweep in --out, skipping finished trials.
    #[arg(long)]
    pub resume: bool,
    /// Where sweep.json is written.
    #[arg(long, default_value = "sweep.json")]
    pub out: PathBuf,
    /// List the candidates and their GPUs; start nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// How long to wait after SIGTERM before SIGKILL when stopping servers.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    /// grid: every point of the value lists; adaptive: search the ranges.
    ///
    /// Adaptive is the default when a --set is a range, KEY=LO..HI or LO..HI:log.
    #[arg(long, value_enum)]
    pub search: Option<SearchMethod>,
    /// The adaptive search explores this many candidates at most.
    ///
    /// Then it runs its close leaders once more, side by side, to confirm them.
    #[arg(long, default_value_t = 24)]
    pub trials: usize,
    /// The adaptive search proposes nothing more after this long (over every --resume).
    #[arg(long, value_parser = parse_duration)]
    pub budget: Option<Duration>,
    /// Latency limits the winner must keep, e.g. ttft_p99<=2s,itl_p99<=60ms.
    ///
    /// Metrics ttft_p50, ttft_p99, itl_p50, itl_p99: the sweep maximises throughput among the candidates that
    /// keep them; one that breaks them is shown, never crowned.
    #[arg(long)]
    pub slo: Option<String>,
}

/// How `fleet sweep` searches its space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SearchMethod {
    Grid,
    Adaptive,
}

#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// Input JSONL: {"id","prompt"}, {"id","messages"} or OpenAI Batch API lines.
    #[arg(long)]
    pub prompts: PathBuf,
    /// Output directory for shards, failed.jsonl and progress.json.
    #[arg(long)]
    pub out: PathBuf,
    /// Server base URLs to use instead of the instances fleet started (repeatable).
    ///
    /// `NAME=http://HOST:PORT` names the server in completions and progress.
    #[arg(long)]
    pub url: Vec<String>,
    /// Use fleet NAME's servers instead of this fleet's (NAME as `fleet status` shows it).
    ///
    /// Without --url and --fleet, a job uses only the servers this inventory's fleet started.
    #[arg(long, value_name = "NAME")]
    pub fleet: Option<String>,

    /// Send every request through the fleet's gateway (`router:`) instead of placing it.
    #[arg(long, conflicts_with_all = ["url", "detach"])]
    pub via_router: bool,
    /// Profile whose `expected:` numbers the watchdog compares against.
    #[arg(long)]
    pub profile: Option<String>,
    /// generate | chat | completions (default: chat for messages, generate for prompt).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// fleet (fleet's records) or openai-batch (the OpenAI Batch API's output lines).
    ///
    /// In openai-batch lines the body is the server's response whole. Default: openai-batch when every input line is a
    /// Batch API line, fleet otherwise; a resumed job keeps its own.
    #[arg(long, value_parser = ["fleet", "openai-batch"])]
    pub output_format: Option<String>,
    /// max_tokens of every request whose line does not set its own.
    ///
    /// Lowered to what fits a server's context when needed.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: u32,
    /// Sampling temperature sent with every request (default: the server's).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Nucleus sampling top_p sent with every request (default: the server's).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Read at most this many (non-blank) lines of --prompts.
    #[arg(long)]
    pub limit: Option<u64>,
    /// In-flight requests per instance: auto, or a fixed number.
    #[arg(long, default_value = "auto")]
    pub concurrency: String,
    /// Retries of a request that failed for a retryable reason (connection, 5xx, 429, timeout).
    ///
    /// Each goes to another server when there is one.
    #[arg(long, default_value_t = 3)]
    pub max_retries: u32,
    /// Give up when no server has been healthy for this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub stall_timeout: Duration,
    /// Continue in --out: skip every id already completed or failed there.
    #[arg(long)]
    pub resume: bool,
    /// With --resume: continue even though the input is not the one the job began with.
    ///
    /// Lines added, removed or moved: the job goes on keyed strictly by id.
    #[arg(long, requires = "resume")]
    pub allow_changed_input: bool,
    /// With --resume: send failed prompts again: `changed` (the default) or `all`.
    ///
    /// `changed`: those whose line was edited since it failed. Their old records leave
    /// failed.jsonl.
    #[arg(long, requires = "resume", num_args = 0..=1, default_missing_value = "changed",
          value_parser = ["changed", "all"])]
    pub retry_failed: Option<String>,
    /// Upload each finished shard to s3://BUCKET/PREFIX (AWS_* environment) or file:///DIR.
    #[arg(long)]
    pub upload: Option<String>,
    /// Completions per output shard: a shard is uploaded once it is full or the run ends.
    #[arg(long, default_value_t = 100_000)]
    pub shard_lines: u64,
    /// How long the watchdog waits before comparing throughput with what is expected.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Stop the run when it is below this fraction of the expected throughput after warm-up.
    #[arg(long)]
    pub abort_below: Option<f64>,
    /// How long Ctrl-C waits for in-flight requests.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Where each request goes: auto, prefix or least-loaded.
    ///
    /// `prefix` keeps prompts that share a long prefix on one server
    /// (its radix cache then prefills the prefix once), `least-loaded` sends each to the server
    /// with the most room, `auto` picks `prefix` when the input scan finds shared prefixes
    /// worth it.
    #[arg(long, default_value = "auto", value_parser = ["auto", "prefix", "least-loaded"])]
    pub placement: String,
    /// Scan the prompts and show their prefix groups and the expected cache hits, then exit.
    ///
    /// Nothing contacts a server or writes --out.
    #[arg(long)]
    pub dry_run: bool,
    /// Run the job on a GPU host beside its servers, detached: it outlives this terminal.
    ///
    /// It outlives this machine too. --prompts is a local file (sent there) or HOST:PATH; --out is a path there.
    #[arg(long)]
    pub detach: bool,
    /// With --detach: the inventory host to run on (default: the one whose instances it uses).
    #[arg(long, requires = "detach")]
    pub host: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct ProgressArgs {
    /// A detached job's id (see `fleet jobs`), or a local output directory.
    pub job: String,
}

#[derive(Debug, Clone, Args)]
pub struct StopArgs {
    /// The job's id (see `fleet jobs`).
    pub job: String,
    /// How long to wait for it to finish its requests in flight and exit.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub wait: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct FetchArgs {
    /// The job's id (see `fleet jobs`).
    pub job: String,
    /// Where its files go here (made if missing); a second fetch copies only what is new.
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Where to leave the demo's outputs (default: a new temporary directory).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

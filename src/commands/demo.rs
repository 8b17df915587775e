//! `fleet demo`: the whole mission on a simulated local fleet of 8 GPUs, run as the user would
//! run it — fleet's own commands, shown as typed, against sglang-sim (this very executable,
//! linked under that name) — with the outputs left in a directory for a closer look.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cli::DemoArgs;
use crate::demo::{self, RealTime, Saturation};
use crate::render::{Format, Model};
use crate::sglang::client::{Endpoint, HttpOptions, SglangClient, http_client};
use crate::sweep::file::SweepFile;

use super::output::outln;
use super::{Ctx, Interrupt, Outcome, UsageError};

/// How often the sims' throughput is sampled while the job runs.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// `fleet demo`'s result: each step's own result (with `--format json|html`, when the steps'
/// output is captured) and the sims' figures; the text is the conclusion, the steps having
/// printed their own as they ran.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct Demo {
    results: Value,
    #[serde(skip)]
    conclusion: String,
}

impl Model for Demo {
    fn title(&self) -> String {
        "fleet demo".into()
    }

    fn text(&self) -> String {
        format!("\n{}\n", self.conclusion)
    }
}

/// The demo's directory and what fleet's commands need to find in it.
struct Stage {
    dir: PathBuf,
    port_base: u16,
    /// Whether the steps' stdout is captured as JSON for the result (`--format json|html`)
    /// rather than shown as they run.
    json: bool,
    quiet: bool,
}

pub async fn run(ctx: &Ctx, args: &DemoArgs) -> anyhow::Result<Outcome> {
    let stage = prepare(ctx, args)?;
    let say = |s: &str| {
        if !stage.json {
            outln!("{s}");
        }
    };
    say(&format!(
        "fleet demo: {} simulated GPUs on this machine (sglang-sim at {}x real time); outputs in {}\n",
        demo::GPUS,
        demo::TIME_SCALE,
        stage.dir.display()
    ));
    let mut results = serde_json::Map::new();
    results.insert("out".into(), json!(stage.dir));

    let sweep_title = format!(
        "2/6  Measure before committing GPU-days: extra_buffer vs no_buffer side by side, 4 GPUs each\n\
         3/6  Rank them, with the ETA of the seed's 654,676-prompt job on all 8 GPUs; apply the winner\n     \
         (the sims run {0}x real time: tok/s below are {0}x a real GPU's, ETAs a {0}th of real ones)",
        demo::TIME_SCALE
    );
    let steps: [(&str, &str, Vec<String>); 5] = [
        (
            "up",
            "1/6  Start the seed's fleet as it was set up: 8 servers, mamba strategy extra_buffer",
            args_of(&["up", "--profile", "seed-extra-buffer"]),
        ),
        (
            "sweep",
            &sweep_title,
            args_of(&[
                "sweep",
                "--profile",
                "seed-extra-buffer",
                "--strategies",
                "extra_buffer,no_buffer",
                "--warmup",
                "2s",
                "--duration",
                "5s",
                "--total",
                &demo::SEED_PROMPTS.to_string(),
                "--expected-output-tokens",
                &demo::SEED_OUTPUT_TOKENS.to_string(),
                "--out",
                "sweep.json",
                "--write-profile",
                "profiles/winner.yaml",
                "--apply",
            ]),
        ),
        (
            "plan",
            "4/6  What the winner runs (one GPU shown): SGLang 0.5.23 starts no_buffer only with \
             overlap scheduling off, so fleet adds --disable-overlap-schedule",
            args_of(&["up", "--profile", "winner", "--gpus", "0", "--dry-run"]),
        ),
        (
            "generate",
            "5/6  Generate the bundled sample on the winner, with progress and the watchdog",
            args_of(&[
                "generate",
                "--prompts",
                "prompts.jsonl",
                "--out",
                "completions",
                "--profile",
                "winner",
                "--warmup",
                "3s",
            ]),
        ),
        (
            "down",
            "6/6  Stop the fleet",
            args_of(&["down", "--grace", "10s"]),
        ),
    ];

    let mut saturation = None;
    let mut real_time = Vec::new();
    for (name, title, argv) in steps {
        say(&format!("\n── {title}\n$ fleet {}", argv.join(" ")));
        let sampler = (name == "generate").then(|| {
            let stop = CancellationToken::new();
            let task = tokio::spawn(sample_throughput(
                stage.port_base,
                stage.dir.join("completions"),
                stop.clone(),
            ));
            (stop, task)
        });
        let step = run_fleet(ctx, &stage, &argv).await;
        if let Some((stop, task)) = sampler {
            stop.cancel();
            saturation = task.await.ok().flatten();
        }
        let (code, stdout) = match step {
            Ok(done) => done,
            Err(e) => {
                cleanup(ctx, &stage).await;
                return Err(e);
            }
        };
        if stage.json {
            results.insert(
                name.into(),
                serde_json::from_str(&stdout).unwrap_or(Value::String(stdout)),
            );
        }
        if name == "sweep" && code == Some(0) {
            match read_sweep(&stage.dir) {
                Ok(sweep) => real_time = demo::real_time(&sweep, f64::from(demo::TIME_SCALE)),
                Err(e) => {
                    cleanup(ctx, &stage).await;
                    return Err(e);
                }
            }
        }
        if ctx.cancel.is_cancelled() || code.is_some_and(Interrupt::is_exit_code) {
            cleanup(ctx, &stage).await;
            return Ok(Outcome::Interrupted);
        }
        if code != Some(0) {
            cleanup(ctx, &stage).await;
            anyhow::bail!(
                "`fleet {}` failed (exit {}); the servers were stopped; outputs are in {}",
                argv.join(" "),
                code.map_or("by signal".into(), |c| c.to_string()),
                stage.dir.display()
            );
        }
    }

    results.insert("saturation".into(), json!(saturation));
    results.insert("real_time".into(), json!(real_time));
    let demo = Demo {
        results: Value::Object(results),
        conclusion: conclusion(&stage.dir, &real_time, saturation.as_ref()),
    };
    super::emit(ctx, &demo)?;
    Ok(Outcome::Ok)
}

/// The sweep step's results, as the sweep wrote them.
fn read_sweep(dir: &Path) -> anyhow::Result<SweepFile> {
    let path = dir.join("sweep.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the sweep's results {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a sweep file", path.display()))
}

fn args_of(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Creates the demo directory: inventory, the seed's profile, the sample and a `sglang-sim`
/// link to this executable.
fn prepare(ctx: &Ctx, args: &DemoArgs) -> anyhow::Result<Stage> {
    let dir = match &args.out {
        Some(d) => {
            if d.exists() && std::fs::read_dir(d)?.next().is_some() {
                return Err(UsageError::new(format!(
                    "--out {}: the directory is not empty; give a new or empty one",
                    d.display()
                ))
                .into());
            }
            d.clone()
        }
        None => std::env::temp_dir().join(format!("fleet-demo-{}", std::process::id())),
    };
    let dir = absolute(&dir)?;
    for sub in ["profiles", "bin", "gpus", "run"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let exe = std::env::current_exe().context("finding the fleet executable")?;
    let sim = dir.join("bin/sglang-sim");
    std::os::unix::fs::symlink(&exe, &sim).with_context(|| format!("linking {}", sim.display()))?;
    let port_base = free_port_base(demo::GPUS as u16)?;
    let write = |name: &str, text: String| {
        std::fs::write(dir.join(name), text)
            .with_context(|| format!("writing {}", dir.join(name).display()))
    };
    write("fleet.yaml", demo::inventory_yaml())?;
    write(
        "profiles/seed-extra-buffer.yaml",
        demo::seed_profile_yaml(
            &sim.to_string_lossy(),
            &dir.join("gpus").to_string_lossy(),
            port_base,
        ),
    )?;
    write("prompts.jsonl", demo::sample_prompts(demo::SAMPLE_PROMPTS))?;
    Ok(Stage {
        dir,
        port_base,
        json: ctx.format() != Format::Text,
        quiet: ctx.global.quiet,
    })
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

/// The first of `n` consecutive free local ports from 31000 up, so the demo never collides
/// with servers already running here.
fn free_port_base(n: u16) -> anyhow::Result<u16> {
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    (31000..60000)
        .step_by(usize::from(n) + 2)
        .find(|&base| (base..base + n).all(free))
        .context("no free range of local ports for the simulated servers")
}

/// Runs `fleet <argv>` in the demo directory. Its output goes straight to the terminal, or is
/// captured with `--json`. Returns its exit code and captured stdout.
async fn run_fleet(
    ctx: &Ctx,
    stage: &Stage,
    argv: &[String],
) -> anyhow::Result<(Option<i32>, String)> {
    let exe = std::env::current_exe().context("finding the fleet executable")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["--config", "fleet.yaml", "--profiles-dir", "profiles"])
        .args(stage.json.then_some("--json"))
        .args(stage.quiet.then_some("-q"))
        .args(argv)
        .current_dir(&stage.dir)
        .env("FLEET_RUN_DIR", stage.dir.join("run"))
        .env_remove("FLEET_CONFIG")
        .env_remove("FLEET_PROFILES_DIR")
        .stdin(Stdio::null())
        // Its own process group: a terminal's Ctrl-C reaches only us, and the one signal we pass
        // on is the child's first, so it winds down instead of aborting.
        .process_group(0)
        .stdout(if stage.json {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .kill_on_drop(true);
    let child = cmd.spawn().context("starting fleet")?;
    let pid = child.id();
    let waiting = child.wait_with_output();
    tokio::pin!(waiting);
    let out = tokio::select! {
        out = &mut waiting => out?,
        _ = ctx.cancel.cancelled() => {
            // The child has a process group of its own: pass the signal on.
            let signal = ctx.interrupted_by().unwrap_or(Interrupt::Int).signal();
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                // SAFETY: kill(2) on our own child's pid with a valid signal number.
                unsafe { libc::kill(pid, signal) };
            }
            waiting.await?
        }
    };
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Stops whatever the demo left running, after a failure or an interrupt.
async fn cleanup(ctx: &Ctx, stage: &Stage) {
    let quiet = Stage {
        dir: stage.dir.clone(),
        json: true,
        quiet: true,
        ..*stage
    };
    let fresh = Ctx::new((*ctx.global).clone());
    if let Err(e) = run_fleet(&fresh, &quiet, &args_of(&["down", "--grace", "5s"])).await {
        tracing::error!(
            "could not stop the demo's servers: {why}; run `fleet --config {dir}/fleet.yaml down` with FLEET_RUN_DIR={dir}/run",
            why = super::describe(&e),
            dir = stage.dir.display(),
        );
    }
}

/// Samples the fleet's summed decode throughput from every sim's `/metrics` until stopped, with
/// how far the job is (from its progress.json), and reads the sims' ideal throughput.
async fn sample_throughput(
    port_base: u16,
    job_dir: PathBuf,
    stop: CancellationToken,
) -> Option<Saturation> {
    let http = http_client(HttpOptions::default()).ok()?;
    let clients: Vec<SglangClient> = (0..demo::GPUS as u16)
        .map(|g| {
            SglangClient::new(
                http.clone(),
                Endpoint::from_url(&format!("http://127.0.0.1:{}", port_base + g)),
            )
        })
        .collect();
    let mut samples = Vec::new();
    let mut ideal = None;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if ideal.is_none() {
            ideal = ideal_output_tok_s(&clients).await;
        }
        let Some(done) = job_fraction(&job_dir) else {
            continue;
        };
        let readings = futures::future::join_all(clients.iter().map(|c| c.metrics())).await;
        let tok_s: f64 = readings
            .iter()
            .filter_map(|m| m.as_ref().ok()?.gen_throughput)
            .sum();
        samples.push((done, tok_s));
    }
    demo::saturation(&samples, ideal?)
}

async fn ideal_output_tok_s(clients: &[SglangClient]) -> Option<f64> {
    let infos = futures::future::join_all(clients.iter().map(|c| c.server_info())).await;
    infos
        .iter()
        .map(|i| {
            i.as_ref()
                .ok()?
                .raw
                .pointer("/sim/ideal_output_tok_s")?
                .as_f64()
        })
        .sum::<Option<f64>>()
}

/// Completed fraction of the job, from its progress.json (absent before the first write).
fn job_fraction(job_dir: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(job_dir.join("progress.json")).ok()?;
    let p: Value = serde_json::from_str(&text).ok()?;
    let total = p["total"].as_f64().filter(|t| *t > 0.0)?;
    Some(p["completed"].as_f64()? / total)
}

fn conclusion(dir: &Path, real_time: &[RealTime], saturation: Option<&Saturation>) -> String {
    let mut out = String::from("── What the demo showed\n");
    if !real_time.is_empty() {
        out.push_str(&format!(
            "sglang-sim ran {}x faster than real time. Scaled back, the sweep measured per real GPU:\n",
            demo::TIME_SCALE
        ));
        for r in real_time {
            out.push_str(&format!(
                "  {:<14} {:>6.0} output tok/s, {:>3} requests in flight: {} prompts in {:.0} h on {} GPUs\n",
                r.label,
                r.output_tok_s_per_gpu,
                r.cap,
                demo::SEED_PROMPTS,
                r.seed_job_hours,
                demo::GPUS
            ));
        }
    }
    if let Some(s) = saturation {
        out.push_str(&format!(
            "The job kept the GPUs saturated: {:.0} output tok/s across the fleet while every batch was full, {:.1}% of the {:.0} tok/s the simulated GPUs can do at most.\n",
            s.steady_output_tok_s,
            s.ratio * 100.0,
            s.ideal_output_tok_s
        ));
    }
    out.push_str(&format!(
        "Everything is in {0}: fleet.yaml, profiles/ (the seed's and the measured winner), sweep.json,\n\
         prompts.jsonl and completions/ (shards, failed.jsonl, progress.json). To look again:\n  \
         fleet progress {0}/completions\n",
        dir.display()
    ));
    out
}

//! Learning about a host before planning (its launcher's `--help`, SGLang version, server
//! address, GPUs) and the pure preflight check of every planned argv against that `--help`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::config::{GpuSelection, MachineSpec};
use crate::gpu::{self, GpuError};
use crate::launch::help_cache;
use crate::launch::plan::{HostFacts, Instance, Topology};
use crate::remote::{RemoteError, Transport};
use crate::sglang::flags::{self, Mismatch};
use crate::sglang::help::{self, HelpSpec};

/// Reads the installed version from package metadata without importing sglang (which would
/// import torch and take seconds).
const VERSION_SCRIPT: &str = "import importlib.metadata as m; print(m.version('sglang'))";

#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(
        "{host}: `{command}` failed (exit {status}): {stderr}\n  hint: check the profile's launcher; --skip-preflight starts without checking flags"
    )]
    Help {
        host: String,
        command: String,
        status: String,
        stderr: String,
    },
    #[error(
        "{host}: `{command}` listed no options; --skip-preflight starts without checking flags"
    )]
    EmptyHelp { host: String, command: String },
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
    #[error(
        "{host}: job {job} holds {have} GPU(s), fewer than the {want} the inventory's `gpus:` \
         asks for\n  hint: lower `gpus:`, or leave it out to use every GPU of the job"
    )]
    FewerGpus {
        host: String,
        job: crate::slurm::JobId,
        have: u32,
        want: u32,
    },
    #[error(
        "{host}: job {job} holds no GPUs\n  hint: fleet runs one server per GPU: hold an \
         allocation with GPUs (e.g. `--gres=gpu:8`) and a task per GPU (`--ntasks-per-node=8`)"
    )]
    NoGpus {
        host: String,
        job: crate::slurm::JobId,
    },
    #[error("{0}")]
    State(#[from] crate::launch::state::StateError),
    #[error(
        "{0}\n  hint: `gpus: all` reads the GPUs from the host; or list them, e.g. gpus: [0,1,2,3]"
    )]
    Gpus(#[from] GpuError),
}

/// What to learn about each host: as the profile's servers would run (`launcher` and `env`),
/// their `--help` when `preflight`, and the board when `topology` (a server spans GPUs).
#[derive(Debug, Clone, Copy)]
pub struct Learn<'a> {
    pub launcher: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub preflight: bool,
    pub topology: bool,
    /// The servers' layout: an allocation fleet makes on a cluster is shaped by it (a server
    /// over several nodes needs its ranks on distinct nodes).
    pub parallel: crate::layout::Parallel,
}

impl<'a> Learn<'a> {
    /// What a profile's servers need: the board only where one server spans several GPUs.
    pub fn for_profile(profile: &'a crate::config::Profile, preflight: bool) -> Learn<'a> {
        Learn {
            launcher: &profile.launcher,
            env: &profile.env,
            preflight,
            topology: profile.server.parallel.gpus_per_node() > 1,
            parallel: profile.server.parallel,
        }
    }
}

/// Everything planning needs to know about one machine; `--help` is read only when `preflight`.
/// `--help` and the version are read with the profile's `env`, as the servers will run; with
/// `help_cache_dir`, a `--help` read before with the same launcher, env and version is taken
/// from there (see [`help_cache`]).
pub async fn host_facts(
    t: &Arc<dyn Transport>,
    host: &MachineSpec,
    learn: &Learn<'_>,
    help_cache_dir: Option<&str>,
) -> Result<HostFacts, FactsError> {
    let Learn {
        launcher,
        env,
        preflight,
        ..
    } = *learn;
    // The reads are independent: they run at once, so a host costs its slowest read (on the
    // real server `--help` imports sglang, seconds) rather than the sum of all of them.
    let gpus = async {
        match host.gpus {
            GpuSelection::All => Ok(gpu::read_host(t.clone(), host.is_local())
                .await?
                .iter()
                .map(|g| g.index)
                .collect()),
            GpuSelection::List(_) => Ok::<_, FactsError>(Vec::new()),
        }
    };
    let topology = async {
        match learn.topology {
            // A board that cannot be read is no reason to refuse: groups are then contiguous.
            true => match gpu::read_board(t.as_ref()).await {
                Ok(board) => Topology::Read(board),
                Err(e) => Topology::Unreadable(e.to_string()),
            },
            false => Topology::NotRead,
        }
    };
    let (address, launched, gpus_present, topology) = tokio::join!(
        t.server_address(),
        launcher_facts_cached(t.as_ref(), &[], launcher, env, preflight, help_cache_dir),
        gpus,
        topology
    );
    let (address, (help, version), gpus_present) = (address?, launched?, gpus_present?);
    Ok(HostFacts {
        help,
        version,
        address,
        gpus_present,
        places: Vec::new(),
        topology,
    })
}

/// The launcher's `--help` (when `preflight`) and the SGLang version, read as the servers
/// will run: with the profile's `env`, after the argv prefix `via` (a Slurm step's `srun`, so
/// that they are read on a node of the allocation; empty on a machine). Both at once.
pub(crate) async fn launcher_facts(
    t: &dyn Transport,
    via: &[String],
    launcher: &[String],
    env: &BTreeMap<String, String>,
    preflight: bool,
) -> Result<(Option<HelpSpec>, Option<String>), FactsError> {
    launcher_facts_cached(t, via, launcher, env, preflight, None).await
}

/// [`launcher_facts`], with `--help` kept in `cache_dir` on `t` between runs when given.
async fn launcher_facts_cached(
    t: &dyn Transport,
    via: &[String],
    launcher: &[String],
    env: &BTreeMap<String, String>,
    preflight: bool,
    cache_dir: Option<&str>,
) -> Result<(Option<HelpSpec>, Option<String>), FactsError> {
    let env_pairs: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let with_env = |argv: Vec<String>| -> Vec<String> {
        let mut full = via.to_vec();
        if !env.is_empty() {
            full.push("env".to_string());
            full.extend(env_pairs.iter().cloned());
        }
        full.extend(argv);
        full
    };
    // `None` when the launcher is no `python`: the version is then read from `--help`.
    let python_version = async {
        let python = python_of(launcher)?;
        let argv = vec![
            python.to_string(),
            "-c".to_string(),
            format!("{VERSION_SCRIPT}{}", help_cache::SERVER_ARGS_STAT),
        ];
        let began = std::time::Instant::now();
        let said = read_version(t, with_env(argv)).await;
        let secs = began.elapsed().as_secs_f64();
        tracing::debug!("phase preflight {}: version {secs:.2}s", t.host());
        let mut lines = said.as_deref().unwrap_or("").lines();
        let version = lines.next().map(str::trim).filter(|v| !v.is_empty());
        let server_args = lines.next().unwrap_or("").trim().to_string();
        Some((version.map(str::to_string), server_args))
    };
    let fresh = || {
        let with_env = &with_env;
        async move {
            let mut argv = launcher.to_vec();
            argv.push("--help".to_string());
            read_help(t, with_env(argv)).await
        }
    };
    let began = std::time::Instant::now();
    let (python_version, help_text, how) = match cache_dir.filter(|_| preflight) {
        // Nothing to look up first: `--help` and the version are read at once.
        None => {
            let help = async {
                match preflight {
                    true => fresh().await.map(Some),
                    false => Ok(None),
                }
            };
            let (version, help) = tokio::join!(python_version, help);
            (version, help?, "read")
        }
        Some(dir) => {
            let (version, mut looked) = tokio::join!(
                python_version,
                help_cache::look(t, &with_env, launcher, dir)
            );
            let key = looked.identity.map(|id| {
                let (v, server_args) = version.clone().unwrap_or_default();
                help_cache::key(
                    launcher,
                    &env_pairs,
                    &[&id, &v.unwrap_or_default(), &server_args],
                )
            });
            match key.as_ref().and_then(|k| looked.cached.remove(k)) {
                Some(text) if !HelpSpec::parse(&text).is_empty() => (version, Some(text), "cached"),
                _ => {
                    let text = fresh().await?;
                    if let Some(key) = &key {
                        help_cache::store(t, dir, key, &text).await;
                    }
                    (version, Some(text), "read")
                }
            }
        }
    };
    if preflight {
        let secs = began.elapsed().as_secs_f64();
        tracing::debug!("phase preflight {}: --help {secs:.2}s ({how})", t.host());
    }
    let version = match python_version {
        Some((version, _)) => version,
        None => help_text.as_deref().and_then(help::stated_version),
    };
    Ok((help_text.map(|t| HelpSpec::parse(&t)), version))
}

async fn read_help(t: &dyn Transport, argv: Vec<String>) -> Result<String, FactsError> {
    let out = t.run(&argv).await?;
    let command = argv.join(" ");
    if !out.success() {
        let stderr = out.stderr_lossy();
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(FactsError::Help {
            host: t.host().to_string(),
            command,
            status: out
                .status
                .map_or("by signal".to_string(), |s| s.to_string()),
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    let text = out.stdout_lossy();
    if HelpSpec::parse(&text).is_empty() {
        return Err(FactsError::EmptyHelp {
            host: t.host().to_string(),
            command,
        });
    }
    Ok(text)
}

/// The interpreter of a `python ... -m module` launcher.
fn python_of(launcher: &[String]) -> Option<&str> {
    let first = launcher.first()?;
    let name = first.rsplit('/').next().unwrap_or(first);
    name.starts_with("python").then_some(first.as_str())
}

/// The version is only shown, so failing to read it is a warning, not an error.
async fn read_version(t: &dyn Transport, argv: Vec<String>) -> Option<String> {
    match t.run(&argv).await {
        Ok(out) if out.success() => Some(out.stdout_lossy().trim().to_string()),
        Ok(out) => {
            tracing::warn!(
                "{}: cannot read the SGLang version: {}",
                t.host(),
                out.stderr_lossy().trim()
            );
            None
        }
        Err(e) => {
            tracing::warn!("cannot read the SGLang version: {e}");
            None
        }
    }
}

/// Every flag the hosts would reject, grouped by host; identical problems of a host's GPUs
/// (they differ only in the port) are reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightFailure {
    pub hosts: Vec<HostMismatches>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMismatches {
    pub host: String,
    pub version: Option<String>,
    pub launcher: String,
    pub problems: Vec<Mismatch>,
}

impl std::error::Error for PreflightFailure {}

impl fmt::Display for PreflightFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count: usize = self.hosts.iter().map(|h| h.problems.len()).sum();
        write!(f, "preflight: {count} flag problem(s); nothing was started")?;
        for h in &self.hosts {
            let version = h.version.as_deref().unwrap_or("version unknown");
            write!(
                f,
                "\n  {} (SGLang {version}, `{} --help`):",
                h.host, h.launcher
            )?;
            for p in &h.problems {
                write!(f, "\n    {p}")?;
            }
        }
        Ok(())
    }
}

/// Checks each planned argv against its host's `--help`. Hosts without help (preflight
/// skipped) are not checked.
pub fn preflight(
    instances: &[Instance],
    facts: &BTreeMap<String, HostFacts>,
) -> Result<(), PreflightFailure> {
    let mut hosts: Vec<HostMismatches> = Vec::new();
    for instance in instances {
        let Some(f) = facts.get(instance.host()) else {
            continue;
        };
        let Some(help) = &f.help else { continue };
        let problems = flags::check(instance.server_args(), help);
        if problems.is_empty() {
            continue;
        }
        let entry = match hosts.iter_mut().position(|h| h.host == instance.host()) {
            Some(i) => &mut hosts[i],
            None => {
                hosts.push(HostMismatches {
                    host: instance.host().to_string(),
                    version: f.version.clone(),
                    launcher: instance.argv[..instance.launcher_len].join(" "),
                    problems: Vec::new(),
                });
                hosts.last_mut().expect("just pushed")
            }
        };
        for p in problems {
            if !entry.problems.contains(&p) {
                entry.problems.push(p);
            }
        }
    }
    if hosts.is_empty() {
        Ok(())
    } else {
        Err(PreflightFailure { hosts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MambaStrategy;
    use crate::launch::plan::{self, DEFAULT_RUN_ROOT};
    use crate::sglang::flags::tests::profile;

    const HELP_0_5_10: &str = include_str!("../../tests/fixtures/sglang/help-0.5.10.txt");
    const HELP_0_5_23: &str = include_str!("../../tests/fixtures/sglang/help-0.5.23.txt");

    fn host(name: &str) -> crate::config::HostSpec {
        plan::tests::host(name, GpuSelection::List(vec![0, 1]))
    }

    fn facts(help: &str, version: &str) -> HostFacts {
        HostFacts {
            help: Some(HelpSpec::parse(help)),
            version: Some(version.into()),
            address: "127.0.0.1".into(),
            gpus_present: vec![],
            places: Vec::new(),
            topology: Topology::NotRead,
        }
    }

    #[test]
    fn one_report_per_host_with_version_and_every_problem() {
        let mut p = profile();
        p.server.mamba_strategy = Some(MambaStrategy::ExtraBufferLazy);
        p.server.extra_args = vec!["--trust-remote-cod".into()];
        let hosts = vec![
            (host("old"), facts(HELP_0_5_10, "0.5.10")),
            (host("new"), facts(HELP_0_5_23, "0.5.23")),
        ];
        let instances = plan::plan(&p, &hosts, None, None, DEFAULT_RUN_ROOT).unwrap();
        let facts: BTreeMap<_, _> = hosts
            .into_iter()
            .map(|(h, f)| (h.name().to_string(), f))
            .collect();
        let err = preflight(&instances, &facts).unwrap_err();
        assert_eq!(
            err.to_string(),
            "preflight: 3 flag problem(s); nothing was started\n  \
             old (SGLang 0.5.10, `/venv/bin/python -m sglang.launch_server --help`):\n    \
             --mamba-scheduler-strategy: invalid choice 'extra_buffer_lazy' (choose from auto, no_buffer, extra_buffer)\n    \
             unrecognized argument --trust-remote-cod (did you mean --trust-remote-code?)\n  \
             new (SGLang 0.5.23, `/venv/bin/python -m sglang.launch_server --help`):\n    \
             unrecognized argument --trust-remote-cod (did you mean --trust-remote-code?)"
        );
    }

    #[test]
    fn a_valid_plan_and_a_skipped_preflight_pass() {
        let hosts = vec![(host("new"), facts(HELP_0_5_23, "0.5.23"))];
        let instances = plan::plan(&profile(), &hosts, None, None, DEFAULT_RUN_ROOT).unwrap();
        let mut facts: BTreeMap<_, _> = hosts
            .into_iter()
            .map(|(h, f)| (h.name().to_string(), f))
            .collect();
        assert_eq!(preflight(&instances, &facts), Ok(()));
        facts.get_mut("new").unwrap().help = None;
        assert_eq!(preflight(&instances, &facts), Ok(()));
    }

    #[test]
    fn python_launchers_are_recognised() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            python_of(&l(&["/venv/bin/python3.11", "-m", "sglang.launch_server"])),
            Some("/venv/bin/python3.11")
        );
        assert_eq!(python_of(&l(&["sglang-sim"])), None);
    }
}

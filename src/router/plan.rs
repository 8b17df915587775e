//! The gateway's plan, pure: which host runs it, its argv and environment, its files in the run
//! directory, its workers' URLs; and the check of its flags against the gateway's own `--help`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::RouterError;
use crate::config::{HostSpec, Profile, RouterSettings};
use crate::launch::plan::HostFacts;
use crate::sglang::help::HelpSpec;

/// The gateway's directory under the run root. Its record is `router.json`, not
/// `instance.json`, so no survey of servers ever reads it as one.
pub const DIR: &str = "router";
/// Where the gateway keeps its key shim: a `sitecustomize.py` that Python imports at start-up.
pub const SHIM_DIR: &str = "py";
/// The variable naming the key file, read (and removed from the environment) by the shim.
pub const KEY_FILE_VAR: &str = "FLEET_ROUTER_KEY_FILE";

/// The shim that hands the gateway its API key: `smg` takes the key only as `--api-key`, and a
/// key in argv is readable by every user (`ps`, `/proc/PID/cmdline`). Python imports
/// `sitecustomize` before the gateway parses its arguments, so the key joins `sys.argv` in the
/// process's memory only; the file it comes from is the owner's alone (0600 in a 0700 directory).
pub const SHIM: &str = r#"# Written by fleet: gives the gateway its API key without putting it in argv.
import os
import sys

_path = os.environ.pop("FLEET_ROUTER_KEY_FILE", None)
if _path:
    with open(_path) as _f:
        sys.argv += ["--api-key", _f.read().strip()]
"#;

/// The gateway's files on its host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterFiles {
    pub dir: String,
    pub log: String,
    pub pidfile: String,
    pub record: String,
    pub key: String,
    pub shim: String,
}

impl RouterFiles {
    pub fn new(run_root: &str) -> RouterFiles {
        let dir = format!("{}/{DIR}", run_root.trim_end_matches('/'));
        RouterFiles {
            log: format!("{dir}/router.log"),
            pidfile: format!("{dir}/pid"),
            record: format!("{dir}/router.json"),
            key: format!("{dir}/key"),
            shim: format!("{dir}/{SHIM_DIR}"),
            dir,
        }
    }
}

/// A worker the gateway should have: a running server, by URL as the gateway reaches it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Worker {
    /// The inventory host the server runs on.
    pub host: String,
    pub url: String,
}

/// The gateway as `fleet up` would start it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterPlan {
    pub host: String,
    /// Where it binds, and where it is reached from its host's SSH side.
    pub address: String,
    pub port: u16,
    pub policy: String,
    /// The full argv, workers included, never the key.
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub files: RouterFiles,
    /// Set when the profile names an API key: the variable holding it.
    pub api_key_env: Option<String>,
    /// What makes two gateways the same, workers aside (they are kept in step at run time).
    pub fingerprint: String,
}

impl RouterPlan {
    /// `http://ADDRESS:PORT`, as the gateway's host sees it.
    pub fn url(&self) -> String {
        worker_url(&self.address, self.port)
    }
}

/// A server's URL as a worker of the gateway.
pub fn worker_url(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("http://[{address}]:{port}")
    } else {
        format!("http://{address}:{port}")
    }
}

/// The host that runs the gateway: `router.host`, else the inventory's first.
pub fn pick_host<'a>(
    settings: &RouterSettings,
    inventory: &'a [HostSpec],
) -> Result<&'a HostSpec, RouterError> {
    let have = || {
        inventory
            .iter()
            .map(HostSpec::name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let host =
        match &settings.host {
            Some(name) => inventory.iter().find(|h| h.name() == name).ok_or_else(|| {
                RouterError::UnknownHost {
                    host: name.clone(),
                    have: have(),
                }
            })?,
            None => inventory.first().ok_or_else(|| RouterError::UnknownHost {
                host: String::new(),
                have: have(),
            })?,
        };
    match host {
        HostSpec::Machine(_) => Ok(host),
        HostSpec::Slurm(_) => Err(RouterError::Slurm {
            host: host.name().to_string(),
        }),
    }
}

/// The gateway's plan on `host` (with what was learned of it), with `workers` to start with.
pub fn plan(
    profile: &Profile,
    settings: &RouterSettings,
    host: &str,
    facts: &HostFacts,
    workers: &[Worker],
    run_root: &str,
) -> RouterPlan {
    let address = profile
        .server
        .host
        .clone()
        .unwrap_or_else(|| facts.address.clone());
    let files = RouterFiles::new(run_root);
    let mut head = settings.launcher.clone();
    head.extend(
        [
            "--host",
            &address,
            "--port",
            &settings.port.to_string(),
            "--policy",
            &settings.policy,
            // Its Prometheus endpoint otherwise binds 0.0.0.0:29000: every interface, and one
            // port for every gateway on the machine.
            "--prometheus-host",
            &address,
            "--prometheus-port",
            &metrics_port(settings.port).to_string(),
        ]
        .map(String::from),
    );
    if settings.dp_aware {
        head.push("--dp-aware".into());
    }
    head.extend(settings.extra_args.iter().cloned());
    let mut env = profile.env.clone();
    if profile.api_key_env.is_some() {
        let path = match env.get("PYTHONPATH") {
            Some(p) if !p.is_empty() => format!("{}:{p}", files.shim),
            _ => files.shim.clone(),
        };
        env.insert("PYTHONPATH".into(), path);
        env.insert(KEY_FILE_VAR.into(), files.key.clone());
    }
    // The same identity as a server's: equal fingerprints mean the same gateway.
    let fingerprint = crate::launch::plan::fingerprint(&head, &env);
    let mut argv = head;
    // Last, since `--worker-urls` takes every word up to the next flag.
    if !workers.is_empty() {
        argv.push("--worker-urls".into());
        argv.extend(workers.iter().map(|w| w.url.clone()));
    }
    RouterPlan {
        host: host.to_string(),
        address,
        port: settings.port,
        policy: settings.policy.clone(),
        argv,
        env,
        files,
        api_key_env: profile.api_key_env.clone(),
        fingerprint,
    }
}

/// The gateway's Prometheus port: the one after its own (wrapping below it at the top).
pub fn metrics_port(port: u16) -> u16 {
    port.checked_add(1).unwrap_or(port - 1)
}

/// What the gateway's `--help` refuses of the plan: a flag it does not list, or a policy it
/// does not offer. Empty when all is well.
pub fn check_flags(settings: &RouterSettings, help: &HelpSpec, with_key: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let mut used: Vec<&str> = vec![
        "--host",
        "--port",
        "--policy",
        "--worker-urls",
        "--prometheus-host",
        "--prometheus-port",
    ];
    if settings.dp_aware {
        used.push("--dp-aware");
    }
    if with_key {
        used.push("--api-key");
    }
    for flag in used {
        if !help.has(flag) {
            problems.push(format!("its --help lists no {flag}"));
        }
    }
    if let Some(choices) = help.get("--policy").and_then(|o| o.choices.as_ref())
        && !choices.contains(&settings.policy)
    {
        problems.push(format!(
            "router.policy `{}` is not one of its policies ({})",
            settings.policy,
            choices.join(", ")
        ));
    }
    for arg in &settings.extra_args {
        let flag = arg.split('=').next().unwrap_or_default();
        if flag.starts_with("--") && !help.has(flag) {
            let hint = help
                .nearest(flag)
                .map(|n| format!(" (did you mean {n}?)"))
                .unwrap_or_default();
            problems.push(format!(
                "router.extra_args: {flag} is not among its options{hint}"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::plan::Topology;

    const HELP: &str = "  --host HOST           Host address\n  --port PORT           Port\n  \
        --worker-urls [WORKER_URLS ...]\n                        urls\n  --policy {random,round_robin,cache_aware}\n  \
        --dp-aware            dp\n  --api-key API_KEY     key\n  --log-level {debug,info}\n  \
        --prometheus-port PROMETHEUS_PORT\n  --prometheus-host PROMETHEUS_HOST\n";

    fn settings() -> RouterSettings {
        RouterSettings {
            launcher: vec!["smg".into(), "launch".into()],
            port: 30080,
            policy: "cache_aware".into(),
            host: None,
            dp_aware: false,
            extra_args: vec!["--log-level".into(), "info".into()],
        }
    }

    fn facts() -> HostFacts {
        HostFacts {
            help: None,
            version: None,
            address: "10.0.0.5".into(),
            gpus_present: vec![],
            places: vec![],
            topology: Topology::NotRead,
        }
    }

    fn workers() -> Vec<Worker> {
        (0..2)
            .map(|i| Worker {
                host: "ct200".into(),
                url: worker_url("10.0.0.5", 30000 + i),
            })
            .collect()
    }

    #[test]
    fn the_argv_binds_the_host_address_and_lists_the_workers_last() {
        let p = crate::sglang::flags::tests::profile();
        let plan = plan(&p, &settings(), "ct200", &facts(), &workers(), "/run/fleet");
        assert_eq!(
            plan.argv.join(" "),
            "smg launch --host 10.0.0.5 --port 30080 --policy cache_aware --prometheus-host \
             10.0.0.5 --prometheus-port 30081 --log-level info \
             --worker-urls http://10.0.0.5:30000 http://10.0.0.5:30001"
        );
        assert_eq!(plan.url(), "http://10.0.0.5:30080");
        assert_eq!(plan.files.log, "/run/fleet/router/router.log");
        assert!(!plan.env.contains_key(KEY_FILE_VAR));
    }

    #[test]
    fn a_key_goes_through_the_shim_never_the_argv_and_workers_leave_the_fingerprint_alone() {
        let mut p = crate::sglang::flags::tests::profile();
        p.api_key_env = Some("FLEET_API_KEY".into());
        p.env.insert("PYTHONPATH".into(), "/opt/lib".into());
        let with = plan(&p, &settings(), "ct200", &facts(), &workers(), "/r");
        assert!(
            !with.argv.iter().any(|a| a == "--api-key"),
            "{:?}",
            with.argv
        );
        assert_eq!(with.env["PYTHONPATH"], "/r/router/py:/opt/lib");
        assert_eq!(with.env[KEY_FILE_VAR], "/r/router/key");
        let fewer = plan(&p, &settings(), "ct200", &facts(), &workers()[..1], "/r");
        assert_eq!(with.fingerprint, fewer.fingerprint);
        let mut other = settings();
        other.policy = "round_robin".into();
        let changed = plan(&p, &other, "ct200", &facts(), &workers(), "/r");
        assert_ne!(with.fingerprint, changed.fingerprint);
    }

    #[test]
    fn the_gateways_help_refuses_unknown_flags_and_policies() {
        let help = HelpSpec::parse(HELP);
        assert!(check_flags(&settings(), &help, true).is_empty());
        let mut bad = settings();
        bad.policy = "cache_awar".into();
        bad.extra_args = vec!["--log-levle".into(), "info".into()];
        let problems = check_flags(&bad, &help, false).join("; ");
        assert!(
            problems.contains("`cache_awar` is not one of its policies"),
            "{problems}"
        );
        assert!(
            problems.contains("--log-levle is not among its options (did you mean --log-level?)"),
            "{problems}"
        );
        let old = HelpSpec::parse("  --host HOST  h\n  --port PORT  p\n  --policy {random}\n");
        let problems = check_flags(&settings(), &old, true).join("; ");
        assert!(
            problems.contains("no --worker-urls") && problems.contains("no --api-key"),
            "{problems}"
        );
    }

    #[test]
    fn the_first_host_runs_it_unless_named() {
        let inv: Vec<HostSpec> = crate::config::inventory_from_str(
            "hosts:\n  - name: a\n    gpus: [0]\n  - name: b\n    gpus: [1]\n",
            std::path::Path::new("fleet.yaml"),
        )
        .unwrap()
        .hosts;
        assert_eq!(pick_host(&settings(), &inv).unwrap().name(), "a");
        let mut s = settings();
        s.host = Some("b".into());
        assert_eq!(pick_host(&s, &inv).unwrap().name(), "b");
        s.host = Some("c".into());
        assert!(
            pick_host(&s, &inv)
                .unwrap_err()
                .to_string()
                .contains("hosts: a, b")
        );
    }
}

//! The pure launch plan: a profile, the inventory's hosts and what was learned about each host
//! become one instance per GPU group of the profile's layout (port, argv, env, files on the
//! target, config fingerprint).
//!
//! Files on the target live in a run directory per port: `<run root>/<port>/` holds
//! `server.log`, `pid`, `instance.json` (the record `status`, `down` and `logs` read) and, when
//! the profile names an API key, `secrets.yaml` (mode 0600), the `--config` file SGLang reads
//! the key from: the key is in no argv.
//! The run root is `/tmp/fleet` unless `FLEET_RUN_DIR` says otherwise.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::config::{ConfigError, GpuSelection, HostSpec, Profile};
use crate::layout::{self, Board, Group, PlaceError};
use crate::server::ServerId;
use crate::sglang::flags::{self, NodeRank, Render};
use crate::sglang::help::HelpSpec;

pub const DEFAULT_RUN_ROOT: &str = "/tmp/fleet";

/// What fleet learned about one host before planning.
#[derive(Debug, Clone, PartialEq)]
pub struct HostFacts {
    /// The launcher's `--help`; `None` when preflight is skipped.
    pub help: Option<HelpSpec>,
    /// The installed SGLang version, when it could be read.
    pub version: Option<String>,
    /// Where this host's servers are reached from the SSH side (127.0.0.1 on a bare host, the
    /// container's address for a pct host). Servers bind it unless the profile sets a host.
    pub address: String,
    /// The host's GPU indices, for `gpus: all` (ignored for an explicit list). On a Slurm
    /// host, the servers' places in the allocation: 0 to one less than its server count.
    pub gpus_present: Vec<u32>,
    /// On a Slurm host, where the server in each place is reached (its node's NodeAddr), by
    /// place; empty on a machine, whose servers all are at `address`.
    pub places: Vec<String>,
    /// The board, read only when a server spans several GPUs.
    pub topology: Topology,
}

/// What was learned of a host's board.
#[derive(Debug, Clone, PartialEq)]
pub enum Topology {
    /// Not needed: every server is one GPU (or the backend places GPUs itself).
    NotRead,
    Read(Board),
    /// `nvidia-smi topo -m` could not be read: groups are contiguous. The reason, as shown.
    Unreadable(String),
}

impl Topology {
    pub fn board(&self) -> Option<&Board> {
        match self {
            Topology::Read(b) => Some(b),
            _ => None,
        }
    }
}

impl HostFacts {
    /// Where the server at GPU (or place) `gpu` is reached.
    pub fn address_of(&self, gpu: u32) -> &str {
        self.places
            .get(gpu as usize)
            .map_or(self.address.as_str(), String::as_str)
    }
}

/// One server to run: the planned stage of a server.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Its host and GPU: the first of its group.
    pub id: ServerId,
    /// Its GPUs (one, unless the profile's layout spans several).
    pub group: Group,
    pub port: u16,
    /// Launcher followed by the server arguments: exactly what runs. Never the API key (that
    /// is in `secrets`), but a profile's own arguments may hold a secret: show it only through
    /// [`Instance::display_argv`].
    pub argv: Vec<String>,
    /// The launcher's length within `argv`; preflight checks what follows.
    pub launcher_len: usize,
    pub env: BTreeMap<String, String>,
    /// Where the server is reached from the SSH side, for health checks.
    pub address: String,
    pub files: RunFiles,
    /// Identifies the config (masked argv and env): equal fingerprints mean "same server".
    pub fingerprint: String,
    pub profile: String,
    /// The environment variable holding the API key (never the key), for later health checks.
    pub api_key_env: Option<String>,
    /// What `files.secrets` must hold before the server starts.
    pub secrets: Option<Secret>,
    /// The server's other nodes, rank 1 on, when it spans several (`server.nnodes`): each runs
    /// the same command with its own rank, and only this one (rank 0) serves the API.
    pub ranks: Vec<Rank>,
}

/// A rank ≥ 1 of a server over several nodes: SGLang runs a dummy `/health` there, on the
/// server's port of the node's own address.
#[derive(Debug, Clone, PartialEq)]
pub struct Rank {
    /// Its GPUs (places) on its node.
    pub group: Group,
    /// Its node's address.
    pub address: String,
    pub argv: Vec<String>,
    /// Its own log, pidfile and step file, in `rank<N>/` of the server's run directory.
    pub files: RunFiles,
}

/// Text holding a secret; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Instance {
    /// The argv with secrets masked, for tables, JSON, logs and the record on the target.
    pub fn display_argv(&self) -> Vec<String> {
        flags::masked(&self.argv)
    }

    pub fn server_args(&self) -> &[String] {
        &self.argv[self.launcher_len..]
    }

    /// `ct200 gpu5 :30005`, or `ct200 gpu0+2 :30000` for a group: the name used in progress
    /// and messages.
    pub fn label(&self) -> String {
        group_label(&self.id, &self.group.gpus, self.port)
    }

    /// The inventory host it is planned on.
    pub fn host(&self) -> &str {
        self.id.host().unwrap_or_default()
    }
}

/// An instance's files on the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFiles {
    pub dir: String,
    pub log: String,
    pub pidfile: String,
    pub record: String,
    /// The `--config` file with the server's secrets (used only with an API key).
    pub secrets: String,
}

/// The secrets file's name in an instance's run directory.
pub const SECRETS_FILE: &str = "secrets.yaml";

impl RunFiles {
    pub fn new(run_root: &str, port: u16) -> RunFiles {
        RunFiles::in_dir(format!("{}/{port}", run_root.trim_end_matches('/')))
    }

    /// Rank `rank`'s files of a server over several nodes: in `rank<N>/` of its directory.
    pub fn of_rank(&self, rank: usize) -> RunFiles {
        RunFiles::in_dir(format!("{}/rank{rank}", self.dir))
    }

    fn in_dir(dir: String) -> RunFiles {
        RunFiles {
            log: format!("{dir}/server.log"),
            pidfile: format!("{dir}/pid"),
            record: format!("{dir}/instance.json"),
            secrets: format!("{dir}/{SECRETS_FILE}"),
            dir,
        }
    }
}

/// Errors that make a plan impossible; each names the host or GPU at fault.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Port(#[from] ConfigError),
    #[error("--gpus {gpus}: not in the inventory of any host (hosts have: {have})")]
    UnknownGpus { gpus: String, have: String },
    #[error("profile env sets CUDA_VISIBLE_DEVICES; fleet pins each server to its GPU itself")]
    EnvPinsGpu,
    #[error(
        "profile {profile}: server.nnodes {nnodes}: fleet starts servers over several nodes \
         on Slurm hosts only, for now\n  hint: on SSH hosts, a server over one host's GPUs \
         (tp_size up to its GPU count) runs today"
    )]
    MultiNode { profile: String, nnodes: u32 },
    /// Every host whose selection cannot hold whole servers of the layout.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Layout(Vec<PlaceError>),
    #[error(
        "profile {profile}: server.extra_args passes --config, but fleet gives the server its \
         API key (api_key_env) in a --config file of its own and SGLang takes only one; \
         move the file's settings into the profile's server settings or extra_args"
    )]
    ConfigTwice { profile: String },
}

/// Turns the profile and the hosts (with their facts) into instances, in host then GPU order.
/// `only_gpus` is `--gpus`; `api_key` is the key's value when the profile asks for one.
pub fn plan(
    profile: &Profile,
    hosts: &[(HostSpec, HostFacts)],
    only_gpus: Option<&[u32]>,
    api_key: Option<&str>,
    run_root: &str,
) -> Result<Vec<Instance>, PlanError> {
    if profile.env.contains_key("CUDA_VISIBLE_DEVICES") {
        return Err(PlanError::EnvPinsGpu);
    }
    let parallel = &profile.server.parallel;
    if parallel.nnodes > 1 && hosts.iter().any(|(h, _)| matches!(h, HostSpec::Machine(_))) {
        return Err(PlanError::MultiNode {
            profile: profile.name.clone(),
            nnodes: parallel.nnodes,
        });
    }
    if api_key.is_some() && flags::has_config(&profile.server.extra_args) {
        return Err(PlanError::ConfigTwice {
            profile: profile.name.clone(),
        });
    }
    if let Some(only) = only_gpus {
        let known: Vec<u32> = hosts.iter().flat_map(|(h, f)| host_gpus(h, f)).collect();
        let missing: Vec<String> = only
            .iter()
            .filter(|g| !known.contains(g))
            .map(u32::to_string)
            .collect();
        if !missing.is_empty() {
            let have = hosts
                .iter()
                .map(|(h, f)| format!("{}: {}", h.name(), join(&host_gpus(h, f))))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(PlanError::UnknownGpus {
                gpus: missing.join(","),
                have,
            });
        }
    }
    let mut instances: Vec<Instance> = Vec::new();
    let mut refused = Vec::new();
    for (host, facts) in hosts {
        let selected: Vec<u32> = host_gpus(host, facts)
            .into_iter()
            .filter(|g| only_gpus.is_none_or(|only| only.contains(g)))
            .collect();
        if selected.is_empty() {
            continue;
        }
        if parallel.nnodes > 1 {
            let places: Vec<(u32, String)> = selected
                .iter()
                .map(|p| (*p, facts.address_of(*p).to_string()))
                .collect();
            match layout::nodes::spread(host.name(), parallel, &places) {
                Ok(servers) => {
                    for ranks in servers {
                        instances.push(over_nodes(profile, host, facts, ranks, api_key, run_root)?);
                    }
                }
                Err(e) => refused.push(e),
            }
            continue;
        }
        let groups = match layout::place(host.name(), parallel, &selected, facts.topology.board()) {
            Ok(groups) => groups,
            Err(e) => {
                refused.push(e);
                continue;
            }
        };
        for group in groups {
            let port = profile.port_for_gpu(host.name(), group.lead())?;
            instances.push(instance(
                profile, host, facts, group, port, api_key, run_root, None,
            ));
        }
    }
    if !refused.is_empty() {
        return Err(PlanError::Layout(refused));
    }
    Ok(instances)
}

/// The hosts whose board could not be read though their servers span GPUs, with why: their
/// groups are contiguous, which a user should hear once per host.
pub fn contiguous_fallbacks<'a>(
    hosts: &'a [(HostSpec, HostFacts)],
    instances: &[Instance],
) -> Vec<(&'a str, &'a str)> {
    hosts
        .iter()
        .filter_map(|(h, f)| match &f.topology {
            Topology::Unreadable(why)
                if instances
                    .iter()
                    .any(|i| i.host() == h.name() && i.group.is_multi()) =>
            {
                Some((h.name(), why.as_str()))
            }
            _ => None,
        })
        .collect()
}

/// How a server is named in messages: its id with the port, and every GPU of a group.
pub fn group_label(id: &ServerId, gpus: &[u32], port: u16) -> String {
    match (id.host(), gpus) {
        (Some(host), [_, _, ..]) => {
            let gpus = gpus.iter().map(u32::to_string).collect::<Vec<_>>();
            format!("{host} gpu{} :{port}", gpus.join("+"))
        }
        _ => id.label(port),
    }
}

/// One server over several nodes of a Slurm host: rank 0 serves on its port, and rank 0's node
/// hosts the ranks' rendezvous on the port of rank 1's first place, which no server of that
/// node listens on (every place of rank 1 is on another node).
fn over_nodes(
    profile: &Profile,
    host: &HostSpec,
    facts: &HostFacts,
    ranks: Vec<layout::nodes::RankPlace>,
    api_key: Option<&str>,
    run_root: &str,
) -> Result<Instance, PlanError> {
    let mut ranks = ranks.into_iter();
    let first = ranks.next().expect("a server has rank 0");
    let rest: Vec<_> = ranks.collect();
    let port = profile.port_for_gpu(host.name(), first.group.lead())?;
    let rendezvous = rest.first().map_or(first.group.lead(), |r| r.group.lead());
    let dist = format!(
        "{}:{}",
        first.node,
        profile.port_for_gpu(host.name(), rendezvous)?
    );
    let rank0 = NodeRank {
        rank: 0,
        dist_init_addr: &dist,
    };
    let group = first.group;
    let mut server = instance(
        profile,
        host,
        facts,
        group,
        port,
        api_key,
        run_root,
        Some(rank0),
    );
    server.ranks = rest
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let files = server.files.of_rank(i + 1);
            let render = Render {
                help: facts.help.as_ref(),
                bind_host: &r.node,
                port,
                secrets_file: api_key.map(|_| server.files.secrets.as_str()),
                node: Some(NodeRank {
                    rank: i as u32 + 1,
                    dist_init_addr: &dist,
                }),
            };
            let mut argv = profile.launcher.clone();
            argv.extend(flags::server_args(profile, &render));
            Rank {
                group: r.group,
                address: r.node,
                argv,
                files,
            }
        })
        .collect();
    Ok(server)
}

#[allow(clippy::too_many_arguments)]
fn instance(
    profile: &Profile,
    host: &HostSpec,
    facts: &HostFacts,
    group: Group,
    port: u16,
    api_key: Option<&str>,
    run_root: &str,
    node: Option<NodeRank<'_>>,
) -> Instance {
    let gpu = group.lead();
    let address = facts.address_of(gpu);
    let bind_host = profile.server.host.as_deref().unwrap_or(address);
    let files = RunFiles::new(run_root, port);
    let render = Render {
        help: facts.help.as_ref(),
        bind_host,
        port,
        secrets_file: api_key.map(|_| files.secrets.as_str()),
        node,
    };
    let mut argv = profile.launcher.clone();
    argv.extend(flags::server_args(profile, &render));
    let mut env = profile.env.clone();
    // Slurm sets CUDA_VISIBLE_DEVICES in each step to the GPU it gave; fleet pins only on a
    // machine.
    if let HostSpec::Machine(_) = host {
        env.insert("CUDA_VISIBLE_DEVICES".to_string(), group.visible_devices());
        // CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi, the inventory and
        // `fleet gpus` number them by PCI bus, so pin by that order.
        env.entry("CUDA_DEVICE_ORDER".to_string())
            .or_insert_with(|| "PCI_BUS_ID".to_string());
    }
    let fingerprint = fingerprint(&flags::masked(&argv), &env);
    Instance {
        id: ServerId::gpu(host.name(), gpu),
        group,
        port,
        argv,
        launcher_len: profile.launcher.len(),
        env,
        address: address.to_string(),
        files,
        fingerprint,
        profile: profile.name.clone(),
        api_key_env: profile.api_key_env.clone(),
        secrets: api_key.map(|k| Secret(flags::secrets_yaml(k))),
        ranks: Vec::new(),
    }
}

/// The GPUs `host` offers: its inventory list, or every GPU the host has for `all`.
pub fn host_gpus(host: &HostSpec, facts: &HostFacts) -> Vec<u32> {
    match host {
        HostSpec::Machine(m) => match &m.gpus {
            GpuSelection::All => facts.gpus_present.clone(),
            GpuSelection::List(list) => list.clone(),
        },
        HostSpec::Slurm(_) => facts.gpus_present.clone(),
    }
}

/// The secret is in no argv, so it never enters the fingerprint (the record holding it is
/// readable on the target): changing only the API key is not a config change.
pub fn fingerprint(masked_argv: &[String], env: &BTreeMap<String, String>) -> String {
    let mut hash = Sha256::new();
    for arg in masked_argv {
        hash.update(arg.as_bytes());
        hash.update([0]);
    }
    hash.update([1]);
    for (k, v) in env {
        hash.update(k.as_bytes());
        hash.update([0]);
        hash.update(v.as_bytes());
        hash.update([0]);
    }
    hash.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn join(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sglang::flags::tests::profile;

    const HELP_0_5_10: &str = include_str!("../../tests/fixtures/sglang/help-0.5.10.txt");

    /// An inventory host on this machine (no SSH, no container) with `gpus`.
    pub(crate) fn host(name: &str, gpus: GpuSelection) -> HostSpec {
        HostSpec::Machine(crate::config::MachineSpec {
            name: name.into(),
            ssh: None,
            container: None,
            gpus,
            address: None,
            ssh_options: BTreeMap::new(),
        })
    }

    fn facts(address: &str) -> HostFacts {
        HostFacts {
            help: Some(HelpSpec::parse(HELP_0_5_10)),
            version: Some("0.5.10".into()),
            address: address.into(),
            gpus_present: vec![0, 1, 2, 3],
            places: Vec::new(),
            topology: Topology::NotRead,
        }
    }

    #[test]
    fn one_instance_per_gpu_pinned_with_its_port_and_files() {
        let mut p = profile();
        p.env.insert("HF_HUB_OFFLINE".into(), "1".into());
        let hosts = vec![(
            host("ct200", GpuSelection::List(vec![0, 5])),
            facts("10.1.2.50"),
        )];
        let plan = plan(&p, &hosts, None, None, "/tmp/fleet").unwrap();
        assert_eq!(plan.len(), 2);
        let i = &plan[1];
        assert_eq!((&i.id, i.port), (&ServerId::gpu("ct200", 5), 30005));
        assert_eq!(i.label(), "ct200 gpu5 :30005");
        assert_eq!(&i.argv[..3], &p.launcher[..]);
        assert_eq!(
            i.server_args()[..8],
            [
                "--model-path",
                "/models/Qwen3.6-27B",
                "--served-model-name",
                "qwen3.6-27b",
                "--host",
                "10.1.2.50",
                "--port",
                "30005"
            ]
        );
        assert!(i.argv.contains(&"--mamba-scheduler-strategy".to_string()));
        assert_eq!(
            i.env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
            Some("5")
        );
        assert_eq!(i.env.get("HF_HUB_OFFLINE").map(String::as_str), Some("1"));
        assert_eq!(
            i.env.get("CUDA_DEVICE_ORDER").map(String::as_str),
            Some("PCI_BUS_ID")
        );
        assert_eq!(
            i.files,
            RunFiles {
                dir: "/tmp/fleet/30005".into(),
                log: "/tmp/fleet/30005/server.log".into(),
                pidfile: "/tmp/fleet/30005/pid".into(),
                record: "/tmp/fleet/30005/instance.json".into(),
                secrets: "/tmp/fleet/30005/secrets.yaml".into(),
            }
        );
        assert_ne!(plan[0].fingerprint, plan[1].fingerprint);
    }

    #[test]
    fn a_tensor_parallel_server_takes_a_group_by_the_boards_topology() {
        let mut p = profile();
        p.server.parallel.tp = 2;
        let board = Board::parse(crate::layout::topology::tests::PCIE_UNORDERED).unwrap();
        let mut f = facts("10.1.2.50");
        f.gpus_present = (0..8).collect();
        f.topology = Topology::Read(board);
        let hosts = vec![(host("ct200", GpuSelection::All), f)];
        let plan = plan(&p, &hosts, None, None, "/tmp/fleet").unwrap();
        let shown: Vec<(String, &str)> = plan
            .iter()
            .map(|i| (i.label(), i.env["CUDA_VISIBLE_DEVICES"].as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("ct200 gpu0+2 :30000".to_string(), "0,2"),
                ("ct200 gpu1+3 :30001".to_string(), "1,3"),
                ("ct200 gpu4+6 :30004".to_string(), "4,6"),
                ("ct200 gpu5+7 :30005".to_string(), "5,7"),
            ]
        );
        let tp = plan[0].argv.iter().position(|a| a == "--tp-size").unwrap();
        assert_eq!(plan[0].argv[tp + 1], "2");
        assert!(contiguous_fallbacks(&hosts, &plan).is_empty());

        // Without a board the groups are contiguous, and the user hears why once per host.
        let mut unread = hosts.clone();
        unread[0].1.topology = Topology::Unreadable("nvidia-smi: topo not supported".into());
        let plain = super::plan(&p, &unread, Some(&[4, 5, 6, 7]), None, "/tmp/fleet").unwrap();
        assert_eq!(plain[0].env["CUDA_VISIBLE_DEVICES"], "4,5");
        assert_eq!(
            contiguous_fallbacks(&unread, &plain),
            [("ct200", "nvidia-smi: topo not supported")]
        );
    }

    #[test]
    fn a_layout_no_host_can_hold_is_refused_naming_every_host() {
        let mut p = profile();
        p.server.parallel.tp = 16;
        let hosts = vec![
            (
                host("a", GpuSelection::List((0..8).collect())),
                facts("127.0.0.1"),
            ),
            (
                host("b", GpuSelection::List(vec![0, 1])),
                facts("127.0.0.1"),
            ),
        ];
        let err = plan(&p, &hosts, None, None, DEFAULT_RUN_ROOT).unwrap_err();
        let lines: Vec<String> = err.to_string().lines().map(str::to_string).collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].starts_with("host `a`: a tp16 server needs 16 GPUs"),
            "{err}"
        );
        assert!(lines[1].contains("the selection has 2 (0,1)"), "{err}");
    }

    #[test]
    fn gpus_all_uses_the_discovered_gpus_and_the_filter_applies() {
        let hosts = vec![(host("local", GpuSelection::All), facts("127.0.0.1"))];
        let plan = plan(&profile(), &hosts, Some(&[1, 3]), None, "/run/x/").unwrap();
        assert_eq!(
            plan.iter().map(|i| i.port).collect::<Vec<_>>(),
            vec![30001, 30003]
        );
        assert_eq!(plan[0].files.dir, "/run/x/30001");
    }

    #[test]
    fn unknown_gpu_in_the_filter_names_what_exists() {
        let hosts = vec![(
            host("ct200", GpuSelection::List(vec![0, 1])),
            facts("127.0.0.1"),
        )];
        let err = plan(&profile(), &hosts, Some(&[1, 9]), None, DEFAULT_RUN_ROOT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--gpus 9: not in the inventory of any host (hosts have: ct200: 0,1)"
        );
    }

    #[test]
    fn api_key_runs_but_never_shows_or_changes_the_fingerprint() {
        let mut p = profile();
        p.api_key_env = Some("FLEET_API_KEY".into());
        let hosts = vec![(host("h", GpuSelection::List(vec![0])), facts("127.0.0.1"))];
        let a = plan(&p, &hosts, None, Some("sk-one"), DEFAULT_RUN_ROOT).unwrap();
        let b = plan(&p, &hosts, None, Some("sk-two"), DEFAULT_RUN_ROOT).unwrap();
        // The key is in no argv: `--config` names the file that holds it.
        assert!(!a[0].argv.iter().any(|x| x.contains("sk-")));
        let config = a[0].argv.iter().position(|x| x == "--config").unwrap();
        assert_eq!(a[0].argv[config + 1], "/tmp/fleet/30000/secrets.yaml");
        let secrets = a[0].secrets.as_ref().unwrap();
        assert!(secrets.0.contains("api-key: \"sk-one\""));
        assert!(!format!("{:?}", a[0]).contains("sk-one"));
        assert_eq!(a[0].fingerprint, b[0].fingerprint);
        let none = plan(&p, &hosts, None, None, DEFAULT_RUN_ROOT).unwrap();
        assert!(none[0].secrets.is_none() && !none[0].argv.contains(&"--config".into()));
        p.server.extra_args = vec!["--config".into(), "/etc/s.yaml".into()];
        assert!(matches!(
            plan(&p, &hosts, None, Some("sk-one"), DEFAULT_RUN_ROOT),
            Err(PlanError::ConfigTwice { .. })
        ));
        p.server.extra_args.clear();
        p.server.mem_fraction_static = Some(0.8);
        let c = plan(&p, &hosts, None, Some("sk-one"), DEFAULT_RUN_ROOT).unwrap();
        assert_ne!(a[0].fingerprint, c[0].fingerprint);
    }

    #[test]
    fn impossible_plans_are_errors() {
        let mut p = profile();
        p.port_base = 65530;
        let hosts = vec![(host("h", GpuSelection::List(vec![7])), facts("127.0.0.1"))];
        assert!(matches!(
            plan(&p, &hosts, None, None, DEFAULT_RUN_ROOT),
            Err(PlanError::Port(_))
        ));
        let mut nodes = profile();
        nodes.server.parallel.nnodes = 2;
        assert!(matches!(
            plan(&nodes, &hosts, None, None, DEFAULT_RUN_ROOT),
            Err(PlanError::MultiNode { nnodes: 2, .. })
        ));
        let mut pinned = profile();
        pinned.env.insert("CUDA_VISIBLE_DEVICES".into(), "0".into());
        assert!(matches!(
            plan(&pinned, &hosts, None, None, DEFAULT_RUN_ROOT),
            Err(PlanError::EnvPinsGpu)
        ));
    }
}

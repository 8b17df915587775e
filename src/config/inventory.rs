//! The inventory (`fleet.yaml`): which hosts, how to reach them (SSH, Proxmox container) and
//! which GPUs, validated with every problem reported at once.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::Path;

use super::check::{Checker, suggest};
use super::yaml::{Loc, Node, Value};
use super::{ConfigError, GpuSelection, HostSpec, Inventory, MachineSpec, SlurmHost, SshTarget};

pub(super) const MINIMAL_EXAMPLE: &str = "\
hosts:
  - name: local            # this machine, all of its GPUs
  - name: ct200
    ssh: root@10.1.2.6     # user@host[:port]
    container: 200         # Proxmox CT id: commands run via `pct exec 200 -- ...`
    gpus: all              # or a list: [0, 1, 2, 3]";

const HOST_KEYS: &[&str] = &[
    "name",
    "ssh",
    "container",
    "gpus",
    "address",
    "ssh_options",
    "slurm",
];

/// What only a machine has: on a Slurm host, Slurm places the servers and gives the GPUs.
const MACHINE_ONLY: &[&str] = &["container", "gpus", "address"];

/// The OpenSSH options fleet's SSH transport honours, spelled as in `ssh_config(5)`.
pub const SSH_OPTIONS: &[&str] = &[
    "HostName",
    "User",
    "Port",
    "IdentityFile",
    "UserKnownHostsFile",
    "ConnectTimeout",
    "ProxyJump",
    "ServerAliveInterval",
    "ServerAliveCountMax",
    "IdentitiesOnly",
];

/// Proxmox VE's range of guest ids.
const CT_IDS: (i128, i128) = (100, 999_999_999);

/// Loads and validates `fleet.yaml`; a missing file is an error that shows a minimal one.
pub fn load_inventory(path: &Path) -> Result<Inventory, ConfigError> {
    match fs::read_to_string(path) {
        Ok(text) => inventory_from_str(&text, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ConfigError::MissingInventory {
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        }),
        Err(source) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Validates inventory text; `path` names it in messages.
pub fn inventory_from_str(text: &str, path: &Path) -> Result<Inventory, ConfigError> {
    let mut c = Checker::default();
    let file = c.add_file(path.to_path_buf());
    let read = c.parse(text, file).and_then(|root| hosts(&mut c, &root));
    c.finish(read.map(|(fleet, hosts)| Inventory {
        path: path.to_path_buf(),
        fleet,
        hosts,
    }))
}

/// The fleet's name (`fleet:`, optional) and its hosts.
fn hosts(c: &mut Checker, root: &Node) -> Option<(Option<String>, Vec<HostSpec>)> {
    let top = c.fields(root, "", &["hosts", "fleet"])?;
    let fleet = top.get("fleet").and_then(|n| fleet_name(c, n));
    let node = top.required(c, "hosts")?;
    let Value::Seq(items) = &node.value else {
        c.wrong_type(node.loc, "hosts", "a list of hosts", &node.value);
        return None;
    };
    if items.is_empty() {
        c.report(
            node.loc,
            "hosts",
            "no hosts",
            Some("list at least one, e.g. `- name: local`".into()),
        );
    }
    let read: Vec<Option<Read>> = items
        .iter()
        .enumerate()
        .map(|(i, n)| host(c, n, &format!("hosts[{i}]")))
        .collect();
    let read: Vec<Read> = read.into_iter().flatten().collect();
    unique_names(c, &read);
    collisions(c, &read);
    Some((fleet, read.into_iter().map(|r| r.spec).collect()))
}

/// `fleet: NAME`: what the servers this inventory starts are recorded as theirs by, and what
/// `--fleet NAME` names; a word, since users type it.
fn fleet_name(c: &mut Checker, n: &Node) -> Option<String> {
    let name = c.string(n, "fleet")?;
    let fits = |ch: char| ch.is_ascii_alphanumeric() || "._-".contains(ch);
    if name.is_empty() || name.len() > 64 || !name.chars().all(fits) {
        c.report(
            n.loc,
            "fleet",
            format!("`{name}` is not a fleet name"),
            Some("use 1 to 64 letters, digits, `.`, `_` or `-`, e.g. `fleet: alice-27b`".into()),
        );
        return None;
    }
    Some(name)
}

/// A valid host, with what cross-host problems point at.
struct Read {
    spec: HostSpec,
    /// `hosts[i]`.
    path: String,
    name_loc: Loc,
    gpus_loc: Loc,
}

fn host(c: &mut Checker, node: &Node, path: &str) -> Option<Read> {
    let f = c.fields(node, path, HOST_KEYS)?;
    let name_node = f.required(c, "name");
    let name = name_node.and_then(|n| host_name(c, n, &f.field("name")));
    let ssh = f.get("ssh").and_then(|n| {
        let field = f.field("ssh");
        let text = c.string(n, &field)?;
        parse_ssh_target(&text)
            .map_err(|e| {
                c.report(
                    n.loc,
                    &field,
                    e.to_string(),
                    Some("write user@host or user@host:port; omit ssh for this machine".into()),
                )
            })
            .ok()
    });
    let container = f.get("container").and_then(|n| {
        let id = c.int(n, &f.field("container"), CT_IDS.0, CT_IDS.1);
        id.map(|id| id as u32)
    });
    let gpus = f
        .get("gpus")
        .map_or(Some(GpuSelection::All), |n| gpus(c, n, &f.field("gpus")));
    let address = f.get("address").and_then(|n| {
        let field = f.field("address");
        let a = c.string(n, &field)?;
        if a.contains(char::is_whitespace) {
            c.report(
                n.loc,
                &field,
                format!("`{a}` is not an address"),
                Some("one IP address or host name".into()),
            );
            return None;
        }
        Some(a)
    });
    let ssh_options = match f.get("ssh_options") {
        Some(n) if f.get("ssh").is_none() => {
            c.report(
                n.loc,
                &f.field("ssh_options"),
                "set on a host without `ssh`",
                Some("a host without `ssh` is this machine; add `ssh: user@host`".into()),
            );
            BTreeMap::new()
        }
        Some(n) => ssh_options(c, n, &f.field("ssh_options"), ssh.as_ref()),
        None => BTreeMap::new(),
    };
    let gpus_loc = f.get("gpus").map_or(f.loc, |n| n.loc);
    let name_loc = name_node.map_or(f.loc, |n| n.loc);
    let spec = match f.get("slurm") {
        Some(block) => {
            for key in MACHINE_ONLY {
                if let Some(n) = f.get(key) {
                    c.report(
                        n.loc,
                        &f.field(key),
                        "does not apply to a Slurm host",
                        Some(format!(
                            "Slurm places the servers and gives each its GPU; set the count \
                             as `{}.gpus`",
                            f.field("slurm")
                        )),
                    );
                }
            }
            let slurm = super::slurm::slurm_block(c, block, &f.field("slurm"));
            let (slurm, stop_before_end) = match slurm {
                Some((s, d)) => (Some(s), Some(d)),
                None => (None, None),
            };
            HostSpec::Slurm(SlurmHost {
                login: MachineSpec {
                    name: name?,
                    ssh,
                    container: None,
                    gpus: GpuSelection::List(Vec::new()),
                    address: None,
                    ssh_options,
                },
                slurm: slurm?,
                stop_before_end: stop_before_end?,
            })
        }
        None => HostSpec::Machine(MachineSpec {
            name: name?,
            ssh,
            container,
            gpus: gpus?,
            address,
            ssh_options,
        }),
    };
    Some(Read {
        spec,
        path: path.to_string(),
        name_loc,
        gpus_loc,
    })
}

/// Names appear in instance ids (`ct200:5`), file names and tables.
fn host_name(c: &mut Checker, node: &Node, field: &str) -> Option<String> {
    let name = c.string(node, field)?;
    let ok = name.starts_with(|ch: char| ch.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch));
    if ok {
        return Some(name);
    }
    c.report(
        node.loc,
        field,
        format!("`{name}` is not a usable host name"),
        Some("use letters, digits, `.`, `_` and `-`, starting with a letter or digit".into()),
    );
    None
}

/// Why a `[user@]host[:port]` target does not read; each names the text as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshTargetError {
    #[error("`{0}` contains whitespace")]
    Whitespace(String),
    #[error("`{0}` has an empty user before `@`")]
    EmptyUser(String),
    #[error("`{0}` has an unclosed `[`")]
    Unclosed(String),
    #[error("`{0}`: expected `:port` after `]`")]
    AfterBracket(String),
    #[error("`{0}`: an IPv6 address needs brackets, e.g. root@[::1]:22")]
    Ipv6(String),
    #[error("`{0}` has no host")]
    NoHost(String),
    #[error("`{target}`: `{host}` is not a host name or address")]
    BadHost { target: String, host: String },
    #[error("`{target}`: port `{port}` is not 1..=65535")]
    BadPort { target: String, port: String },
}

/// `[user@]host[:port]`, with `[v6::addr]` in brackets when a port follows or not.
pub fn parse_ssh_target(s: &str) -> Result<SshTarget, SshTargetError> {
    let whole = || s.to_string();
    if s.contains(char::is_whitespace) {
        return Err(SshTargetError::Whitespace(whole()));
    }
    let (user, rest) = match s.split_once('@') {
        Some(("", _)) => return Err(SshTargetError::EmptyUser(whole())),
        Some((user, rest)) => (Some(user.to_string()), rest),
        None => (None, s),
    };
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| SshTargetError::Unclosed(whole()))?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| SshTargetError::AfterBracket(whole()))?,
                ),
            ),
        }
    } else if rest.matches(':').count() > 1 {
        return Err(SshTargetError::Ipv6(whole()));
    } else {
        match rest.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err(SshTargetError::NoHost(whole()));
    }
    if host.starts_with('-') || host.contains('@') {
        return Err(SshTargetError::BadHost {
            target: whole(),
            host: host.to_string(),
        });
    }
    let port = port
        .map(|p| match p.parse::<u16>() {
            Ok(port) if port > 0 => Ok(port),
            _ => Err(SshTargetError::BadPort {
                target: whole(),
                port: p.to_string(),
            }),
        })
        .transpose()?;
    Ok(SshTarget {
        user,
        host: host.to_string(),
        port,
    })
}

impl MachineSpec {
    /// This machine itself: no SSH hop and no container in between, so its GPUs can be read
    /// through NVML here and its processes are ours to look at directly.
    pub fn is_local(&self) -> bool {
        self.ssh.is_none() && self.container.is_none()
    }
}

impl fmt::Display for SshTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        match (self.host.contains(':'), self.port) {
            (true, Some(port)) => write!(f, "[{}]:{port}", self.host),
            (false, Some(port)) => write!(f, "{}:{port}", self.host),
            (_, None) => write!(f, "{}", self.host),
        }
    }
}

fn gpus(c: &mut Checker, node: &Node, field: &str) -> Option<GpuSelection> {
    match &node.value {
        Value::Str(s) if s == "all" => Some(GpuSelection::All),
        Value::Seq(items) if items.is_empty() => {
            c.report(
                node.loc,
                field,
                "empty GPU list",
                Some("write `all` or list GPU indices, e.g. [0, 1]".into()),
            );
            None
        }
        Value::Seq(_) => {
            let list = c.list(node, field, |c, n, f| {
                c.int(n, f, 0, u32::MAX.into()).map(|g| (g as u32, n.loc))
            })?;
            let mut seen = BTreeMap::new();
            for (i, (gpu, loc)) in list.iter().enumerate() {
                if let Some(first) = seen.insert(*gpu, i) {
                    c.report(
                        *loc,
                        &format!("{field}[{i}]"),
                        format!("GPU {gpu} is listed twice"),
                        Some(format!("already at {field}[{first}]")),
                    );
                }
            }
            Some(GpuSelection::List(
                list.into_iter().map(|(g, _)| g).collect(),
            ))
        }
        other => {
            c.wrong_type(node.loc, field, "`all` or a list of GPU indices", other);
            None
        }
    }
}

/// `ssh_options:`, by canonical name; a User or Port that contradicts `ssh:` is a problem.
fn ssh_options(
    c: &mut Checker,
    node: &Node,
    path: &str,
    target: Option<&SshTarget>,
) -> BTreeMap<String, String> {
    let mut options = BTreeMap::new();
    for (key, value) in c.entries(node, path) {
        let field = format!("{path}.{}", key.name);
        // OpenSSH matches option names without regard to case.
        let Some(name) = SSH_OPTIONS
            .iter()
            .find(|o| o.eq_ignore_ascii_case(&key.name))
        else {
            let hint = match suggest(&key.name, SSH_OPTIONS) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!("supported: {}", SSH_OPTIONS.join(", ")),
            };
            c.report(
                key.loc,
                &field,
                "unknown or unsupported ssh option",
                Some(hint),
            );
            continue;
        };
        let text = match *name {
            "Port" => c.int(value, &field, 1, 65535).map(|p| p.to_string()),
            "ConnectTimeout" => c
                .int(value, &field, 1, i128::from(u32::MAX))
                .map(|s| s.to_string()),
            // 0 turns keepalives off, as in OpenSSH.
            "ServerAliveInterval" | "ServerAliveCountMax" => c
                .int(value, &field, 0, i128::from(u32::MAX))
                .map(|s| s.to_string()),
            "IdentitiesOnly" => yes_no(c, value, &field),
            "ProxyJump" => proxy_jump(c, value, &field),
            _ => c.string(value, &field),
        };
        let in_target = match *name {
            "User" => target.and_then(|t| t.user.clone()),
            "Port" => target.and_then(|t| t.port).map(|p| p.to_string()),
            _ => None,
        };
        if let (Some(set), Some(text)) = (&in_target, &text)
            && set != text
        {
            c.report(
                key.loc,
                &field,
                format!("`{text}` contradicts `{set}` in `ssh:`"),
                Some("set it in one place".into()),
            );
        }
        if options.contains_key(*name) {
            c.report(
                key.loc,
                &field,
                format!("`{name}` is set twice"),
                Some("OpenSSH option names ignore case".into()),
            );
        } else if let Some(text) = text {
            options.insert(name.to_string(), text);
        }
    }
    options
}

/// `yes`/`no` as OpenSSH writes them, or a YAML boolean.
fn yes_no(c: &mut Checker, node: &Node, field: &str) -> Option<String> {
    let text = match &node.value {
        Value::Bool(b) => return Some(if *b { "yes" } else { "no" }.to_string()),
        Value::Str(s) => s.to_ascii_lowercase(),
        other => {
            c.wrong_type(node.loc, field, "yes or no", other);
            return None;
        }
    };
    match text.as_str() {
        "yes" | "true" => Some("yes".into()),
        "no" | "false" => Some("no".into()),
        _ => {
            c.report(node.loc, field, format!("`{text}` is not yes or no"), None);
            None
        }
    }
}

/// `none`, or jump hosts `[user@]host[:port]` separated by commas, first hop first.
fn proxy_jump(c: &mut Checker, node: &Node, field: &str) -> Option<String> {
    let text = c.string(node, field)?;
    if text.eq_ignore_ascii_case("none") {
        return Some(text);
    }
    for hop in text.split(',') {
        if let Err(e) = parse_ssh_target(hop.strip_prefix("ssh://").unwrap_or(hop)) {
            c.report(
                node.loc,
                field,
                e.to_string(),
                Some(
                    "write jump hosts as `[user@]host[:port]`, separated by commas, or `none`"
                        .into(),
                ),
            );
            return None;
        }
    }
    Some(text)
}

fn unique_names(c: &mut Checker, hosts: &[Read]) {
    let mut seen: BTreeMap<&str, Loc> = BTreeMap::new();
    for h in hosts {
        if let Some(first) = seen.insert(h.spec.name(), h.name_loc) {
            c.report(
                h.name_loc,
                &format!("{}.name", h.path),
                format!("host name `{}` is used twice", h.spec.name()),
                Some(format!(
                    "first on line {}; names must be unique",
                    first.line
                )),
            );
        }
    }
}

/// Two hosts on the same machine and container would serve a shared GPU on the same port.
fn collisions(c: &mut Checker, hosts: &[Read]) {
    // Users differ, the machine does not: `root@pve` and `admin@pve:22` are one place.
    let place = |h: &MachineSpec| {
        (
            h.ssh
                .as_ref()
                .map(|s| (s.host.clone(), s.port.unwrap_or(22))),
            h.container,
        )
    };
    // Only machines share GPUs by place.
    let machines: Vec<(&Read, &MachineSpec)> = hosts
        .iter()
        .filter_map(|r| Some((r, r.spec.machine()?)))
        .collect();
    for (j, (b, bm)) in machines.iter().enumerate() {
        for (a, am) in &machines[..j] {
            if place(am) != place(bm) {
                continue;
            }
            let shared = match (&am.gpus, &bm.gpus) {
                (GpuSelection::List(x), GpuSelection::List(y)) => {
                    let shared: Vec<String> = y
                        .iter()
                        .filter(|g| x.contains(g))
                        .map(u32::to_string)
                        .collect();
                    if shared.is_empty() {
                        continue;
                    }
                    format!("GPUs {}", shared.join(", "))
                }
                _ => "GPUs (one of them uses `all`)".to_string(),
            };
            c.report(
                b.gpus_loc,
                &format!("{}.gpus", b.path),
                format!(
                    "port collision: host `{}` shares {shared} with host `{}` (line {}) on the same \
                     machine and container",
                    bm.name, am.name, a.name_loc.line
                ),
                Some("give each host distinct GPUs, or merge them into one host".into()),
            );
        }
    }
}

#[cfg(test)]
#[path = "inventory_tests.rs"]
mod tests;

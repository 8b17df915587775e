//! Hosts this process cannot reach directly: a chain of network namespaces made by the test,
//! `root <-> N1 <-> N2 <-> ... <-> Nk`, one veth pair per link (`prev`/`next` inside) and no forwarding anywhere, so
//! from here only N1 answers, N1 reaches only N2, and so on. [`Hops`] puts an sshd in each:
//! bastions first, the target last, as a Proxmox host behind a jump host is.
//!
//! Addresses come from 198.18.0.0/15 (RFC 2544, for test networks): world slot S uses
//! 198.18.S.0/24, link i its /30 at 4i. The rest of that /24 is an `unreachable` route here, so
//! a connection that skipped the jump fails at once instead of leaving the machine. Names
//! carry this process's pid; the first world of a process removes what a killed run left.
//! Needs root (CAP_NET_ADMIN) and iproute2, which `scripts/test` installs.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;

use super::{Sshd, TestHome};

/// Runs `ip ARGS`, panicking with its stderr on failure.
fn ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("`ip` not found: install iproute2 (scripts/test does)");
    assert!(
        out.status.success(),
        "ip {}: {}\n  hint: the ProxyJump tests make network namespaces and need root",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `ip ARGS`, ignoring failure (cleanup of what may already be gone).
fn ip_quiet(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Serialises slot choice and creation across test processes.
struct Lock(File);

impl Lock {
    fn take() -> Lock {
        let f =
            File::create(std::env::temp_dir().join("fleet-test-netns.lock")).expect("lock file");
        // SAFETY: flock on a descriptor this struct owns; released when it closes.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        Lock(f)
    }
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Processes inside namespace `ns`, by pid (never by name).
fn kill_inside(ns: &str) {
    let out = Command::new("ip").args(["netns", "pids", ns]).output();
    for pid in out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        // SAFETY: a process in a namespace this harness made.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// What runs of killed test processes left: their namespaces and their routes.
fn sweep_leftovers() {
    for line in ip(&["netns", "list"]).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name
            .strip_prefix("fleet-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !alive(pid) {
            kill_inside(name);
            ip_quiet(&["netns", "del", name]);
        }
    }
    for line in ip(&["-4", "route", "show", "table", "main"]).lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() != Some(&"unreachable")
            || !words.get(1).is_some_and(|n| n.starts_with("198.18."))
        {
            continue;
        }
        let metric = words
            .iter()
            .position(|w| *w == "metric")
            .and_then(|i| words.get(i + 1));
        if let Some(pid) = metric.and_then(|m| m.parse::<u32>().ok())
            && !alive(pid)
        {
            ip_quiet(&[
                "route",
                "del",
                "unreachable",
                words[1],
                "metric",
                &pid.to_string(),
            ]);
        }
    }
}

/// A chain of `k` namespaces linked to this one through the first.
pub struct Chain {
    slot: u8,
    namespaces: Vec<String>,
}

impl Chain {
    pub fn new(k: usize) -> Chain {
        assert!((1..=60).contains(&k), "1 to 60 namespaces");
        let _lock = Lock::take();
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(sweep_leftovers);
        let pid = std::process::id();
        let used =
            ip(&["-4", "-o", "addr", "show"]) + &ip(&["-4", "route", "show", "table", "all"]);
        let slot = (0..=255u8)
            .find(|s| !used.contains(&format!("198.18.{s}.")))
            .expect("a free 198.18.S.0/24 for a test network");
        let namespaces: Vec<String> = (1..=k).map(|i| format!("fleet-{pid}-{slot}-{i}")).collect();
        let chain = Chain { slot, namespaces };
        for ns in &chain.namespaces {
            ip_quiet(&["netns", "del", ns]);
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "dev", "lo", "up"]);
            // Each namespace passes nothing on: a hop is reached only by a process inside it.
            let status = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns,
                    "sh",
                    "-c",
                    "echo 0 > /proc/sys/net/ipv4/ip_forward",
                ])
                .status()
                .expect("ip netns exec");
            assert!(status.success(), "cannot turn off forwarding in {ns}");
        }
        let root_if = format!("fl{pid}-{slot}");
        for i in 0..k {
            let far_ns = &chain.namespaces[i];
            match i {
                0 => ip(&[
                    "link", "add", "name", &root_if, "type", "veth", "peer", "name", "prev",
                    "netns", far_ns,
                ]),
                _ => {
                    let near_ns = &chain.namespaces[i - 1];
                    ip(&[
                        "link", "add", "name", "next", "netns", near_ns, "type", "veth", "peer",
                        "name", "prev", "netns", far_ns,
                    ])
                }
            };
            let (near, far) = chain.link_addrs(i);
            let near_cidr = format!("{near}/30");
            let far_cidr = format!("{far}/30");
            if i == 0 {
                ip(&["addr", "add", &near_cidr, "dev", &root_if]);
                ip(&["link", "set", "dev", &root_if, "up"]);
            } else {
                let near_ns = &chain.namespaces[i - 1];
                ip(&["-n", near_ns, "addr", "add", &near_cidr, "dev", "next"]);
                ip(&["-n", near_ns, "link", "set", "dev", "next", "up"]);
            }
            ip(&["-n", far_ns, "addr", "add", &far_cidr, "dev", "prev"]);
            ip(&["-n", far_ns, "link", "set", "dev", "prev", "up"]);
        }
        ip(&[
            "route",
            "add",
            "unreachable",
            &chain.subnet(),
            "metric",
            &pid.to_string(),
        ]);
        chain
    }

    fn subnet(&self) -> String {
        format!("198.18.{}.0/24", self.slot)
    }

    /// The near and far addresses of link `i` (link 0 joins this namespace to the first).
    fn link_addrs(&self, i: usize) -> (String, String) {
        let base = 4 * i as u32;
        (
            format!("198.18.{}.{}", self.slot, base + 1),
            format!("198.18.{}.{}", self.slot, base + 2),
        )
    }

    /// Namespace `i` (0-based).
    pub fn ns(&self, i: usize) -> &str {
        &self.namespaces[i]
    }

    /// The address of namespace `i` as the one before it (this one for 0) reaches it.
    pub fn addr(&self, i: usize) -> String {
        self.link_addrs(i).1
    }

    /// Where connections into namespace `i` come from: the address of the one before it (this
    /// one for 0) on their link.
    pub fn peer_addr(&self, i: usize) -> String {
        self.link_addrs(i).0
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            // What fleet started there (detached servers) would keep the namespace alive.
            kill_inside(ns);
            ip_quiet(&["netns", "del", ns]);
        }
        ip_quiet(&[
            "route",
            "del",
            "unreachable",
            &self.subnet(),
            "metric",
            &std::process::id().to_string(),
        ]);
    }
}

/// An sshd in each namespace of a chain: `bastions` jump hosts, then the target.
pub struct Hops {
    /// `sshds[i]` runs in namespace i; the last one is the target.
    pub sshds: Vec<Sshd>,
    /// Dropped after the sshds (fields drop in order).
    pub chain: Chain,
}

impl Hops {
    /// `target_env` is the target's sshd SetEnv (e.g. `FAKE_PCT_RUNNING`).
    pub fn start(bastions: usize, target_env: &[(&str, &str)]) -> Hops {
        let chain = Chain::new(bastions + 1);
        let sshds = (0..=bastions)
            .map(|i| {
                let env = if i == bastions { target_env } else { &[] };
                Sshd::start_in(Some(chain.ns(i)), &chain.addr(i), env)
            })
            .collect();
        Hops { sshds, chain }
    }

    pub fn target(&self) -> &Sshd {
        self.sshds.last().unwrap()
    }

    pub fn target_mut(&mut self) -> &mut Sshd {
        self.sshds.last_mut().unwrap()
    }

    pub fn bastion(&self, i: usize) -> &Sshd {
        &self.sshds[i]
    }

    /// The jump hosts' aliases in a HOME made by [`Hops::home`]: `bastion`, or `bastion1`,
    /// `bastion2`, ... when there are several.
    pub fn bastion_alias(&self, i: usize) -> String {
        if self.sshds.len() == 2 {
            "bastion".to_string()
        } else {
            format!("bastion{}", i + 1)
        }
    }

    /// A HOME whose `~/.ssh/config` names the target `alias` with `ProxyJump` through every
    /// bastion in order, each bastion its own block with its own key, and whose known_hosts
    /// trusts every hop.
    pub fn home(&self, alias: &str) -> TestHome {
        let home = TestHome::empty();
        let bastions: Vec<String> = (0..self.sshds.len() - 1)
            .map(|i| self.bastion_alias(i))
            .collect();
        home.add_key(&self.target().client_key, "target_key");
        home.append_config(&format!(
            "{}  ProxyJump {}\n",
            self.target().config_block(alias, "~/.ssh/target_key"),
            bastions.join(",")
        ));
        for (i, name) in bastions.iter().enumerate() {
            let key = format!("{name}_key");
            home.add_key(&self.sshds[i].client_key, &key);
            home.append_config(&self.sshds[i].config_block(name, &format!("~/.ssh/{key}")));
        }
        for sshd in &self.sshds {
            home.trust(&sshd.known_hosts_line());
        }
        home
    }
}

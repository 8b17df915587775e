//! Benchmarks of fleets on several SSH hosts, through the real binary, real sshd and the fake
//! `pct` (each container its own `/tmp`, each host's servers on its own loopback address): 16
//! sims on 2 hosts, the survivor's servers after one host is lost, a connection cut back to full
//! throughput, a detached job while no client is connected, and `fleet jobs` over 2 hosts.
//! Throughput is the sims' own `sglang:generation_tokens_total`, read beside fleet, against
//! the sum of their ideal output tok/s.
//!
//!     cargo bench --bench hosts [-- [FILTER] [--quick]]

#[path = "../tests/common/mod.rs"]
mod common;
mod headline;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::generate::write_lines;
use common::world::World;
use serde_json::{Value, json};

const SCALE: u32 = 20;

/// One server as the bench reads it, beside fleet.
struct Server {
    host: String,
    address: String,
    port: u16,
    pid: u32,
}

impl Server {
    fn get(&self, path: &str) -> String {
        let mut s = std::net::TcpStream::connect((self.address.as_str(), self.port))
            .unwrap_or_else(|e| panic!("{}:{}: {e}", self.address, self.port));
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.address
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default()
    }

    fn generated_tokens(&self) -> f64 {
        fleet::sglang::metrics::parse(&self.get("/metrics"))
            .generation_tokens_total
            .expect("generation_tokens_total")
    }

    fn ideal_output_tok_s(&self) -> f64 {
        let info: Value = serde_json::from_str(&self.get("/server_info")).unwrap();
        info["sim"]["ideal_output_tok_s"].as_f64().unwrap()
    }
}

fn tokens(servers: &[&Server]) -> f64 {
    servers.iter().map(|s| s.generated_tokens()).sum()
}

fn ideal(servers: &[&Server]) -> f64 {
    servers.iter().map(|s| s.ideal_output_tok_s()).sum()
}

/// The servers' output tok/s over the next `window`.
fn rate(servers: &[&Server], window: Duration) -> f64 {
    let t0 = Instant::now();
    let before = tokens(servers);
    std::thread::sleep(window);
    (tokens(servers) - before) / t0.elapsed().as_secs_f64()
}

/// (settle, window): how long a job runs before it is measured, and for how long.
fn timing() -> (Duration, Duration) {
    if headline::quick() {
        (Duration::from_secs(3), Duration::from_secs(4))
    } else {
        (Duration::from_secs(8), Duration::from_secs(15))
    }
}

/// `hosts` hosts with `gpus` simulated GPUs each and a no_buffer sim on every GPU, up.
struct Fleet {
    world: World,
    dir: tempfile::TempDir,
    servers: Vec<Server>,
}

impl Fleet {
    fn up(hosts: usize, gpus: u32) -> Fleet {
        let world = World::new(hosts);
        world.up_sims(gpus as u16, &[], SCALE);
        let mut f = Fleet {
            world,
            dir: tempfile::tempdir().unwrap(),
            servers: Vec::new(),
        };
        let rows: Value = serde_json::from_slice(&f.fleet(&["status", "--json"]).stdout).unwrap();
        f.servers = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let host = r["host"].as_str().unwrap().to_string();
                let i = f.world.hosts.iter().position(|h| h.name == host).unwrap();
                Server {
                    address: f.world.hosts[i].address.clone(),
                    host,
                    port: r["port"].as_u64().unwrap() as u16,
                    pid: r["pid"].as_u64().unwrap() as u32,
                }
            })
            .collect();
        assert_eq!(f.servers.len(), hosts * gpus as usize);
        f
    }

    fn on(&self, host: &str) -> Vec<&Server> {
        self.servers.iter().filter(|s| s.host == host).collect()
    }

    fn all(&self) -> Vec<&Server> {
        self.servers.iter().collect()
    }

    fn command(&self, args: &[&str]) -> Command {
        self.world.fleet(args)
    }

    fn fleet(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// The workload behind the sims' ideal: ~96-token prompts, natural outputs.
    fn prompts(&self, n: usize) -> PathBuf {
        let p = self.dir.path().join("prompts.jsonl");
        let lines: Vec<String> = (0..n)
            .map(|i| {
                json!({"id": i, "prompt": format!("{i:08} {}", "lorem ipsum dolor sit amet ".repeat(14))})
                    .to_string()
            })
            .collect();
        write_lines(&p, &lines);
        p
    }

    /// `fleet generate` here over every instance, in the background.
    fn generate(&self, prompts: &Path) -> Child {
        let out = self.dir.path().join("out");
        self.command(&[
            "-q",
            "generate",
            "--prompts",
            prompts.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
    }

    /// `fleet generate --detach` on `host`; returns the job's id.
    fn detach(&self, prompts: &Path, host: &str, out: &str) -> String {
        let o = self.fleet(&[
            "generate",
            "--detach",
            "--host",
            host,
            "--prompts",
            prompts.to_str().unwrap(),
            "--out",
            out,
            "--json",
        ]);
        assert!(o.status.success(), "detach: {}", text(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["job"].as_str().unwrap().to_string()
    }

    fn stop(&self, job: &str) {
        let o = self.fleet(&["stop", job, "--wait", "20s"]);
        assert!(o.status.success(), "stop {job}: {}", text(&o.stderr));
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for h in &mut self.world.hosts {
            if !h.sshd.is_running() {
                h.sshd.restart();
            }
        }
        let _ = self.fleet(&["down", "--grace", "2s"]);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Ends a foreground job as Ctrl-C would.
fn interrupt(mut job: Child) {
    // SAFETY: kill(2) on the child this bench spawned and has not reaped.
    unsafe { libc::kill(job.id() as i32, libc::SIGINT) };
    job.wait().unwrap();
}

fn percent(measured: f64, ideal: f64, window: Duration) -> (f64, String) {
    let share = 100.0 * measured / ideal;
    (
        share,
        format!(
            "{share:.1}% ({measured:.0} of {ideal:.0} tok/s, {} s window)",
            window.as_secs()
        ),
    )
}

/// 16 sims on 2 hosts, every request through the hosts' SSH connections.
fn sixteen_on_two() {
    let f = Fleet::up(2, 8);
    let (settle, window) = timing();
    let prompts = f.prompts(100_000);
    let job = f.generate(&prompts);
    std::thread::sleep(settle);
    let all = f.all();
    let (share, measured) = percent(rate(&all, window), ideal(&all), window);
    interrupt(job);
    println!("16 sims on 2 hosts: {measured}");
    headline::line(
        "hosts.sixteen_on_two",
        &measured,
        "16 sims on 2 hosts through SSH ≥ 97% of their summed ideal output tok/s",
        Some(share >= 97.0),
    );
}

/// 2 hosts with 4 sims each; one host goes away (its sshd and its servers) mid-run, and the
/// survivor's servers are measured from that moment on.
fn survivor() {
    let mut f = Fleet::up(2, 4);
    let (settle, window) = timing();
    let prompts = f.prompts(100_000);
    let job = f.generate(&prompts);
    std::thread::sleep(settle);
    let lost: Vec<u32> = f.on("ct201").iter().map(|s| s.pid).collect();
    f.world.hosts[1].sshd.stop();
    for pid in lost {
        // SAFETY: kill(2) on a pid read from fleet's records.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let survivors = f.on("ct200");
    let (share, measured) = percent(rate(&survivors, window), ideal(&survivors), window);
    interrupt(job);
    println!("the survivor's 4 sims after losing the other host: {measured}");
    headline::line(
        "hosts.survivor",
        &measured,
        "after losing 1 of 2 hosts, the survivor's servers ≥ 97% of their ideal output tok/s",
        Some(share >= 97.0),
    );
}

/// 4 sims on one host; every SSH session of the host is killed (sshd itself keeps answering)
/// and the time to full throughput again is the end of the first 1 s window, sampled every
/// 200 ms, whose output tok/s is back at 95% of the rate before the cut.
fn reconnect() {
    let f = Fleet::up(1, 4);
    let (settle, window) = timing();
    let prompts = f.prompts(100_000);
    let job = f.generate(&prompts);
    std::thread::sleep(settle);
    let all = f.all();
    let before = rate(&all, window);
    let killed = f.world.hosts[0].sshd.kill_sessions();
    assert!(killed > 0, "fleet's connection was served by this sshd");
    let cut = Instant::now();
    let mut samples: Vec<(Instant, f64)> = vec![(cut, tokens(&all))];
    let back = loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        samples.push((now, tokens(&all)));
        let start = samples
            .iter()
            .rev()
            .find(|(t, _)| now.duration_since(*t) >= Duration::from_secs(1));
        if let Some((t, n)) = start {
            let r = (samples.last().unwrap().1 - n) / now.duration_since(*t).as_secs_f64();
            if r >= 0.95 * before {
                break Some(now.duration_since(cut));
            }
        }
        if cut.elapsed() > Duration::from_secs(60) {
            break None;
        }
    };
    interrupt(job);
    let measured = match back {
        Some(d) => format!(
            "{:.1} s (to 95% of the {before:.0} tok/s before the cut)",
            d.as_secs_f64()
        ),
        None => "not within 60 s".to_string(),
    };
    println!("from a connection cut to full throughput: {measured}");
    headline::line(
        "hosts.reconnect",
        &measured,
        "from a connection cut to full throughput again ≤ 10 s once sshd answers",
        Some(back.is_some_and(|d| d <= Duration::from_secs(10))),
    );
}

/// A detached job on 8 sims with no client connected: the command that started it has
/// returned and every SSH session of the host is killed.
fn detached() {
    let f = Fleet::up(1, 8);
    let (settle, window) = timing();
    let prompts = f.prompts(100_000);
    let job = f.detach(&prompts, "ct200", "/tmp/bench-job");
    f.world.hosts[0].sshd.kill_sessions();
    std::thread::sleep(settle);
    let all = f.all();
    let (share, measured) = percent(rate(&all, window), ideal(&all), window);
    f.stop(&job);
    println!("detached job on 8 sims, no client connected: {measured}");
    headline::line(
        "hosts.detached",
        &measured,
        "a detached job on 8 sims, client disconnected, ≥ 97% of their ideal output tok/s",
        Some(share >= 97.0),
    );
}

/// `fleet jobs` over 2 hosts with one running job each: the median of 5 runs.
fn jobs_list() {
    let f = Fleet::up(2, 1);
    let prompts = f.prompts(100_000);
    let jobs: Vec<String> = ["ct200", "ct201"]
        .iter()
        .map(|h| f.detach(&prompts, h, "/tmp/bench-jobs"))
        .collect();
    let mut took: Vec<Duration> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            let o = f.fleet(&["jobs", "--json"]);
            let d = t0.elapsed();
            assert!(o.status.success(), "jobs: {}", text(&o.stderr));
            let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
            d
        })
        .collect();
    for job in &jobs {
        f.stop(job);
    }
    took.sort();
    let median = took[took.len() / 2];
    println!("fleet jobs over 2 hosts: {took:?}");
    headline::line(
        "hosts.jobs",
        &format!("{:.2} s (median of 5)", median.as_secs_f64()),
        "`fleet jobs` over 2 hosts answers in < 2 s",
        Some(median < Duration::from_secs(2)),
    );
}

/// Whether `GET /health` at `address:port` answers 200.
fn healthy(address: &str, port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect((address, port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

/// What one `pct exec` costs before its command runs, in the bench's fake `pct`: about what
/// the real one takes on an idle Proxmox node (its Perl CLI loading PVE's modules).
/// What one `pct exec` costs before its command runs; `FLEET_BENCH_PCT_EXEC_SECS` sets another.
const PCT_EXEC_SECS: &str = "0.5";

/// `fleet up` of 8 sims with a 3 s load on one host through ssh and `pct`, against the same 8
/// servers started by hand in parallel (one `ssh host pct exec …` each, as a person would,
/// polled every 10 ms): the floor `up` is measured against, in the same run, median of rounds.
fn up_vs_by_hand() {
    const GPUS: u16 = 8;
    let rounds = if headline::quick() { 1 } else { 3 };
    // A real `pct exec` loads Proxmox's Perl modules before it attaches: every call pays that,
    // by hand once per server (in parallel), and fleet once per step it runs in order.
    let pct_secs = std::env::var("FLEET_BENCH_PCT_EXEC_SECS").unwrap_or(PCT_EXEC_SECS.into());
    let world = World::with_env(1, &[("FAKE_PCT_EXEC_SECS", &pct_secs)]);
    let h = &world.hosts[0];
    let list: Vec<String> = (0..GPUS).map(|g| g.to_string()).collect();
    world.inventory(&format!("[{}]", list.join(", ")));
    let port_base = common::free_port_base(GPUS);
    std::fs::create_dir_all(world.home.path().join("profiles")).unwrap();
    std::fs::write(
        world.home.path().join("profiles/sim.yaml"),
        format!(
            "model: /models/test\nlauncher: [{}]\nport_base: {port_base}\nserver:\n  \
             mamba_strategy: no_buffer\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"3\"\n",
            common::local_fleet::SIM
        ),
    )
    .unwrap();
    let fleet = |args: &[&str]| {
        let o = world.fleet(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        o
    };
    let plan: Value =
        serde_json::from_slice(&fleet(&["--json", "up", "--profile", "sim", "--dry-run"]).stdout)
            .unwrap();
    // OpenSSH reads ~/.ssh from the passwd entry, not $HOME: the world's files are named.
    let ssh_dir = world.home.path().join(".ssh");
    let ssh = || {
        let mut c = Command::new("ssh");
        c.arg("-F")
            .arg(ssh_dir.join("config"))
            .arg("-i")
            .arg(ssh_dir.join(format!("{}_key", h.alias)))
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                ssh_dir.join("known_hosts").display()
            ))
            .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
            .arg(&h.alias);
        c
    };
    let (mut ups, mut hands) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        // By hand: one ssh command that starts every server in the background, each with its
        // command line and environment from the dry run, prints their pids and waits.
        let started = Instant::now();
        let mut script = String::new();
        for server in plan.as_array().unwrap() {
            let mut line = vec!["env".to_string()];
            for (k, v) in server["env"].as_object().unwrap() {
                let kv = format!("{k}={}", v.as_str().unwrap());
                line.push(shlex::try_quote(&kv).unwrap().into_owned());
            }
            for a in server["argv"].as_array().unwrap() {
                line.push(shlex::try_quote(a.as_str().unwrap()).unwrap().into_owned());
            }
            script.push_str(&format!("{} >/dev/null 2>&1 & echo $!; ", line.join(" ")));
        }
        script.push_str("wait");
        let remote = format!("sh -c {}", shlex::try_quote(&script).unwrap());
        let mut shell = ssh()
            .args(["pct", "exec", &h.container.to_string(), "--", &remote])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let ports: Vec<u16> = plan
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["port"].as_u64().unwrap() as u16)
            .collect();
        // One poller per server: a server still warming up holds a /health request open.
        std::thread::scope(|scope| {
            for p in &ports {
                let address = h.address.as_str();
                scope.spawn(move || {
                    while !healthy(address, *p) {
                        assert!(
                            started.elapsed() < Duration::from_secs(60),
                            "never ready by hand"
                        );
                        std::thread::sleep(Duration::from_millis(10));
                    }
                });
            }
        });
        hands.push(started.elapsed());
        // Stop them by the pids the shell printed, then let the ssh session end.
        let mut pids = String::new();
        let stdout = shell.stdout.as_mut().unwrap();
        while pids.lines().count() < ports.len() {
            let mut chunk = [0u8; 256];
            let n = stdout.read(&mut chunk).unwrap();
            assert!(n > 0, "the shell ended before printing every pid: {pids}");
            pids.push_str(&text(&chunk[..n]));
        }
        let mut kill = vec!["pct".to_string(), "exec".into(), h.container.to_string()];
        kill.extend(["--".into(), "kill".into()]);
        kill.extend(pids.split_whitespace().map(str::to_string));
        let o = ssh().args(&kill).output().unwrap();
        assert!(o.status.success(), "kill: {}", text(&o.stderr));
        shell.wait().unwrap();
        while ports.iter().any(|p| healthy(&h.address, *p)) {
            std::thread::sleep(Duration::from_millis(10));
        }

        let started = Instant::now();
        fleet(&["up", "--profile", "sim"]);
        ups.push(started.elapsed());
        fleet(&["down", "--grace", "10s"]);
    }
    println!("up through ssh + pct: {ups:?}; by hand: {hands:?}");
    ups.sort();
    hands.sort();
    let (up, hand) = (ups[rounds / 2], hands[rounds / 2]);
    let ratio = up.as_secs_f64() / hand.as_secs_f64();
    headline::line(
        "hosts.up_vs_hand",
        &format!(
            "{ratio:.2}× ({:.2} s vs {:.2} s by hand, medians of {rounds})",
            up.as_secs_f64(),
            hand.as_secs_f64()
        ),
        &format!(
            "`fleet up` of 8 sims (3 s load) through ssh + `pct` ({pct_secs} s a `pct exec`) ≤ 1.3× the same started by hand"
        ),
        Some(ratio <= 1.3),
    );
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let benches: [(&str, fn()); 6] = [
        ("up_vs_by_hand", up_vs_by_hand),
        ("sixteen_on_two", sixteen_on_two),
        ("survivor", survivor),
        ("reconnect", reconnect),
        ("detached", detached),
        ("jobs", jobs_list),
    ];
    for (name, bench) in benches {
        if filter.is_empty() || name.contains(&filter) {
            bench();
        }
    }
}

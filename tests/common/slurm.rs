//! A real Slurm cluster for the tests (Debian's `slurm-wlm` and `munge`): munged with its own
//! key and socket, slurmctld and N slurmd on this machine, each node with its own NodeAddr on
//! 127.0.0.x and its own slurmd port, eight fake GPUs per node (character devices 195:N, listed
//! in gres.conf with AutoDetect=off), and SLURM_CONF in the test's temp dir, never /etc/slurm.
//! Nodes can be killed (slurmd and everything of theirs, as a node that loses power) and
//! started again. Dropping it cancels every job and stops every process of the cluster, found
//! by pid, by the cluster's SLURM_CONF in its environment or by a file of the cluster it holds
//! open, never by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet::remote::LocalTransport;
use fleet::slurm::Slurm;
use tempfile::TempDir;

use super::{Ports, reserve_ports};

/// How slurmd tracks the processes of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proctrack {
    /// By parent pid: a process that leaves its step (`setsid`, `nohup &`) outlives it.
    Linuxproc,
    /// By cgroup (cgroup/v1 here, see the README): everything the step started ends with it.
    Cgroup,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: usize,
    pub gpus_per_node: u32,
    /// More than this machine has: slurmd takes the configured count (`config_overrides`).
    pub cpus_per_node: u32,
    pub proctrack: Proctrack,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 2,
            gpus_per_node: 8,
            cpus_per_node: 16,
            proctrack: Proctrack::Linuxproc,
        }
    }
}

/// The only partition, every node in it.
pub const PARTITION: &str = "gpu";

pub struct SlurmNode {
    pub name: String,
    /// Its NodeAddr: what its servers bind and clients connect to.
    pub addr: String,
    pub port: u16,
    /// The node's fake GPUs: `nvidia0`... as character devices.
    pub gpu_dir: PathBuf,
    slurmd: Option<Child>,
}

pub struct SlurmCluster {
    pub dir: TempDir,
    /// SLURM_CONF: `slurm.conf`, with `gres.conf` (and `cgroup.conf`) beside it.
    pub conf: PathBuf,
    pub nodes: Vec<SlurmNode>,
    pub proctrack: Proctrack,
    /// From starting munged to every node idle.
    pub startup: Duration,
    munged: Option<Child>,
    slurmctld: Option<Child>,
    _ports: Ports,
}

impl SlurmCluster {
    pub fn start(opts: Options) -> SlurmCluster {
        for program in [
            "/usr/sbin/slurmctld",
            "/usr/sbin/slurmd",
            "/usr/sbin/munged",
        ] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: the Slurm tests need Debian's slurm-wlm and munge \
                 (apt-get install slurm-wlm munge; scripts/test installs them)"
            );
        }
        // SAFETY: geteuid(2) has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the Slurm tests run as root (slurmd, fake GPU device nodes)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let ports = reserve_ports(1 + opts.nodes as u16);
        let d = dir.path().to_path_buf();
        for sub in ["munge", "state", "spool", "gpus"] {
            std::fs::create_dir_all(d.join(sub)).expect("cluster dirs");
        }
        set_mode(&d.join("munge"), 0o700);
        // Node names carry the controller's port: unique among the clusters of concurrent
        // tests, which matters where names are global (slurmd's cgroups, `slurm_<node>`).
        let nodes: Vec<SlurmNode> = (0..opts.nodes)
            .map(|i| {
                let name = format!("s{}n{}", ports.base, i + 1);
                let gpu_dir = d.join("gpus").join(&name);
                make_gpus(&gpu_dir, opts.gpus_per_node);
                SlurmNode {
                    addr: format!("127.0.0.{}", i + 2),
                    port: ports.base + 1 + i as u16,
                    gpu_dir,
                    name,
                    slurmd: None,
                }
            })
            .collect();
        let conf = d.join("slurm.conf");
        std::fs::write(&conf, slurm_conf(&d, ports.base, &nodes, &opts)).expect("slurm.conf");
        let gres: String = std::iter::once("AutoDetect=off\n".to_string())
            .chain(nodes.iter().map(|n| {
                format!(
                    "NodeName={} Name=gpu File={}/nvidia[0-{}]\n",
                    n.name,
                    n.gpu_dir.display(),
                    opts.gpus_per_node - 1
                )
            }))
            .collect();
        std::fs::write(d.join("gres.conf"), gres).expect("gres.conf");
        if opts.proctrack == Proctrack::Cgroup {
            std::fs::write(
                d.join("cgroup.conf"),
                "CgroupPlugin=autodetect\nCgroupMountpoint=/sys/fs/cgroup\n",
            )
            .expect("cgroup.conf");
        }
        let key: Vec<u8> = (0..1024).map(|_| rand::random::<u8>()).collect();
        let key_path = d.join("munge/munge.key");
        std::fs::write(&key_path, key).expect("munge.key");
        set_mode(&key_path, 0o600);

        let t0 = Instant::now();
        let mut cluster = SlurmCluster {
            conf,
            nodes,
            proctrack: opts.proctrack,
            startup: Duration::ZERO,
            munged: None,
            slurmctld: None,
            _ports: ports,
            dir,
        };
        cluster.munged = Some(cluster.daemon(
            "munged",
            &[
                "-F",
                "--force",
                &format!("--socket={}", cluster.munge_socket().display()),
                &format!("--key-file={}", key_path.display()),
                &format!("--pid-file={}/munge/munged.pid", d.display()),
                &format!("--seed-file={}/munge/seed", d.display()),
                &format!("--log-file={}/munge/munged.log", d.display()),
            ],
            "munged.out",
        ));
        cluster.wait_for("munged's socket", Duration::from_secs(20), |c| {
            c.munge_socket().exists()
        });
        cluster.slurmctld = Some(cluster.daemon("slurmctld", &["-D"], "slurmctld.out"));
        for i in 0..cluster.nodes.len() {
            cluster.start_slurmd(i);
        }
        cluster.wait_for("every node idle", Duration::from_secs(60), |c| {
            c.try_run(&["sinfo", "--noheader", "--Node", "--format=%N %T"])
                .is_some_and(|out| {
                    let idle = out.lines().filter(|l| l.ends_with(" idle")).count();
                    idle == c.nodes.len()
                })
        });
        cluster.startup = t0.elapsed();
        cluster
    }

    pub fn munge_socket(&self) -> PathBuf {
        self.dir.path().join("munge/munge.socket")
    }

    /// `SLURM_CONF=...`, what every client command of this cluster needs.
    pub fn env(&self) -> (&'static str, String) {
        ("SLURM_CONF", self.conf.display().to_string())
    }

    /// fleet's Slurm layer on this machine, pointed at this cluster.
    pub fn layer(&self) -> Slurm {
        let (k, v) = self.env();
        Slurm::new(Arc::new(LocalTransport::new("slurm"))).with_env(k, v)
    }

    /// A client command (`squeue`, `srun`, ...) of this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        let (k, v) = self.env();
        c.env(k, v).stdin(Stdio::null());
        c
    }

    /// Runs a client command and returns its stdout; panics with its stderr if it fails.
    pub fn run(&self, argv: &[&str]) -> String {
        let out = self
            .command(argv[0])
            .args(&argv[1..])
            .output()
            .expect(argv[0]);
        assert!(
            out.status.success(),
            "{argv:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn try_run(&self, argv: &[&str]) -> Option<String> {
        let out = self.command(argv[0]).args(&argv[1..]).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The node as `scontrol show node` reports its state (`IDLE`, `DOWN+NOT_RESPONDING`).
    pub fn node_state(&self, i: usize) -> String {
        let out = self.run(&[
            "scontrol",
            "--oneliner",
            "show",
            "node",
            &self.nodes[i].name,
        ]);
        out.split_whitespace()
            .find_map(|w| w.strip_prefix("State="))
            .unwrap_or_default()
            .to_string()
    }

    /// Kills node `i` as a power loss would: slurmd, its step daemons and every task there, by
    /// pid (SIGKILL). slurmctld notices within SlurmdTimeout and marks it DOWN.
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].slurmd.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let log = self.slurmd_log(i);
        let name = self.nodes[i].name.clone();
        let conf = self.conf.display().to_string();
        self.kill_all_matching(|p| {
            p.holds(&log)
                || (p.env.get("SLURMD_NODENAME") == Some(&name)
                    && p.env.get("SLURM_CONF") == Some(&conf))
        });
    }

    /// Starts node `i`'s slurmd again (ReturnToService=2 puts a DOWN node back in service).
    pub fn restart_node(&mut self, i: usize) {
        assert!(self.nodes[i].slurmd.is_none(), "node {i} is running");
        self.start_slurmd(i);
    }

    fn start_slurmd(&mut self, i: usize) {
        let name = self.nodes[i].name.clone();
        let child = self.daemon(
            "slurmd",
            &["-D", "-N", &name],
            &format!("slurmd-{name}.out"),
        );
        self.nodes[i].slurmd = Some(child);
    }

    fn slurmd_log(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("slurmd-{}.log", self.nodes[i].name))
    }

    fn daemon(&self, program: &str, args: &[&str], out: &str) -> Child {
        let log = std::fs::File::create(self.dir.path().join(out)).expect("daemon log");
        let (k, v) = self.env();
        Command::new(program)
            .args(args)
            .env(k, v)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"))
    }

    /// Every process of this cluster that it did not start itself: step daemons (they hold a
    /// log of the cluster open), job tasks and whatever left their steps, and srun clients
    /// (SLURM_CONF of this cluster in their environment).
    pub fn processes(&self) -> Vec<Proc> {
        let own: Vec<u32> = self.daemon_pids();
        let conf = self.conf.display().to_string();
        let dir = self.dir.path().to_path_buf();
        scan()
            .into_iter()
            .filter(|p| !own.contains(&p.pid))
            .filter(|p| p.env.get("SLURM_CONF") == Some(&conf) || p.holds_under(&dir))
            .collect()
    }

    /// The processes of jobs: those with SLURM_JOB_ID (tasks, and what they started).
    pub fn job_processes(&self) -> Vec<Proc> {
        self.processes()
            .into_iter()
            .filter(|p| p.env.contains_key("SLURM_JOB_ID"))
            .collect()
    }

    fn daemon_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .nodes
            .iter()
            .filter_map(|n| n.slurmd.as_ref().map(Child::id))
            .collect();
        pids.extend(self.slurmctld.as_ref().map(Child::id));
        pids.extend(self.munged.as_ref().map(Child::id));
        // slurmctld's helper (slurmscriptd) is its child and holds its log.
        if let Some(ctl) = &self.slurmctld {
            pids.extend(super::sshd::children_of(ctl.id()));
        }
        pids
    }

    /// SIGKILLs every process `matches` picks until none is left (a dying step daemon may
    /// still fork).
    fn kill_all_matching(&self, matches: impl Fn(&Proc) -> bool) {
        let me = std::process::id();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pids: Vec<u32> = scan()
                .into_iter()
                .filter(|p| p.pid != me && matches(p))
                .map(|p| p.pid)
                .collect();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                // SAFETY: kill(2) on a pid just found to belong to this cluster.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many requests of type `rpc` (e.g. `REQUEST_JOB_STEP_CREATE`) slurmctld has
    /// answered, from `sdiag`: how a test knows that slurmctld has seen a request.
    pub fn rpc_count(&self, rpc: &str) -> u64 {
        self.run(&["sdiag"])
            .lines()
            .find(|l| l.split_whitespace().next() == Some(rpc))
            .and_then(|l| l.split_once("count:"))
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Polls `ready` every 20 ms until it holds; panics with the cluster's logs after `limit`.
    pub fn wait_for(&self, what: &str, limit: Duration, mut ready: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            assert!(
                Instant::now() < deadline,
                "Slurm test cluster: no {what} within {limit:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemons' logs, for assertion messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log" || e == "out"))
            .collect();
        files.push(self.dir.path().join("munge/munged.log"));
        files.sort();
        for f in files {
            let body = std::fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = body.lines().rev().take(30).collect();
            text.push_str(&format!("== {}\n", f.display()));
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// Cancels every job, stops the daemons and kills whatever of the cluster is left; what
    /// dropping it does, callable first to check that nothing is left.
    pub fn stop(&mut self) {
        if self.slurmctld.is_some() {
            let jobs = self
                .try_run(&["squeue", "--noheader", "--format=%i"])
                .unwrap_or_default();
            let ids: Vec<&str> = jobs.split_whitespace().collect();
            if !ids.is_empty() {
                let mut scancel = vec!["scancel"];
                scancel.extend(ids);
                let _ = self.try_run(&scancel);
                let deadline = Instant::now() + Duration::from_secs(20);
                while self
                    .try_run(&["squeue", "--noheader", "--format=%i"])
                    .is_some_and(|o| !o.trim().is_empty())
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        let daemons = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.slurmd.take())
            .chain(self.slurmctld.take());
        for child in daemons {
            terminate(child);
        }
        let conf = self.conf.display().to_string();
        let dir = self.dir.path().to_path_buf();
        let munged = self.munged.as_ref().map(Child::id);
        self.kill_all_matching(|p| {
            Some(p.pid) != munged && (p.env.get("SLURM_CONF") == Some(&conf) || p.holds_under(&dir))
        });
        if let Some(child) = self.munged.take() {
            terminate(child);
        }
        if self.proctrack == Proctrack::Cgroup {
            for node in &self.nodes {
                remove_cgroups(&node.name);
            }
        }
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn slurm_conf(d: &Path, ctl_port: u16, nodes: &[SlurmNode], opts: &Options) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_string();
    let d = d.display();
    let proctrack = match opts.proctrack {
        Proctrack::Linuxproc => "linuxproc",
        Proctrack::Cgroup => "cgroup",
    };
    let mut conf = format!(
        "ClusterName=fleettest\n\
         SlurmctldHost={host}(127.0.0.1)\n\
         SlurmctldPort={ctl_port}\n\
         AuthType=auth/munge\n\
         AuthInfo=socket={d}/munge/munge.socket\n\
         CredType=cred/munge\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         StateSaveLocation={d}/state\n\
         SlurmdSpoolDir={d}/spool/%n\n\
         SlurmctldPidFile={d}/slurmctld.pid\n\
         SlurmdPidFile={d}/spool/slurmd-%n.pid\n\
         SlurmctldLogFile={d}/slurmctld.log\n\
         SlurmdLogFile={d}/slurmd-%n.log\n\
         ProctrackType=proctrack/{proctrack}\n\
         TaskPlugin=task/none\n\
         GresTypes=gpu\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_CPU\n\
         SchedulerType=sched/backfill\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         JobCompType=jobcomp/none\n\
         MpiDefault=none\n\
         ReturnToService=2\n\
         SlurmdParameters=config_overrides\n\
         SlurmdTimeout=10\n\
         KillWait=2\n"
    );
    for n in nodes {
        conf.push_str(&format!(
            "NodeName={} NodeHostname={host} NodeAddr={} Port={} CPUs={} Gres=gpu:{} State=UNKNOWN\n",
            n.name, n.addr, n.port, opts.cpus_per_node, opts.gpus_per_node
        ));
    }
    conf.push_str(&format!(
        "PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
    ));
    conf
}

/// `nvidia0..` as character devices 195:N, as the NVIDIA driver makes them: Slurm's gres.conf
/// refuses plain files.
fn make_gpus(dir: &Path, n: u32) {
    use std::os::unix::ffi::OsStrExt;
    std::fs::create_dir_all(dir).expect("gpu dir");
    for i in 0..n {
        let path = dir.join(format!("nvidia{i}"));
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path");
        // SAFETY: mknod(2) with a valid NUL-terminated path, as root.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, i)) };
        assert_eq!(
            rc,
            0,
            "mknod {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// SIGTERM, then SIGKILL if it has not exited within 10 s.
fn terminate(mut child: Child) {
    // SAFETY: kill(2) on a child this harness started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Removes the cgroups slurmd made for `node` (`slurm_<node>` in each v1 hierarchy),
/// deepest first; they are empty once the node's processes are gone.
fn remove_cgroups(node: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let top = h.path().join(format!("slurm_{node}"));
        if top.is_dir() {
            let mut dirs = Vec::new();
            collect_dirs(&top, &mut dirs);
            for d in dirs.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&e.path(), out);
        }
    }
}

/// A process as /proc shows it.
#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: u32,
    pub cmdline: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Where its open file descriptors point.
    pub files: Vec<PathBuf>,
}

impl Proc {
    /// The program's file name (slurmstepd runs tasks by their full path).
    pub fn program(&self) -> &str {
        let first = self.cmdline.first().map_or("", String::as_str);
        first.rsplit('/').next().unwrap_or(first)
    }

    fn holds(&self, path: &Path) -> bool {
        self.files.iter().any(|f| f == path)
    }

    fn holds_under(&self, dir: &Path) -> bool {
        self.files.iter().any(|f| f.starts_with(dir))
    }
}

/// Every live process this user may read (zombies have no environment and no files).
pub fn scan() -> Vec<Proc> {
    let mut procs = Vec::new();
    for (pid, base) in super::proc_entries() {
        let split = |bytes: Vec<u8>| -> Vec<String> {
            bytes
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        };
        let env = split(std::fs::read(base.join("environ")).unwrap_or_default())
            .into_iter()
            .filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        let files = std::fs::read_dir(base.join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .collect();
        procs.push(Proc {
            pid,
            cmdline: split(std::fs::read(base.join("cmdline")).unwrap_or_default()),
            env,
            files,
        });
    }
    procs
}

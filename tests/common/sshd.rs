//! A real OpenSSH `sshd` for the tests: its own temporary host key and authorized client key,
//! the fixture `bin/` first on its sessions' PATH, and a private directory per container for
//! the fake `pct`. It can run inside a network namespace the test made, and be hurt the ways the
//! field hurts hosts: a session's process killed, the server stopped and started again on the
//! same port with the same host key, or taken away for good.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet::config::{GpuSelection, MachineSpec, SshTarget};
use tempfile::TempDir;

use super::{
    Ports, TestHome, current_user, fingerprint, fixtures_bin, keygen, public_key, reserve_ports,
};

pub const SSHD: &str = "/usr/sbin/sshd";

/// A running sshd, killed (with the sessions it serves) when dropped.
pub struct Sshd {
    pub dir: TempDir,
    pub port: u16,
    /// The address it listens on (127.0.0.1, or an address inside its network namespace).
    pub listen: String,
    /// Private host key (its `.pub` sits next to it).
    pub host_key: PathBuf,
    /// Private client key whose public half is the only authorized key.
    pub client_key: PathBuf,
    pub user: String,
    /// The network namespace it runs in, if not this one.
    pub netns: Option<String>,
    child: Option<Child>,
    /// The port stays this sshd's for its whole life: it is stopped and restarted on it.
    _port: Ports,
}

impl Sshd {
    pub fn start() -> Self {
        Self::start_with_env(&[])
    }

    /// Starts sshd with extra variables for every session (e.g. `FAKE_PCT_RUNNING`). Values
    /// must not contain spaces (sshd_config splits on them).
    pub fn start_with_env(env: &[(&str, &str)]) -> Self {
        Self::start_in(None, "127.0.0.1", env)
    }

    /// Starts sshd inside network namespace `netns` (made by the test), listening on `listen`.
    pub fn start_in(netns: Option<&str>, listen: &str, env: &[(&str, &str)]) -> Self {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: the integration tests need OpenSSH's server \
             (apt-get install openssh-server); see the README's test command"
        );
        // sshd refuses to start without its privilege separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let dir = tempfile::tempdir().expect("temp dir");
        let host_key = keygen(dir.path(), "host_ed25519");
        let client_key = keygen(dir.path(), "client_ed25519");
        std::fs::write(
            dir.path().join("authorized_keys"),
            public_key(&client_key) + "\n",
        )
        .expect("authorized_keys");
        // A fresh HOME for sessions: the login user's own dotfiles (bash sources ~/.bashrc for
        // every SSH command) must not slow down or change what the tests run.
        let remote_home = dir.path().join("remote-home");
        std::fs::create_dir_all(&remote_home).expect("remote HOME");
        let containers = dir.path().join("containers");
        std::fs::create_dir_all(&containers).expect("containers dir");
        let mut set_env = format!(
            "HOME={} FAKE_PCT_ROOT={} FAKE_PCT_SHARED={} PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            remote_home.display(),
            containers.display(),
            super::shared_into_containers(),
            fixtures_bin().display()
        );
        for (k, v) in env {
            assert!(
                !v.contains(char::is_whitespace),
                "sshd SetEnv value {v:?} must not contain spaces"
            );
            set_env.push_str(&format!(" {k}={v}"));
        }
        let reserved = reserve_ports(1);
        let port = reserved.base;
        let d = dir.path().display();
        let config = format!(
            "ListenAddress {listen}:{port}\n\
             HostKey {d}/host_ed25519\n\
             PidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\n\
             StrictModes no\n\
             UsePAM no\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\n\
             PermitRootLogin prohibit-password\n\
             AllowTcpForwarding yes\n\
             SetEnv {set_env}\n\
             LogLevel VERBOSE\n"
        );
        std::fs::write(dir.path().join("sshd_config"), config).expect("sshd_config");
        let mut sshd = Sshd {
            dir,
            port,
            listen: listen.to_string(),
            host_key,
            client_key,
            user: current_user(),
            netns: netns.map(String::from),
            child: None,
            _port: reserved,
        };
        sshd.spawn();
        sshd
    }

    /// Starts the listener with the config written at start, and waits until it listens.
    fn spawn(&mut self) {
        let log_path = self.dir.path().join("sshd.log");
        let listening_before = self.log().matches("Server listening on").count();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("sshd.log");
        let mut cmd = match &self.netns {
            Some(ns) => {
                // `ip netns exec` execs sshd in place: the child is sshd itself.
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, SSHD]);
                c
            }
            None => Command::new(SSHD),
        };
        let child = cmd
            .args(["-D", "-e", "-f"])
            .arg(self.dir.path().join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start sshd");
        self.child = Some(child);
        // It logs once it listens: that works inside a namespace this process cannot reach.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.log().matches("Server listening on").count() <= listening_before {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("sshd exited ({status}) at start:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "sshd did not listen on {}:{} within 10 s:\n{}",
                self.listen,
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether it runs (it was not stopped, or was restarted since).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The listener's pid (what every session process is forked from).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("sshd is running").id()
    }

    /// The processes serving connections now: the children of the listener, found by their
    /// parent pid in /proc, never by name.
    pub fn session_pids(&self) -> Vec<u32> {
        let Some(child) = &self.child else {
            return Vec::new();
        };
        children_of(child.id())
    }

    /// Kills (SIGKILL) every process serving a connection, as a crash or an OOM kill would;
    /// the listener stays. Returns how many it killed.
    pub fn kill_sessions(&self) -> usize {
        let pids = self.session_pids();
        for pid in &pids {
            signal(*pid, libc::SIGKILL);
        }
        pids.len()
    }

    /// Sends `sig` to every process serving a connection (e.g. SIGSTOP: a host that hangs).
    pub fn signal_sessions(&self, sig: i32) -> usize {
        let pids = self.session_pids();
        for pid in &pids {
            signal(*pid, sig);
        }
        pids.len()
    }

    /// Stops the server and its sessions: the host is gone (for good unless [`Sshd::restart`]).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let sessions = children_of(child.id());
        // The listener first, so no new session starts while the old ones are killed.
        let _ = child.kill();
        let _ = child.wait();
        for pid in sessions {
            signal(pid, libc::SIGKILL);
        }
    }

    /// Starts it again on the same address and port with the same host key, as a host back
    /// from a reboot.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart a stopped sshd");
        self.spawn();
    }

    /// Adds `key` (a private key path) to the authorized keys; sshd reads them at each login.
    pub fn authorize(&self, key: &Path) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("authorized_keys"))
            .expect("open authorized_keys");
        writeln!(f, "{}", public_key(key)).expect("append authorized key");
    }

    /// What sshd logged so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// The directory the fake `pct` mounts over `/tmp` inside container `ct` of this host.
    pub fn container_tmp(&self, ct: u32) -> PathBuf {
        self.dir
            .path()
            .join("containers")
            .join(ct.to_string())
            .join("tmp")
    }

    /// Where `path` (absolute, under `/tmp`, as seen inside container `ct`) is seen from here.
    pub fn container_path(&self, ct: u32, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        let rest = path
            .strip_prefix("/tmp")
            .unwrap_or_else(|_| panic!("{} is not under the container's /tmp", path.display()));
        self.container_tmp(ct).join(rest)
    }

    /// The known_hosts line for this server, as OpenSSH writes it for a non-22 port.
    pub fn known_hosts_line(&self) -> String {
        format!(
            "[{}]:{} {}",
            self.listen,
            self.port,
            public_key(&self.host_key)
        )
    }

    pub fn host_fingerprint(&self) -> String {
        fingerprint(&self.host_key)
    }

    /// A known_hosts file in the sshd's temp dir holding `lines`.
    pub fn known_hosts_file(&self, name: &str, lines: &[String]) -> PathBuf {
        let path = self.dir.path().join(name);
        let mut text = lines.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        std::fs::write(&path, text).expect("write known_hosts");
        path
    }

    /// An inventory host for library tests, with every SSH setting in `ssh_options`, so the
    /// process's own HOME plays no part.
    pub fn host_spec(&self, name: &str, container: Option<u32>, known_hosts: &Path) -> MachineSpec {
        self.host_spec_with_key(name, container, known_hosts, &self.client_key)
    }

    pub fn host_spec_with_key(
        &self,
        name: &str,
        container: Option<u32>,
        known_hosts: &Path,
        key: &Path,
    ) -> MachineSpec {
        MachineSpec {
            name: name.to_string(),
            ssh: Some(SshTarget {
                user: Some(self.user.clone()),
                host: self.listen.clone(),
                port: Some(self.port),
            }),
            container,
            gpus: GpuSelection::All,
            address: container.map(|_| "127.0.0.1".to_string()),
            ssh_options: BTreeMap::from([
                ("IdentityFile".to_string(), key.display().to_string()),
                (
                    "UserKnownHostsFile".to_string(),
                    known_hosts.display().to_string(),
                ),
            ]),
        }
    }

    /// The `~/.ssh/config` block that names this server `alias`, logging in with `key`.
    pub fn config_block(&self, alias: &str, key: &str) -> String {
        format!(
            "Host {alias}\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {key}\n",
            self.listen, self.port, self.user
        )
    }

    /// A temporary HOME for the `fleet` binary: `~/.ssh/config` maps `alias` to this sshd
    /// with the client key, and `~/.ssh/known_hosts` trusts its host key.
    pub fn home(&self, alias: &str) -> TestHome {
        let home = TestHome::empty();
        home.add_key(&self.client_key, "fleet_test_key");
        home.append_config(&self.config_block(alias, "~/.ssh/fleet_test_key"));
        home.trust(&self.known_hosts_line());
        home
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid this harness found as a child of its own sshd.
    unsafe { libc::kill(pid as i32, sig) };
}

/// Processes whose parent is `parent`, from /proc/PID/stat (field 4, after the name).
pub fn children_of(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for (pid, dir) in super::proc_entries() {
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let ppid = after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            pids.push(pid);
        }
    }
    pids
}

//! Shared integration-test harness: a real OpenSSH `sshd` on 127.0.0.1 (temporary host key,
//! authorized client key, fixture `bin/` first on the SSH side's PATH), a temporary HOME with
//! `~/.ssh/config`, key and known_hosts for the `fleet` binary, and inventory hosts for library
//! tests. Use it with `mod common;`. [`local_fleet`] runs the binary on a local simulated fleet,
//! [`generate`] serves SGLang stand-ins and reads `generate` output.
#![allow(dead_code)] // each test crate uses a different part of it

#[path = "../generate_common/mod.rs"]
pub mod generate;
pub mod local_fleet;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet::config::{GpuSelection, HostSpec, SshTarget};
use tempfile::TempDir;

pub const SSHD: &str = "/usr/sbin/sshd";

/// `tests/fixtures/bin`: fake `pct`, `nvidia-smi`, ... put first on the SSH side's PATH.
pub fn fixtures_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bin")
}

/// A file name unique to this test process and call, for marker files in /tmp.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Generates an ed25519 key pair without passphrase; returns the private key path.
pub fn keygen(dir: &Path, name: &str) -> PathBuf {
    keygen_typed(dir, name, "ed25519")
}

/// Generates a key pair of `kind` (`ed25519`, `rsa`, `ecdsa`) without passphrase.
pub fn keygen_typed(dir: &Path, name: &str, kind: &str) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", "", "-C", name, "-f"])
        .arg(&path)
        .stdin(Stdio::null())
        .status()
        .expect("ssh-keygen not found: install openssh-client (apt-get install openssh-client)");
    assert!(status.success(), "ssh-keygen failed for {}", path.display());
    path
}

/// The public half of a key made by [`keygen`], as `type base64` (comment dropped).
pub fn public_key(private: &Path) -> String {
    let text = std::fs::read_to_string(private.with_extension("pub")).expect("read public key");
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `SHA256:...` as `ssh-keygen -l` prints it.
pub fn fingerprint(private: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(private.with_extension("pub"))
        .output()
        .expect("ssh-keygen -l");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .nth(1)
        .expect("fingerprint in ssh-keygen -l output")
        .to_string()
}

/// The user the tests run as, who is also the SSH login.
pub fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().expect("id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Where [`free_port_base`] looks: below Linux's ephemeral range (32768+), so no outgoing
/// connection takes a port meanwhile; above tests/launch.rs's fixed ports (24000-25999); below
/// the ports `fleet demo` picks (31000+).
const PORTS: std::ops::Range<u16> = 26_000..31_000;

/// A base port with `n` free ports after it. Tests of one binary pick at the same moment,
/// before any server binds, so a range handed out is never handed out again by this process;
/// each process starts at its own place so test binaries run at once rarely probe the same
/// ports.
pub fn free_port_base(n: u16) -> u16 {
    static NEXT: std::sync::Mutex<Option<u16>> = std::sync::Mutex::new(None);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let span = PORTS.end - PORTS.start;
    let mut base = next.unwrap_or(PORTS.start + (std::process::id() % 50) as u16 * (span / 50));
    for _ in 0..span {
        if base + n > PORTS.end {
            base = PORTS.start;
        }
        if (base..base + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            *next = Some(base + n);
            return base;
        }
        base += 1;
    }
    panic!("no {n} free local ports in {PORTS:?}");
}

/// A running sshd, killed when dropped.
pub struct Sshd {
    pub dir: TempDir,
    pub port: u16,
    /// Private host key (its `.pub` sits next to it).
    pub host_key: PathBuf,
    /// Private client key whose public half is the only authorized key.
    pub client_key: PathBuf,
    pub user: String,
    child: Child,
}

impl Sshd {
    pub fn start() -> Self {
        Self::start_with_env(&[])
    }

    /// Starts sshd with extra variables for every session (e.g. `FAKE_PCT_RUNNING`). Values
    /// must not contain spaces (sshd_config splits on them).
    pub fn start_with_env(env: &[(&str, &str)]) -> Self {
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
        let mut set_env = format!(
            "HOME={} PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            remote_home.display(),
            fixtures_bin().display()
        );
        for (k, v) in env {
            assert!(
                !v.contains(char::is_whitespace),
                "sshd SetEnv value {v:?} must not contain spaces"
            );
            set_env.push_str(&format!(" {k}={v}"));
        }
        let port = free_port_base(1);
        let d = dir.path().display();
        let config = format!(
            "ListenAddress 127.0.0.1:{port}\n\
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
        let config_path = dir.path().join("sshd_config");
        std::fs::write(&config_path, config).expect("sshd_config");
        let log = std::fs::File::create(dir.path().join("sshd.log")).expect("sshd.log");
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start sshd");
        let mut sshd = Sshd {
            dir,
            port,
            host_key,
            client_key,
            user: current_user(),
            child,
        };
        sshd.wait_ready();
        sshd
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sshd exited ({status}) at start:\n{}", self.log());
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut banner = [0u8; 7];
                if s.read_exact(&mut banner).is_ok() && &banner == b"SSH-2.0" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "sshd did not answer on port {} within 10 s:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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

    /// The known_hosts line for this server, as OpenSSH writes it for a non-22 port.
    pub fn known_hosts_line(&self) -> String {
        format!("[127.0.0.1]:{} {}", self.port, public_key(&self.host_key))
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
    pub fn host_spec(&self, name: &str, container: Option<u32>, known_hosts: &Path) -> HostSpec {
        self.host_spec_with_key(name, container, known_hosts, &self.client_key)
    }

    pub fn host_spec_with_key(
        &self,
        name: &str,
        container: Option<u32>,
        known_hosts: &Path,
        key: &Path,
    ) -> HostSpec {
        HostSpec {
            name: name.to_string(),
            ssh: Some(SshTarget {
                user: Some(self.user.clone()),
                host: "127.0.0.1".into(),
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

    /// A temporary HOME for the `fleet` binary: `~/.ssh/config` maps `alias` to this sshd
    /// with the client key, and `~/.ssh/known_hosts` trusts its host key.
    pub fn home(&self, alias: &str) -> TestHome {
        let dir = tempfile::tempdir().expect("temp HOME");
        let ssh = dir.path().join(".ssh");
        std::fs::create_dir_all(&ssh).expect("~/.ssh");
        std::fs::copy(&self.client_key, ssh.join("fleet_test_key")).expect("copy client key");
        std::fs::write(
            ssh.join("config"),
            format!(
                "Host {alias}\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile ~/.ssh/fleet_test_key\n",
                self.port, self.user
            ),
        )
        .expect("~/.ssh/config");
        std::fs::write(ssh.join("known_hosts"), self.known_hosts_line() + "\n")
            .expect("~/.ssh/known_hosts");
        TestHome { dir }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // Our own child, by its handle: only the listener, sessions end with their clients.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary HOME directory for the `fleet` binary.
pub struct TestHome {
    pub dir: TempDir,
}

impl TestHome {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn known_hosts(&self) -> PathBuf {
        self.dir.path().join(".ssh/known_hosts")
    }

    /// Writes `fleet.yaml` into this HOME and returns its path.
    pub fn write_inventory(&self, yaml: &str) -> PathBuf {
        let path = self.dir.path().join("fleet.yaml");
        std::fs::write(&path, yaml).expect("write fleet.yaml");
        path
    }

    /// The `fleet` binary with HOME here, run from here, with no ssh-agent.
    pub fn fleet(&self) -> assert_cmd::Command {
        let mut cmd = assert_cmd::Command::cargo_bin("fleet").expect("fleet binary");
        cmd.env("HOME", self.path())
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("FLEET_CONFIG")
            .env_remove("FLEET_LOG")
            .current_dir(self.path());
        cmd
    }
}

/// A private `ssh-agent` holding the given keys, killed when dropped.
pub struct Agent {
    pub sock: PathBuf,
    _dir: TempDir,
    child: Child,
}

impl Agent {
    pub fn start(keys: &[&Path]) -> Self {
        let dir = tempfile::tempdir().expect("agent dir");
        let sock = dir.path().join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("ssh-agent (apt-get install openssh-client)");
        let mut agent = Agent {
            sock,
            _dir: dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !agent.sock.exists() {
            if let Ok(Some(status)) = agent.child.try_wait() {
                panic!("ssh-agent exited at start ({status})");
            }
            assert!(
                Instant::now() < deadline,
                "ssh-agent did not create its socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        for key in keys {
            let status = Command::new("ssh-add")
                .arg("-q")
                .arg(key)
                .env("SSH_AUTH_SOCK", &agent.sock)
                .stdin(Stdio::null())
                .status()
                .expect("ssh-add");
            assert!(status.success(), "ssh-add {} failed", key.display());
        }
        agent
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

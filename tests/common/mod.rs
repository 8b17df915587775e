//! Shared integration-test harness. [`sshd`]: a real OpenSSH `sshd` (temporary host key,
//! authorized client key, fixture `bin/` first on the SSH side's PATH, a private `/tmp` per
//! container for the fake `pct`) that tests can kill, stop and restart. [`world`]: several such
//! hosts at once. [`netns`]: hosts reachable only through jump hosts, in network namespaces the
//! test makes. Here: a temporary HOME with `~/.ssh/config`, keys and known_hosts for the `fleet`
//! binary, keys, ports and ssh-agent. Use it with `mod common;`. [`local_fleet`] runs the binary
//! on a local simulated fleet, [`generate`] serves SGLang stand-ins and reads `generate` output,
//! [`watch`] waits on what a child says on stderr. [`slurm`]: a real Slurm cluster (slurmctld
//! and several slurmd on this machine, fake GPUs), [`slurm_fleet`] the binary beside one.
//! [`chromium`]: headless Chromium for pages.
#![allow(dead_code)] // each test crate uses a different part of it

pub mod chromium;
#[path = "../generate_common/mod.rs"]
pub mod generate;
pub mod local_fleet;
pub mod netns;
pub mod real;
pub mod slurm;
pub mod slurm_fleet;
pub mod smg;
pub mod sshd;
pub mod watch;
pub mod world;

pub use sshd::Sshd;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// `tests/fixtures/bin`: fake `pct`, `nvidia-smi`, ... put first on the SSH side's PATH.
pub fn fixtures_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bin")
}

/// The host paths a container sees at the same place (as a Proxmox mount point `mpN` binds a
/// host directory in): this checkout, holding the fakes, and the built binaries, such as the
/// sim a profile launches. Only what lies under /tmp needs it, since a container's /tmp is its
/// own; a checkout elsewhere is seen anyway. Colon separated, no path inside another.
pub fn shared_into_containers() -> String {
    let bins = Path::new(env!("CARGO_BIN_EXE_fleet"))
        .parent()
        .expect("the binaries' directory")
        .to_path_buf();
    let mut paths = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")), bins];
    paths.sort();
    paths.dedup_by(|inner, outer| inner.starts_with(&*outer));
    let shared: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shared.join(":")
}

/// Every process now: its pid and its `/proc/PID` directory.
pub fn proc_entries() -> impl Iterator<Item = (u32, PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
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

/// Where [`reserve_ports`] looks: below Linux's ephemeral range (32768+), so no outgoing
/// connection takes a port meanwhile, and below the ports `fleet demo` picks (31000+).
const PORTS: std::ops::Range<u16> = 24_000..31_000;

/// `n` consecutive local ports reserved for one test, until dropped. The reservation holds
/// across processes (cargo-nextest runs each test in a process of its own, `cargo test` several
/// test binaries' threads): each port is an exclusive `flock` on a file of its own under
/// `$TMPDIR/fleet-test-ports`, which the kernel releases when the guard's files close, also
/// when the process dies.
#[derive(Debug)]
pub struct Ports {
    pub base: u16,
    pub n: u16,
    _locks: Vec<std::fs::File>,
}

impl Ports {
    /// `base..base + n`.
    pub fn range(&self) -> std::ops::Range<u16> {
        self.base..self.base + self.n
    }
}

/// Reserves `n` free consecutive ports (see [`Ports`]). A process never hands out a port twice:
/// a server of an earlier test may still be closing its listener.
pub fn reserve_ports(n: u16) -> Ports {
    static HANDED: std::sync::Mutex<Option<(u16, std::collections::BTreeSet<u16>)>> =
        std::sync::Mutex::new(None);
    let dir = std::env::temp_dir().join("fleet-test-ports");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut handed = HANDED.lock().unwrap_or_else(|e| e.into_inner());
    let span = PORTS.end - PORTS.start;
    // Each process starts at its own place, so processes starting at once rarely contend.
    let (next, used) = handed.get_or_insert_with(|| {
        (
            PORTS.start + (std::process::id() % 64) as u16 * (span / 64),
            Default::default(),
        )
    });
    let mut base = *next;
    for _ in 0..span {
        if base + n > PORTS.end {
            base = PORTS.start;
        }
        let range = base..base + n;
        if !range.clone().any(|p| used.contains(&p))
            && let Some(locks) = lock_all(&dir, range.clone())
            && range
                .clone()
                .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        {
            used.extend(range);
            *next = base + n;
            return Ports {
                base,
                n,
                _locks: locks,
            };
        }
        base += 1;
    }
    panic!("no {n} free local ports in {PORTS:?}");
}

/// An exclusive lock on each port's file, or `None` (and nothing held) when another process
/// holds one of them.
fn lock_all(dir: &Path, ports: std::ops::Range<u16>) -> Option<Vec<std::fs::File>> {
    use std::os::fd::AsRawFd;
    let mut locks = Vec::new();
    for port in ports {
        let path = dir.join(port.to_string());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // SAFETY: flock(2) on a descriptor this function owns, with valid flags.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return None;
        }
        locks.push(file);
    }
    Some(locks)
}

/// [`reserve_ports`] for the rest of this process: the base of `n` free consecutive ports.
pub fn free_port_base(n: u16) -> u16 {
    static KEPT: std::sync::Mutex<Vec<Ports>> = std::sync::Mutex::new(Vec::new());
    let ports = reserve_ports(n);
    let base = ports.base;
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(ports);
    base
}

/// A temporary HOME directory for the `fleet` binary.
pub struct TestHome {
    pub dir: TempDir,
}

impl TestHome {
    /// A HOME with an empty `~/.ssh`.
    pub fn empty() -> Self {
        let dir = tempfile::tempdir().expect("temp HOME");
        std::fs::create_dir_all(dir.path().join(".ssh")).expect("~/.ssh");
        TestHome { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Copies private key `key` (and its `.pub`) to `~/.ssh/name`.
    pub fn add_key(&self, key: &Path, name: &str) {
        let ssh = self.dir.path().join(".ssh");
        std::fs::copy(key, ssh.join(name)).expect("copy client key");
        let public = PathBuf::from(format!("{}.pub", key.display()));
        if public.exists() {
            std::fs::copy(public, ssh.join(format!("{name}.pub"))).expect("copy public key");
        }
    }

    /// Appends `text` to `~/.ssh/config`.
    pub fn append_config(&self, text: &str) {
        append(&self.dir.path().join(".ssh/config"), text);
    }

    /// Appends a line to `~/.ssh/known_hosts`.
    pub fn trust(&self, known_hosts_line: &str) {
        append(&self.known_hosts(), &format!("{known_hosts_line}\n"));
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

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
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

/// `GET path` on `addr` (`host:port`), the body as JSON: HTTP/1.0, so the server closes when
/// done and no client library is needed.
pub fn get_json(addr: &str, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

//! The `ssh` transport: one russh connection per host, with exec and direct-tcpip channels
//! multiplexed over it. Host keys are checked against known_hosts (OpenSSH's accept-new at
//! most); authentication tries ssh-agent, then identity files.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use russh::client::{self, AuthResult, Handle};
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use russh::{ChannelMsg, ChannelOpenFailure, Disconnect};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::ssh_config::{self, Resolved};
use super::{CommandOutput, ConnectOptions, RemoteError, Transport, Tunnel, mask, quote_argv};
use crate::config::{HostSpec, SshTarget};

/// OpenSSH's sshd allows 10 sessions per connection (MaxSessions); stay below it so that
/// forwarded ports and other clients' sessions still fit.
const MAX_CONCURRENT_EXECS: usize = 8;

/// Retries of a refused session open back off from 2 ms, doubling, until this (about 0.5 s).
const SESSION_RETRY_LIMIT: Duration = Duration::from_millis(300);

/// Also answers a dead connection within a minute instead of at the next TCP timeout.
const KEEPALIVE: Duration = Duration::from_secs(15);

pub struct SshTransport {
    host: String,
    /// `user@name` with name as known_hosts spells it, for messages and logs.
    target: String,
    handle: Arc<Handle<Client>>,
    execs: Semaphore,
}

impl fmt::Debug for SshTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshTransport")
            .field("host", &self.host)
            .field("target", &self.target)
            .finish()
    }
}

static KNOWN_HOSTS_LOCK: Mutex<()> = Mutex::new(());

/// What the host key check concluded when it refused a key; read after the handshake fails.
#[derive(Debug)]
enum KeyVerdict {
    Unknown { fingerprint: String },
    Changed { fingerprint: String, line: usize },
    Unreadable(String),
}

struct Client {
    hostname: String,
    port: u16,
    known_hosts: PathBuf,
    accept_new: bool,
    verdict: Arc<Mutex<Option<KeyVerdict>>>,
}

impl Client {
    fn check(&self, key: &PublicKey) -> Result<bool, KeyVerdict> {
        // Hosts of one inventory often share a Proxmox host and connect at once: read and
        // record under one lock so a new key is written once.
        let _known_hosts = KNOWN_HOSTS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let known = russh::keys::known_hosts::known_host_keys_path(
            &self.hostname,
            self.port,
            &self.known_hosts,
        )
        .map_err(|e| KeyVerdict::Unreadable(format!("{}: {e}", self.known_hosts.display())))?;
        if known.iter().any(|(_, k)| k.key_data() == key.key_data()) {
            return Ok(true);
        }
        // A host recorded under any key, even of another algorithm, is not "new": treating it so
        // would let an attacker who offers a different key type be accepted.
        if let Some((line, _)) = known
            .iter()
            .find(|(_, k)| k.algorithm() == key.algorithm())
            .or(known.first())
        {
            return Err(KeyVerdict::Changed {
                fingerprint,
                line: file_line(&self.known_hosts, *line),
            });
        }
        if !self.accept_new {
            return Err(KeyVerdict::Unknown { fingerprint });
        }
        russh::keys::known_hosts::learn_known_hosts_path(
            &self.hostname,
            self.port,
            key,
            &self.known_hosts,
        )
        .map_err(|e| {
            KeyVerdict::Unreadable(format!(
                "cannot record the key in {}: {e}",
                self.known_hosts.display()
            ))
        })?;
        tracing::warn!(
            "recorded the new host key of {} ({fingerprint}) in {}",
            ssh_config::known_hosts_name(&self.hostname, self.port),
            self.known_hosts.display()
        );
        Ok(true)
    }
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            // known_hosts lists plain keys; a certificate is trusted exactly as far as its key is.
            PublicKeyOrCertificate::Certificate(cert) => {
                PublicKey::new(cert.public_key().clone(), "")
            }
        };
        match self.check(&key) {
            Ok(trusted) => Ok(trusted),
            Err(verdict) => {
                *self.verdict.lock().unwrap_or_else(|e| e.into_inner()) = Some(verdict);
                Ok(false)
            }
        }
    }
}

/// russh numbers known_hosts entries without counting `#` comment lines; OpenSSH users expect
/// the line number in the file, as `ssh-keygen -R` and editors count.
fn file_line(path: &std::path::Path, entry: usize) -> usize {
    let Ok(text) = std::fs::read_to_string(path) else {
        return entry;
    };
    let mut seen = 0;
    for (i, line) in text.lines().enumerate() {
        if !line.starts_with('#') {
            seen += 1;
            if seen == entry {
                return i + 1;
            }
        }
    }
    entry
}

impl SshTransport {
    /// Connects, verifies the host key and authenticates, all within `opts.connect_timeout`.
    pub async fn connect(
        host: &HostSpec,
        target: &SshTarget,
        opts: &ConnectOptions,
    ) -> Result<Self, RemoteError> {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from);
        let resolved =
            ssh_config::resolve(target, &host.ssh_options, home.as_deref()).map_err(|message| {
                RemoteError::Config {
                    host: host.name.clone(),
                    message,
                }
            })?;
        let name = resolved.known_hosts_name();
        let target_label = format!("{}@{name}", resolved.user);
        tracing::debug!(host = %host.name, "ssh: connecting to {target_label}");
        let timeout = resolved.connect_timeout.unwrap_or(opts.connect_timeout);
        let handle = tokio::time::timeout(timeout, open(&host.name, &resolved, opts))
            .await
            .map_err(|_| RemoteError::Timeout {
                host: host.name.clone(),
                target: name.clone(),
                after: timeout,
            })??;
        Ok(SshTransport {
            host: host.name.clone(),
            target: target_label,
            handle: Arc::new(handle),
            execs: Semaphore::new(MAX_CONCURRENT_EXECS),
        })
    }

    /// sshd frees a session slot only when it garbage-collects the closed channel, which can be
    /// after it has already read our next open request; such a refusal is retried briefly.
    async fn open_session(&self) -> Result<russh::Channel<client::Msg>, RemoteError> {
        let mut delay = Duration::from_millis(2);
        loop {
            match self.handle.channel_open_session().await {
                Err(russh::Error::ChannelOpenFailure(
                    ChannelOpenFailure::ConnectFailed | ChannelOpenFailure::ResourceShortage,
                )) if delay < SESSION_RETRY_LIMIT => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                other => return other.map_err(|e| self.broken(e)),
            }
        }
    }

    fn broken(&self, e: russh::Error) -> RemoteError {
        RemoteError::Ssh {
            host: self.host.clone(),
            target: self.target.clone(),
            message: e.to_string(),
        }
    }
}

async fn open(
    host: &str,
    r: &Resolved,
    opts: &ConnectOptions,
) -> Result<Handle<Client>, RemoteError> {
    let name = r.known_hosts_name();
    let stream = TcpStream::connect((r.hostname.as_str(), r.port))
        .await
        .map_err(|source| RemoteError::Unreachable {
            host: host.to_string(),
            target: name.clone(),
            source,
        })?;
    // Small exec requests and replies: waiting for Nagle only adds latency.
    stream
        .set_nodelay(true)
        .map_err(|source| RemoteError::Unreachable {
            host: host.to_string(),
            target: name.clone(),
            source,
        })?;
    let verdict = Arc::new(Mutex::new(None));
    let handler = Client {
        hostname: r.hostname.clone(),
        port: r.port,
        known_hosts: r.known_hosts.clone(),
        accept_new: opts.accept_new_host_key,
        verdict: verdict.clone(),
    };
    let config = Arc::new(client::Config {
        keepalive_interval: Some(KEEPALIVE),
        nodelay: true,
        ..Default::default()
    });
    let handshake = client::connect_stream(config, stream, handler).await;
    let verdict = verdict.lock().unwrap_or_else(|e| e.into_inner()).take();
    let mut handle = match (handshake, verdict) {
        (Ok(handle), _) => handle,
        (Err(_), Some(KeyVerdict::Unknown { fingerprint })) => {
            return Err(RemoteError::UnknownHostKey {
                host: host.to_string(),
                target: name,
                fingerprint,
                known_hosts: r.known_hosts.clone(),
            });
        }
        (Err(_), Some(KeyVerdict::Changed { fingerprint, line })) => {
            return Err(RemoteError::HostKeyChanged {
                host: host.to_string(),
                target: name,
                fingerprint,
                known_hosts: r.known_hosts.clone(),
                line,
            });
        }
        (Err(_), Some(KeyVerdict::Unreadable(message))) => {
            return Err(RemoteError::Config {
                host: host.to_string(),
                message,
            });
        }
        (Err(e), None) => {
            return Err(RemoteError::Ssh {
                host: host.to_string(),
                target: name,
                message: e.to_string(),
            });
        }
    };
    authenticate(host, &mut handle, r).await?;
    Ok(handle)
}

/// ssh-agent first, then identity files, as OpenSSH does. Returns which keys were refused.
async fn authenticate(
    host: &str,
    handle: &mut Handle<Client>,
    r: &Resolved,
) -> Result<(), RemoteError> {
    let ssh_err = |e: russh::Error| RemoteError::Ssh {
        host: host.to_string(),
        target: r.known_hosts_name(),
        message: format!("during authentication: {e}"),
    };
    let mut tried = Vec::new();
    let mut rsa_hash: Option<Option<HashAlg>> = None;

    if let Some(sock) = std::env::var_os("SSH_AUTH_SOCK").filter(|s| !s.is_empty()) {
        match AgentClient::connect_uds(&sock).await {
            Err(e) => tried.push(format!(
                "ssh-agent at {} (unreachable: {e})",
                sock.to_string_lossy()
            )),
            Ok(mut agent) => match agent.request_identities().await {
                Err(e) => tried.push(format!("ssh-agent ({e})")),
                Ok(ids) if ids.is_empty() => tried.push("ssh-agent (no keys)".to_string()),
                Ok(ids) => {
                    for id in ids {
                        let AgentIdentity::PublicKey { key, comment } = id else {
                            continue;
                        };
                        let label =
                            format!("agent key {comment} ({})", key.fingerprint(HashAlg::Sha256));
                        let hash = rsa_hash_for(handle, key.algorithm().is_rsa(), &mut rsa_hash)
                            .await
                            .map_err(ssh_err)?;
                        match handle
                            .authenticate_publickey_with(&r.user, key, hash, &mut agent)
                            .await
                        {
                            Ok(AuthResult::Success) => return Ok(()),
                            Ok(AuthResult::Failure { .. }) => tried.push(label),
                            Err(e) => tried.push(format!("{label} (agent could not sign: {e})")),
                        }
                    }
                }
            },
        }
    }

    for path in &r.identity_files {
        let shown = path.display();
        let key = match russh::keys::load_secret_key(path, None) {
            Ok(key) => key,
            Err(russh::keys::Error::KeyIsEncrypted) => {
                tried.push(format!(
                    "{shown} (passphrase-protected: load it with `ssh-add {shown}`)"
                ));
                continue;
            }
            Err(e) => {
                tried.push(format!("{shown} (unreadable: {e})"));
                continue;
            }
        };
        let hash = rsa_hash_for(handle, key.algorithm().is_rsa(), &mut rsa_hash)
            .await
            .map_err(ssh_err)?;
        let result = handle
            .authenticate_publickey(&r.user, PrivateKeyWithHashAlg::new(Arc::new(key), hash))
            .await
            .map_err(ssh_err)?;
        if result.success() {
            return Ok(());
        }
        tried.push(shown.to_string());
    }
    let _ = handle.disconnect(Disconnect::ByApplication, "", "en").await;
    Err(RemoteError::AuthRefused {
        host: host.to_string(),
        user: r.user.clone(),
        target: r.known_hosts_name(),
        tried,
    })
}

/// The RSA signature hash the server accepts, asked once and only when an RSA key is offered.
async fn rsa_hash_for(
    handle: &Handle<Client>,
    is_rsa: bool,
    cache: &mut Option<Option<HashAlg>>,
) -> Result<Option<HashAlg>, russh::Error> {
    if !is_rsa {
        return Ok(None);
    }
    if cache.is_none() {
        *cache = Some(handle.best_supported_rsa_hash().await?.flatten());
    }
    Ok(cache.flatten())
}

#[async_trait]
impl Transport for SshTransport {
    fn host(&self) -> &str {
        &self.host
    }

    async fn run(&self, argv: &[String]) -> Result<CommandOutput, RemoteError> {
        let command = quote_argv(&self.host, argv)?;
        tracing::debug!(host = %self.host, "ssh {}: {}", self.target, mask(&command));
        let _permit = self.execs.acquire().await.map_err(|_| RemoteError::Ssh {
            host: self.host.clone(),
            target: self.target.clone(),
            message: "connection closed".into(),
        })?;
        let mut channel = self.open_session().await?;
        channel
            .exec(true, command.as_bytes())
            .await
            .map_err(|e| self.broken(e))?;
        // Nothing is ever written to a remote command's stdin; a program reading it must see EOF.
        channel.eof().await.map_err(|e| self.broken(e))?;

        let mut out = CommandOutput::default();
        // Output may still arrive after EOF and exit-status; only Close ends the channel.
        while let Some(msg) = channel.wait().await {
            match msg {
                ChannelMsg::Data { data } => out.stdout.extend_from_slice(&data),
                ChannelMsg::ExtendedData { data, ext: 1 } => out.stderr.extend_from_slice(&data),
                ChannelMsg::ExitStatus { exit_status } => {
                    out.status = i32::try_from(exit_status).ok()
                }
                ChannelMsg::Failure => {
                    return Err(RemoteError::Command {
                        host: self.host.clone(),
                        command: mask(&command),
                        status: "refused by the server".into(),
                        stderr: String::new(),
                    });
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        if out.status.is_none() && self.handle.is_closed() {
            return Err(RemoteError::Ssh {
                host: self.host.clone(),
                target: self.target.clone(),
                message: format!("connection lost while running `{}`", mask(&command)),
            });
        }
        Ok(out)
    }

    async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError> {
        let forward_err = |message: String| RemoteError::Forward {
            host: self.host.clone(),
            addr: addr.to_string(),
            port,
            message,
        };
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| forward_err(e.to_string()))?;
        let local = listener
            .local_addr()
            .map_err(|e| forward_err(e.to_string()))?;
        tracing::debug!(host = %self.host, "ssh {}: forwarding {local} -> {addr}:{port}", self.target);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(serve_forward(
            listener,
            self.handle.clone(),
            Destination {
                host: self.host.clone(),
                addr: addr.to_string(),
                port,
            },
            cancel.clone(),
        ));
        Ok(Tunnel::forwarded(local, cancel, task))
    }
}

#[derive(Clone)]
struct Destination {
    host: String,
    addr: String,
    port: u16,
}

/// Accepts local connections until cancelled; each gets its own direct-tcpip channel.
async fn serve_forward(
    listener: TcpListener,
    handle: Arc<Handle<Client>>,
    dest: Destination,
    cancel: CancellationToken,
) {
    let mut pipes = JoinSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    pipes.spawn(pipe(tcp, peer, handle.clone(), dest.clone(), cancel.clone()));
                }
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(host = %dest.host, "forward to {}:{}: accept failed: {e}", dest.addr, dest.port);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = pipes.join_next(), if !pipes.is_empty() => {}
        }
    }
    drop(listener);
    while pipes.join_next().await.is_some() {}
}

async fn pipe(
    mut tcp: TcpStream,
    peer: SocketAddr,
    handle: Arc<Handle<Client>>,
    dest: Destination,
    cancel: CancellationToken,
) {
    let _ = tcp.set_nodelay(true);
    let channel = match handle
        .channel_open_direct_tcpip(
            dest.addr.as_str(),
            u32::from(dest.port),
            peer.ip().to_string(),
            u32::from(peer.port()),
        )
        .await
    {
        Ok(channel) => channel,
        Err(e) => {
            tracing::warn!(host = %dest.host, "forward to {}:{}: the server refused the channel: {e}", dest.addr, dest.port);
            return;
        }
    };
    let mut remote = channel.into_stream();
    tokio::select! {
        _ = cancel.cancelled() => {}
        copied = tokio::io::copy_bidirectional(&mut tcp, &mut remote) => {
            if let Err(e) = copied {
                tracing::debug!(host = %dest.host, "forward to {}:{} ended: {e}", dest.addr, dest.port);
            }
        }
    }
}

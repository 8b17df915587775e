//! One SSH hop: the handshake over any byte stream (a TCP connection, or a channel through the
//! hop before), the host-key check against known_hosts (OpenSSH's accept-new at most), and
//! public-key authentication (ssh-agent first, then identity files).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use russh::Disconnect;
use russh::client::{self, AuthResult, DisconnectReason, Handle};
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

use super::super::ssh_config::{self, Keepalive, Resolved};
use super::super::{ConnectOptions, LinkLoss, RemoteError};

/// An authenticated SSH connection to one hop.
pub(crate) struct Session {
    pub handle: Handle<Client>,
    /// `user@name` as known_hosts spells the name, for messages and logs.
    pub label: String,
    /// The jump connection this one runs through: kept open while this one is.
    _via: Option<Arc<Session>>,
}

impl Session {
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
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

pub(crate) struct Client {
    hostname: String,
    port: u16,
    known_hosts: PathBuf,
    accept_new: bool,
    verdict: Arc<Mutex<Option<KeyVerdict>>>,
    keepalive: Keepalive,
    /// Told why the session ended, once; dropping the handler (the session task ending by any
    /// path, even one that skips `disconnected`) tells it too.
    ended: Option<oneshot::Sender<LinkLoss>>,
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

    fn signal(&mut self, loss: LinkLoss) {
        if let Some(tx) = self.ended.take() {
            let _ = tx.send(loss);
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.signal(LinkLoss::Ended);
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

    async fn disconnected(
        &mut self,
        reason: DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        let loss = match &reason {
            DisconnectReason::ReceivedDisconnect(info) => LinkLoss::Closed {
                message: info.message.clone(),
            },
            DisconnectReason::Error(russh::Error::KeepaliveTimeout) => LinkLoss::Keepalive {
                interval: self.keepalive.interval.unwrap_or_default(),
                max: self.keepalive.max,
            },
            DisconnectReason::Error(e) => LinkLoss::Broken {
                message: e.to_string(),
            },
        };
        self.signal(loss);
        match reason {
            DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            DisconnectReason::Error(e) => Err(e),
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

/// Runs the SSH handshake with `r` over `stream` and authenticates. `host` names the hop in
/// errors. Returns the session and what will say why it ended.
pub(crate) async fn handshake<S>(
    host: &str,
    r: &Resolved,
    stream: S,
    opts: &ConnectOptions,
    via: Option<Arc<Session>>,
) -> Result<(Session, oneshot::Receiver<LinkLoss>), RemoteError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let name = r.known_hosts_name();
    let verdict = Arc::new(Mutex::new(None));
    let (ended_tx, ended) = oneshot::channel();
    let handler = Client {
        hostname: r.hostname.clone(),
        port: r.port,
        known_hosts: r.known_hosts.clone(),
        accept_new: opts.accept_new_host_key,
        verdict: verdict.clone(),
        keepalive: r.keepalive,
        ended: Some(ended_tx),
    };
    let config = Arc::new(client::Config {
        keepalive_interval: r.keepalive.interval,
        keepalive_max: r.keepalive.max,
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
            return Err(RemoteError::KnownHosts {
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
    Ok((
        Session {
            handle,
            label: format!("{}@{name}", r.user),
            _via: via,
        },
        ended,
    ))
}

/// ssh-agent first, then identity files, as OpenSSH does; with `IdentitiesOnly`, only the agent
/// keys that are one of the identity files. Errors list which keys were refused.
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
    // The public halves of the configured identities: the file's `.pub`, or the key itself.
    let configured: Vec<PublicKey> = if r.identities_only {
        r.identity_files
            .iter()
            .filter_map(|p| {
                russh::keys::load_public_key(format!("{}.pub", p.display()))
                    .ok()
                    .or_else(|| {
                        russh::keys::load_secret_key(p, None)
                            .ok()
                            .map(|k| k.public_key().clone())
                    })
            })
            .collect()
    } else {
        Vec::new()
    };

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
                        if r.identities_only
                            && !configured.iter().any(|c| c.key_data() == key.key_data())
                        {
                            continue;
                        }
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

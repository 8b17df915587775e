//! The `pct` transport: a Proxmox LXC container reached through another transport (usually
//! SSH to the Proxmox host) as `pct exec <CT> -- bash -c <quoted script>`.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::{CommandOutput, Link, RemoteError, Transport, Tunnel, quote_argv};

/// pct (Perl's `die`) exits 255 when it cannot run the command at all.
const PCT_FAILURE: i32 = 255;

#[derive(Debug)]
pub struct PctTransport {
    inner: Arc<dyn Transport>,
    container: u32,
    /// The inventory's `address`, or the first of `hostname -I`, asked once.
    address: OnceCell<String>,
}

impl PctTransport {
    pub fn new(inner: Arc<dyn Transport>, container: u32, address: Option<String>) -> Self {
        PctTransport {
            inner,
            container,
            address: OnceCell::new_with(address),
        }
    }

    /// The argv run on the Proxmox host for `argv` in the container.
    fn wrap(&self, argv: &[String]) -> Result<Vec<String>, RemoteError> {
        let script = quote_argv(self.inner.host(), argv)?;
        Ok([
            "pct",
            "exec",
            &self.container.to_string(),
            "--",
            "bash",
            "-c",
            &script,
        ]
        .map(String::from)
        .into())
    }

    /// pct's own refusal (stopped or unknown container), told apart from the command's exit 255.
    fn not_running(&self, out: &CommandOutput) -> Option<RemoteError> {
        if out.status != Some(PCT_FAILURE) {
            return None;
        }
        let stderr = out.stderr_lossy();
        let ct = self.container;
        let line = stderr.lines().find(|l| {
            *l == format!("container '{ct}' not running!")
                || (l.starts_with("Configuration file 'nodes/")
                    && l.ends_with(&format!("/lxc/{ct}.conf' does not exist")))
        })?;
        Some(RemoteError::ContainerNotRunning {
            host: self.inner.host().to_string(),
            container: ct,
            detail: line.to_string(),
        })
    }
}

#[async_trait]
impl Transport for PctTransport {
    fn host(&self) -> &str {
        self.inner.host()
    }

    async fn run_input(&self, argv: &[String], input: &[u8]) -> Result<CommandOutput, RemoteError> {
        // `pct exec` passes stdin through to the command in the container.
        let out = self.inner.run_input(&self.wrap(argv)?, input).await?;
        match self.not_running(&out) {
            Some(err) => Err(err),
            None => Ok(out),
        }
    }

    /// Loopback means the container's own loopback, which the Proxmox host cannot reach, so it is
    /// replaced by the container's address; any other address is used as given.
    async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError> {
        let is_loopback = addr == "localhost"
            || addr
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if is_loopback {
            let container_addr = self.server_address().await?;
            return self.inner.forward(&container_addr, port).await;
        }
        self.inner.forward(addr, port).await
    }

    /// The container is reached only through the host: its link is the host's.
    fn link(&self) -> tokio::sync::watch::Receiver<Link> {
        self.inner.link()
    }

    async fn server_address(&self) -> Result<String, RemoteError> {
        self.address
            .get_or_try_init(|| async {
                let out = self
                    .run(&["hostname".to_string(), "-I".to_string()])
                    .await?;
                let first = out
                    .stdout_lossy()
                    .split_whitespace()
                    .next()
                    .map(String::from);
                match first {
                    Some(addr) if out.success() => Ok(addr),
                    _ => Err(RemoteError::Command {
                        host: self.host().to_string(),
                        command: format!("pct exec {} -- hostname -I", self.container),
                        status: format!("no address ({:?})", out.status),
                        stderr: format!(
                            "{} (hint: set `address:` for this host in fleet.yaml)",
                            out.stderr_lossy().trim()
                        ),
                    }),
                }
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::LocalTransport;

    fn pct() -> PctTransport {
        PctTransport::new(Arc::new(LocalTransport::new("pve")), 200, None)
    }

    #[test]
    fn commands_become_one_quoted_bash_script() {
        let argv: Vec<String> = ["echo", "a b", "$(id)"].map(String::from).into();
        let wrapped = pct().wrap(&argv).unwrap();
        assert_eq!(&wrapped[..6], ["pct", "exec", "200", "--", "bash", "-c"]);
        assert_eq!(shlex::split(&wrapped[6]).unwrap(), argv);
    }

    #[test]
    fn only_pcts_own_messages_mean_not_running() {
        let out = |status, stderr: &str| CommandOutput {
            status: Some(status),
            stdout: vec![],
            stderr: stderr.into(),
        };
        let t = pct();
        let err = t
            .not_running(&out(255, "container '200' not running!\n"))
            .unwrap();
        assert!(err.to_string().contains("pct status 200"), "{err}");
        assert!(
            t.not_running(&out(
                255,
                "Configuration file 'nodes/pve/lxc/200.conf' does not exist\n"
            ))
            .is_some()
        );
        assert!(
            t.not_running(&out(255, "container '201' not running!\n"))
                .is_none()
        );
        assert!(
            t.not_running(&out(1, "container '200' not running!\n"))
                .is_none()
        );
        assert!(t.not_running(&out(255, "app failed\n")).is_none());
    }
}

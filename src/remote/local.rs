//! The `local` transport: this machine, through `tokio::process`.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;

use async_trait::async_trait;
use tokio::process::Command;

use super::{CommandOutput, RemoteError, Transport, Tunnel, mask, quote_argv};

#[derive(Debug)]
pub struct LocalTransport {
    host: String,
}

impl LocalTransport {
    pub fn new(host: &str) -> Self {
        LocalTransport {
            host: host.to_string(),
        }
    }
}

#[async_trait]
impl Transport for LocalTransport {
    fn host(&self) -> &str {
        &self.host
    }

    async fn run_input(&self, argv: &[String], input: &[u8]) -> Result<CommandOutput, RemoteError> {
        let Some((program, args)) = argv.split_first() else {
            return Err(RemoteError::Spawn {
                host: self.host.clone(),
                program: String::new(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
            });
        };
        tracing::debug!(host = %self.host, "local: {}", mask(&quote_argv(&self.host, argv)?));
        let spawn_err = |source| RemoteError::Spawn {
            host: self.host.clone(),
            program: program.clone(),
            source,
        };
        let mut child = Command::new(program)
            .args(args)
            .stdin(if input.is_empty() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_err)?;
        if let Some(mut stdin) = child.stdin.take() {
            use tokio::io::AsyncWriteExt;
            // A program that exits without reading it all is its own business: its status says.
            let _ = stdin.write_all(input).await;
        }
        let out = child.wait_with_output().await.map_err(spawn_err)?;
        Ok(CommandOutput {
            status: out.status.code(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError> {
        let ip: IpAddr = if addr == "localhost" {
            IpAddr::from([127, 0, 0, 1])
        } else {
            addr.parse().map_err(|_| RemoteError::Forward {
                host: self.host.clone(),
                addr: addr.to_string(),
                port,
                message: "not an IP address".into(),
            })?
        };
        Ok(Tunnel::direct(SocketAddr::new(ip, port)))
    }
}

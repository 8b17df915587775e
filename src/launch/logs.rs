//! Finding an instance's server log (`host:gpu` or a port, running or stopped while its log is
//! still there) and reading it: the last lines, then optionally what is appended, as bytes, until
//! cancelled or nobody reads any more. The secrets SGLang logs (`api_key` in `server_args=`)
//! are masked line by line on the way.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::launch::backend::Backend;
use crate::launch::fleet::Fleet;
use crate::launch::plan::RunFiles;
use crate::launch::state::{self, InstanceRecord, StateError};
use crate::remote::{LineMask, RemoteError, Transport};

/// How often `-f` looks for new output.
const FOLLOW_POLL: Duration = Duration::from_millis(500);

/// An instance as the user names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    HostGpu { host: String, gpu: u32 },
    Port(u16),
}

#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("`{0}`: expected HOST:GPU (e.g. ct200:5) or a port (e.g. 30005)")]
    BadSelector(String),
    #[error("no instance {0} in any host's records (`fleet status` lists them)")]
    NotFound(String),
    #[error("port {port} is recorded on several hosts ({hosts}); name one as HOST:GPU")]
    Ambiguous { port: u16, hosts: String },
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("{host}: cannot read {path}: {message}")]
    Read {
        host: String,
        path: String,
        message: String,
    },
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, LogsError> {
        let bad = || LogsError::BadSelector(s.to_string());
        match s.rsplit_once(':') {
            Some((host, gpu)) if !host.is_empty() => Ok(Selector::HostGpu {
                host: host.to_string(),
                gpu: gpu.parse().map_err(|_| bad())?,
            }),
            Some(_) => Err(bad()),
            None => s.parse().map(Selector::Port).map_err(|_| bad()),
        }
    }
}

/// The host and log path of the selected instance: a running one's, else a stopped one's whose
/// log is still there. A port without any record (a run directory older than stopped records)
/// still finds its log when exactly one host has it. The log is read on the host's shell.
pub async fn locate(
    fleet: &Fleet,
    selector: &Selector,
) -> Result<(Arc<dyn Transport>, String), LogsError> {
    let hosts: Vec<&Arc<dyn Backend>> = fleet
        .backends()
        .filter(|b| match selector {
            Selector::HostGpu { host, .. } => host == b.host(),
            Selector::Port(_) => true,
        })
        .collect();
    let hit = |r: &InstanceRecord| match selector {
        Selector::HostGpu { gpu, .. } => r.id.gpu_index() == Some(*gpu),
        Selector::Port(port) => r.port == *port,
    };
    let mut found: Vec<(&Arc<dyn Backend>, String)> = Vec::new();
    for b in &hosts {
        for s in b.survey().await? {
            if hit(&s.record) {
                found.push((b, s.record.log));
            }
        }
    }
    if found.is_empty() {
        for b in &hosts {
            let t = b.shell().as_ref();
            for r in state::read_stopped_records(t, b.run_root()).await? {
                if hit(&r) && exists(t, &r.log).await? {
                    found.push((b, r.log));
                }
            }
        }
    }
    if found.is_empty()
        && let Selector::Port(port) = selector
    {
        for b in &hosts {
            let log = RunFiles::new(b.run_root(), *port).log;
            if exists(b.shell().as_ref(), &log).await? {
                found.push((b, log));
            }
        }
    }
    let label = match selector {
        Selector::HostGpu { host, gpu } => format!("{host}:{gpu}"),
        Selector::Port(port) => format!(":{port}"),
    };
    match found.len() {
        0 => Err(LogsError::NotFound(label)),
        1 => {
            let (b, log) = found.remove(0);
            Ok((b.shell().clone(), log))
        }
        _ => Err(LogsError::Ambiguous {
            port: match selector {
                Selector::Port(p) => *p,
                Selector::HostGpu { .. } => 0,
            },
            hosts: found
                .iter()
                .map(|(b, _)| b.host())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

async fn exists(t: &dyn Transport, path: &str) -> Result<bool, RemoteError> {
    Ok(t.run(&["test".into(), "-f".into(), path.to_string()])
        .await?
        .success())
}

/// Sends the log's last `lines` lines, then (with `follow`) whatever is appended, until
/// `cancel` or until `out`'s receiver is gone. Chunks are the file's bytes as read: following
/// counts its offset in bytes, whatever the log's encoding.
pub async fn read(
    t: &dyn Transport,
    path: &str,
    lines: usize,
    follow: bool,
    out: &UnboundedSender<Vec<u8>>,
    cancel: &CancellationToken,
) -> Result<(), LogsError> {
    // The size is taken first and the tail read from those bytes only, so following starts
    // exactly where the tail ended.
    let script =
        r#"size=$(wc -c <"$1") || exit 1; echo "$size"; head -c "$size" "$1" | tail -n "$2""#;
    let first = run(
        t,
        path,
        &["sh", "-c", script, "sh", path, &lines.to_string()],
    )
    .await?;
    let (size, text) = split_size(&first);
    let mut offset = size;
    let mut masked = LineMask::default();
    if out.send(masked.push(text)).is_err() {
        return Ok(());
    }
    if follow {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = out.closed() => break,
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
            }
            let more = run(t, path, &["tail", "-c", &format!("+{}", offset + 1), path]).await?;
            if !more.is_empty() {
                offset += more.len() as u64;
                if out.send(masked.push(&more)).is_err() {
                    return Ok(());
                }
            }
        }
    }
    let _ = out.send(masked.finish());
    Ok(())
}

/// `SIZE\n` then the tail's bytes, as the first read prints them.
fn split_size(output: &[u8]) -> (u64, &[u8]) {
    let (size, text) = match output.iter().position(|b| *b == b'\n') {
        Some(i) => (&output[..i], &output[i + 1..]),
        None => (output, &[][..]),
    };
    let size = std::str::from_utf8(size)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    (size, text)
}

async fn run(t: &dyn Transport, path: &str, argv: &[&str]) -> Result<Vec<u8>, LogsError> {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let output = t.run(&argv).await?;
    if !output.success() {
        return Err(LogsError::Read {
            host: t.host().to_string(),
            path: path.to_string(),
            message: output.stderr_lossy().trim().to_string(),
        });
    }
    Ok(output.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_read_splits_into_the_size_and_the_tail_bytes() {
        // A byte that is not UTF-8 is counted as the one byte it is.
        assert_eq!(split_size(b"12\nab\xffc\n"), (12, &b"ab\xffc\n"[..]));
        assert_eq!(split_size(b"0\n"), (0, &b""[..]));
        assert_eq!(split_size(b""), (0, &b""[..]));
    }

    #[test]
    fn selectors() {
        assert_eq!(
            Selector::parse("ct200:5").unwrap(),
            Selector::HostGpu {
                host: "ct200".into(),
                gpu: 5
            }
        );
        assert_eq!(Selector::parse("30005").unwrap(), Selector::Port(30005));
        for bad in ["ct200:x", ":5", "nope", "70000"] {
            assert!(
                matches!(Selector::parse(bad), Err(LogsError::BadSelector(_))),
                "{bad}"
            );
        }
    }
}

//! Moving files to and from a target through its transport, in chunks, resumable: an upload
//! that is cut goes on from the size the target already has and is checked by SHA-256 at the
//! end; a download appends what the local copy lacks and skips a file it already has whole.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::JobError;
use crate::backoff::Backoff;
use crate::launch::state::run_ok;
use crate::remote::{RemoteError, Transport, argv};

/// Bytes per command: large enough that a 100 MB file takes ~25 round trips, small enough that
/// a cut costs little.
const CHUNK: u64 = 4 * 1024 * 1024;

/// Tries of one chunk through an outage (a reconnect takes seconds).
const TRIES: u32 = 12;
const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));

/// The size of a file on the target, `None` when there is none.
pub async fn remote_size(t: &dyn Transport, path: &str) -> Result<Option<u64>, RemoteError> {
    let script = r#"[ -f "$1" ] || exit 3; wc -c < "$1""#;
    let out = t.run(&argv(&["sh", "-c", script, "sh", path])).await?;
    Ok(match out.status {
        Some(0) => out.stdout_lossy().trim().parse().ok(),
        _ => None,
    })
}

async fn remote_sha256(t: &dyn Transport, path: &str) -> Result<Option<String>, RemoteError> {
    let out = t.run(&argv(&["sha256sum", "--", path])).await?;
    Ok(out
        .success()
        .then(|| {
            out.stdout_lossy()
                .split_whitespace()
                .next()
                .map(str::to_string)
        })
        .flatten())
}

fn local_sha256(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Runs `attempt` until it succeeds, waiting through an outage; other errors end it.
async fn through_outages<T, F, Fut>(t: &dyn Transport, mut attempt: F) -> Result<T, JobError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, JobError>>,
{
    let mut tries = 0;
    loop {
        match attempt().await {
            Err(JobError::Remote(e)) if tries + 1 < TRIES && e.is_outage() => {
                tries += 1;
                tracing::debug!(host = %t.host(), "transfer interrupted ({e}); going on");
                tokio::time::sleep(RETRY.random_delay(tries)).await;
            }
            other => return other,
        }
    }
}

/// Sends `local` to `remote` on the target (its directory is made), going on from what an
/// earlier, cut upload left there; the result is checked by SHA-256. Returns the bytes sent.
pub async fn upload(t: &dyn Transport, local: &Path, remote: &str) -> Result<u64, JobError> {
    let io = |source| JobError::Local {
        path: local.to_path_buf(),
        source,
    };
    let total = std::fs::metadata(local).map_err(io)?.len();
    let want = {
        let p = local.to_path_buf();
        tokio::task::spawn_blocking(move || local_sha256(&p))
            .await
            .map_err(JobError::Task)?
            .map_err(io)?
    };
    let dir = remote.rsplit_once('/').map_or(".", |(d, _)| d);
    run_ok(t, &argv(&["mkdir", "-p", "--", dir])).await?;
    let mut sent = 0;
    for fresh_start in [false, true] {
        if fresh_start {
            run_ok(t, &argv(&["rm", "-f", "--", remote])).await?;
        }
        loop {
            let have = through_outages(t, || async {
                Ok(remote_size(t, remote).await?.unwrap_or(0))
            })
            .await?;
            if have >= total {
                break;
            }
            let len = CHUNK.min(total - have);
            let chunk = read_at(local, have, len).map_err(io)?;
            through_outages(t, || async {
                // Appended only if the file is still where this chunk starts, so a chunk
                // retried after a cut is never written twice.
                let script =
                    r#"[ "$(wc -c < "$1" 2>/dev/null || echo 0)" = "$2" ] || exit 4; cat >> "$1""#;
                let out = t
                    .run_input(
                        &argv(&["sh", "-c", script, "sh", remote, &have.to_string()]),
                        &chunk,
                    )
                    .await?;
                match out.status {
                    Some(0) | Some(4) => Ok(()),
                    _ => Err(JobError::Remote(RemoteError::Command {
                        host: t.host().to_string(),
                        command: format!("cat >> {remote}"),
                        status: format!("{:?}", out.status),
                        stderr: out.stderr_lossy().trim().to_string(),
                    })),
                }
            })
            .await?;
            sent += len;
        }
        let got = through_outages(t, || async { Ok(remote_sha256(t, remote).await?) }).await?;
        if got.as_deref() == Some(want.as_str()) {
            return Ok(sent);
        }
    }
    Err(JobError::Corrupt {
        host: t.host().to_string(),
        path: remote.to_string(),
    })
}

fn read_at(path: &Path, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(len as usize);
    f.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}

/// What a download did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// The local copy already had every byte.
    Complete,
    /// Bytes appended (or written anew, when the remote file got shorter: it was rewritten).
    Copied(u64),
    /// There is no such file on the target.
    Missing,
}

/// Brings `remote` to `local`: appends what the local copy lacks, rewrites it when the remote
/// file is now shorter, and does nothing when both have the same size.
pub async fn download(t: &dyn Transport, remote: &str, local: &Path) -> Result<Fetched, JobError> {
    let io = |source| JobError::Local {
        path: local.to_path_buf(),
        source,
    };
    let Some(total) = through_outages(t, || async { Ok(remote_size(t, remote).await?) }).await?
    else {
        return Ok(Fetched::Missing);
    };
    let mut have = std::fs::metadata(local).map_or(0, |m| m.len());
    if have == total {
        return Ok(Fetched::Complete);
    }
    if have > total {
        std::fs::remove_file(local).map_err(io)?;
        have = 0;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(local)
        .map_err(io)?;
    let mut copied = 0;
    while have < total {
        let len = CHUNK.min(total - have);
        let bytes = through_outages(t, || async {
            let script = r#"tail -c +"$2" -- "$1" | head -c "$3""#;
            let (from, len) = ((have + 1).to_string(), len.to_string());
            let out = t
                .run(&argv(&["sh", "-c", script, "sh", remote, &from, &len]))
                .await?;
            if out.success() {
                Ok(out.stdout)
            } else {
                Err(JobError::Remote(RemoteError::Command {
                    host: t.host().to_string(),
                    command: format!("tail -c +{from} {remote}"),
                    status: format!("{:?}", out.status),
                    stderr: out.stderr_lossy().trim().to_string(),
                }))
            }
        })
        .await?;
        if bytes.is_empty() {
            break;
        }
        file.write_all(&bytes).map_err(io)?;
        have += bytes.len() as u64;
        copied += bytes.len() as u64;
    }
    file.sync_all().map_err(io)?;
    Ok(Fetched::Copied(copied))
}

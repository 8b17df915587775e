//! Moving files to and from a target through its transport, in chunks, resumable: an upload
//! that is cut goes on from the size the target already has and is checked by SHA-256 at the
//! end, each chunk gzip-compressed on the wire when the target has `gzip`; a download appends
//! what the local copy lacks and skips a file it already has whole.

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

/// What an upload sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uploaded {
    /// Bytes of the file sent (an upload that goes on from a cut one sends only the rest).
    pub bytes: u64,
    /// What crossed the connection for them: less when compressed.
    pub on_wire: u64,
}

/// Compresses a chunk for the wire: the fastest level, since the point is the link's time
/// (`fleet` itself is 32 MB, 13 MB at level 1; prompts shrink more).
fn gzip(chunk: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(chunk.len() / 2),
        flate2::Compression::fast(),
    );
    enc.write_all(chunk)?;
    enc.finish()
}

/// Sends `local` to `remote` on the target (its directory is made), going on from what an
/// earlier, cut upload left there; the result is checked by SHA-256.
pub async fn upload(t: &dyn Transport, local: &Path, remote: &str) -> Result<Uploaded, JobError> {
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
    // gzip is on every Linux host fleet knows, but a minimal container may lack it.
    let compress = t
        .run(&argv(&["sh", "-c", "command -v gzip >/dev/null 2>&1"]))
        .await?
        .success();
    let mut sent = Uploaded {
        bytes: 0,
        on_wire: 0,
    };
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
            let chunk = {
                let p = local.to_path_buf();
                tokio::task::spawn_blocking(move || {
                    let raw = read_at(&p, have, len)?;
                    if compress { gzip(&raw) } else { Ok(raw) }
                })
                .await
                .map_err(JobError::Task)?
                .map_err(io)?
            };
            let into = if compress {
                "gzip -dc >> \"$1\""
            } else {
                "cat >> \"$1\""
            };
            through_outages(t, || async {
                // Appended only if the file is still where this chunk starts, so a chunk
                // retried after a cut is never written twice (a chunk cut halfway leaves the
                // file at another size, and the next round goes on from there).
                let script = format!(
                    r#"[ "$(wc -c < "$1" 2>/dev/null || echo 0)" = "$2" ] || exit 4; {into}"#
                );
                let out = t
                    .run_input(
                        &argv(&["sh", "-c", &script, "sh", remote, &have.to_string()]),
                        &chunk,
                    )
                    .await?;
                match out.status {
                    Some(0) | Some(4) => Ok(()),
                    _ => Err(JobError::Remote(RemoteError::Command {
                        host: t.host().to_string(),
                        command: format!("{into} ({remote})"),
                        status: format!("{:?}", out.status),
                        stderr: out.stderr_lossy().trim().to_string(),
                    })),
                }
            })
            .await?;
            sent.bytes += len;
            sent.on_wire += chunk.len() as u64;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::LocalTransport;

    #[tokio::test]
    async fn an_upload_is_compressed_on_the_wire_resumes_a_cut_one_and_arrives_whole() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("prompts.jsonl");
        // More than one chunk, and compressible as prompts and executables are.
        let text: String = (0..400_000)
            .map(|i| format!("{{\"id\": \"p{i}\", \"prompt\": \"prompt number {i}\"}}\n"))
            .collect();
        assert!(text.len() as u64 > CHUNK * 2);
        std::fs::write(&local, &text).unwrap();
        let remote = dir.path().join("job/prompts.jsonl");
        // What a cut upload left: the first 1,000 bytes.
        std::fs::create_dir_all(remote.parent().unwrap()).unwrap();
        std::fs::write(&remote, &text.as_bytes()[..1000]).unwrap();

        let t = LocalTransport::new("local");
        let sent = upload(&t, &local, remote.to_str().unwrap()).await.unwrap();
        assert_eq!(std::fs::read(&remote).unwrap(), text.as_bytes());
        assert_eq!(sent.bytes, text.len() as u64 - 1000);
        assert!(sent.on_wire * 4 < sent.bytes, "gzip on the wire: {sent:?}");
    }
}

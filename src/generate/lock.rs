//! One job per output directory: an advisory lock on `DIR/.lock`, held for the whole run. The
//! kernel drops it when the process dies, even by SIGKILL, so a stale file never blocks; the
//! file names who holds the lock, for the refusal.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub const LOCK_FILE: &str = ".lock";

/// Who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    pub started_unix: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{} is in use by another fleet job ({}); two jobs on one directory would write every \
         prompt twice\n  hint: wait for it, stop it, or choose another --out",
        dir.display(),
        holder.as_ref().map_or("its holder is unknown".to_string(), |h| format!("pid {} on {}", h.pid, h.host))
    )]
    Held {
        dir: PathBuf,
        holder: Option<Holder>,
    },
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The lock of one output directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct OutputLock {
    _file: File,
}

impl OutputLock {
    /// Takes the lock of `dir` (which must exist), or says who holds it.
    pub fn acquire(dir: &Path) -> Result<OutputLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(err)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder: serde_json::from_str(&text).ok(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(err(e)),
        }
        let me = Holder {
            pid: std::process::id(),
            host: hostname(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        file.set_len(0).map_err(err)?;
        file.rewind().map_err(err)?;
        let body = serde_json::to_vec(&me).expect("a holder serializes");
        file.write_all(&body).map_err(err)?;
        file.sync_data().map_err(err)?;
        Ok(OutputLock { _file: file })
    }
}

/// This machine's name, as the lock's holder and messages show it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_dropping_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = OutputLock::acquire(dir.path()).unwrap();
        match OutputLock::acquire(dir.path()) {
            Err(LockError::Held {
                holder: Some(h), ..
            }) => {
                assert_eq!(h.pid, std::process::id());
                assert_eq!(h.host, hostname());
            }
            other => panic!("expected the lock to be held: {other:?}"),
        }
        drop(first);
        let again = OutputLock::acquire(dir.path());
        assert!(again.is_ok(), "a lock file left behind does not block");
        let msg = LockError::Held {
            dir: dir.path().into(),
            holder: Some(Holder {
                pid: 42,
                host: "gpu-box".into(),
                started_unix: 0,
            }),
        }
        .to_string();
        assert!(msg.contains("pid 42 on gpu-box"), "{msg}");
    }
}

//! The job's identity: the input it was started with, recorded in `DIR/input.json` (size,
//! modification time, a hash of its head and of its id column as read), so that `--resume` with
//! another input is refused instead of silently mixing two jobs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::input::Scan;
use super::journal::OutputFormat;

pub const IDENTITY_FILE: &str = "input.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub path: PathBuf,
    pub size: u64,
    pub mtime_unix: u64,
    /// Hex SHA-256 of the first 64 KiB ([`crate::generate::input::HEAD_BYTES`]).
    pub head_sha256: String,
    /// Hex SHA-256 of the ids in order (see [`crate::generate::input::Scan::ids_hash`]).
    pub ids_sha256: String,
    /// Prompt lines (up to `--limit`).
    pub lines: u64,
    /// What the job writes; absent in jobs that predate the choice, which wrote fleet's records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_format: Option<OutputFormat>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a fleet job identity: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The fingerprint of `path` from its pre-pass, which read the file's facts, hashed its ids and
/// counted its lines in the same pass: no second read of the file.
pub fn of(path: &Path, scan: &Scan) -> Fingerprint {
    Fingerprint {
        path: path.to_path_buf(),
        size: scan.file.size,
        mtime_unix: scan.file.mtime_unix,
        head_sha256: scan.file.head_sha256.clone(),
        ids_sha256: scan.ids_hash.clone(),
        lines: scan.total,
        output_format: None,
    }
}

/// The identity recorded in `dir`, if a run wrote one.
pub fn read(dir: &Path) -> Result<Option<Fingerprint>, IdentityError> {
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| IdentityError::Parse { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(IdentityError::Io { path, source }),
    }
}

/// Records `f` in `dir` (temp file and rename).
pub fn write(dir: &Path, f: &Fingerprint) -> Result<(), IdentityError> {
    let path = dir.join(IDENTITY_FILE);
    let tmp = dir.join(".input.json.tmp");
    let err = |source| IdentityError::Io {
        path: path.clone(),
        source,
    };
    let body = serde_json::to_vec_pretty(f).expect("a fingerprint serializes");
    std::fs::write(&tmp, body).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)
}

/// What differs between the job's input and this one, in words; empty when it is the same
/// input. A new modification time alone (a copy, a `touch`) is not a change.
pub fn changes(job: &Fingerprint, now: &Fingerprint) -> Vec<String> {
    let mut out = Vec::new();
    if job.lines != now.lines {
        out.push(format!("{} prompt lines, now {}", job.lines, now.lines));
    }
    if job.size != now.size {
        out.push(format!("{} bytes, now {}", job.size, now.size));
    }
    if job.ids_sha256 != now.ids_sha256 {
        out.push("the ids differ (added, removed, changed or moved lines)".to_string());
    }
    if job.head_sha256 != now.head_sha256 && job.ids_sha256 == now.ids_sha256 {
        out.push("the text of its first 64 KiB differs".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(lines: u64, size: u64, ids: &str, head: &str) -> Fingerprint {
        Fingerprint {
            path: "p.jsonl".into(),
            size,
            mtime_unix: 1,
            head_sha256: head.into(),
            ids_sha256: ids.into(),
            lines,
            output_format: None,
        }
    }

    #[test]
    fn what_changed_is_said_in_words_and_a_touch_is_no_change() {
        let job = fp(1000, 5000, "aa", "hh");
        let mut touched = job.clone();
        touched.mtime_unix = 99;
        assert!(changes(&job, &touched).is_empty());
        assert_eq!(
            changes(&job, &fp(999, 4990, "bb", "hh")),
            [
                "1000 prompt lines, now 999",
                "5000 bytes, now 4990",
                "the ids differ (added, removed, changed or moved lines)"
            ]
        );
        assert_eq!(
            changes(&job, &fp(1000, 5000, "aa", "zz")),
            ["the text of its first 64 KiB differs"]
        );
    }

    #[test]
    fn it_round_trips_through_the_output_directory() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("prompts.jsonl");
        std::fs::write(&input, "{\"prompt\":\"x\"}\n").unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let scan = Scan {
            total: 1,
            ids_hash: "ids".into(),
            file: crate::generate::input::FileFacts {
                size: 15,
                mtime_unix: 7,
                head_sha256: "hh".into(),
            },
            ..Scan::default()
        };
        let f = of(&input, &scan);
        assert_eq!((f.size, f.lines, f.ids_sha256.as_str()), (15, 1, "ids"));
        write(dir.path(), &f).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(f));
    }
}

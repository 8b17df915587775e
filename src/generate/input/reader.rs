//! Streaming the prompt file as bytes: non-blank lines with their numbers, a UTF-8 BOM skipped,
//! resumable from a byte position, and bounded by the end the pre-pass saw, so that lines
//! appended later are left out and a file that shrank is noticed. The pre-pass's reader also
//! takes the file's facts for the job's identity (size, mtime, a hash of its head) on the way,
//! so that one open of the file gives the scan, the identity and the count.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use super::{Ids, InputError, Line, parse_line};

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Bytes of the input whose hash is part of the job's identity.
pub const HEAD_BYTES: u64 = 64 * 1024;

/// What the job's identity records of the file itself, as the pre-pass opened it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileFacts {
    pub size: u64,
    pub mtime_unix: u64,
    /// Hex SHA-256 of the first [`HEAD_BYTES`] bytes.
    pub head_sha256: String,
}

/// The hash of the file's head, fed with the bytes as the reader reads them.
struct Head {
    sha: Sha256,
    taken: u64,
}

impl Head {
    fn feed(&mut self, bytes: &[u8]) {
        let room = HEAD_BYTES.saturating_sub(self.taken) as usize;
        let bytes = &bytes[..bytes.len().min(room)];
        self.sha.update(bytes);
        self.taken += bytes.len() as u64;
    }
}

/// Where a reader stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    /// Byte offset of the next line.
    pub offset: u64,
    /// Lines read so far (the next line is `line + 1`).
    pub line: u64,
    /// Non-blank lines read so far (what `--limit` counts).
    pub yielded: u64,
}

/// Streams the non-blank lines of the prompt file, at most `limit` of them.
pub struct Reader {
    path: PathBuf,
    inner: BufReader<File>,
    buf: Vec<u8>,
    pos: Position,
    limit: Option<u64>,
    /// Stop at this byte offset: the end of the file as the job's pre-pass read it.
    end: Option<u64>,
    /// Set by [`Reader::with_head`]: the bytes read from offset 0 are hashed on the way.
    head: Option<Head>,
}

impl Reader {
    pub fn open(path: &Path, limit: Option<u64>) -> Result<Self, InputError> {
        Self::open_at(path, limit, Position::default())
    }

    pub fn open_at(path: &Path, limit: Option<u64>, pos: Position) -> Result<Self, InputError> {
        let err = |source| InputError::Io {
            path: path.into(),
            source,
        };
        let mut file = File::open(path).map_err(err)?;
        file.seek(SeekFrom::Start(pos.offset)).map_err(err)?;
        Ok(Reader {
            path: path.into(),
            inner: BufReader::with_capacity(256 * 1024, file),
            buf: Vec::new(),
            pos,
            limit,
            end: None,
            head: None,
        })
    }

    /// Hashes the file's head as it is read (from the start), for [`Reader::facts`].
    pub fn with_head(mut self) -> Self {
        if self.pos.offset == 0 {
            self.head = Some(Head {
                sha: Sha256::new(),
                taken: 0,
            });
        }
        self
    }

    /// The file's size, mtime and head hash, from this reader's open file: the head is read to
    /// its end here when the lines read so far (a `--limit`, a short file) stopped before it.
    /// Call it once, after the pass; it leaves the reader where it was in lines, not in bytes.
    pub fn facts(&mut self) -> Result<FileFacts, InputError> {
        let err = |source| InputError::Io {
            path: self.path.clone(),
            source,
        };
        let meta = self.inner.get_ref().metadata().map_err(err)?;
        let mut head = self.head.take().unwrap_or(Head {
            sha: Sha256::new(),
            taken: HEAD_BYTES,
        });
        if head.taken < HEAD_BYTES && head.taken == self.pos.offset {
            let mut rest = Vec::new();
            (&mut self.inner)
                .take(HEAD_BYTES - head.taken)
                .read_to_end(&mut rest)
                .map_err(err)?;
            head.feed(&rest);
        }
        Ok(FileFacts {
            size: meta.len(),
            mtime_unix: meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
            head_sha256: super::hex(&head.sha.finalize()),
        })
    }

    /// Back to the first line, on the same open file (the pre-pass's second pass).
    pub fn rewind(&mut self) -> Result<(), InputError> {
        self.inner
            .seek(SeekFrom::Start(0))
            .map_err(|source| InputError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.pos = Position::default();
        Ok(())
    }

    /// Reads no further than byte `end`, and fails with [`InputError::Shrank`] when the file
    /// ends before it.
    pub fn until(mut self, end: u64) -> Self {
        self.end = Some(end);
        self
    }

    pub fn position(&self) -> Position {
        self.pos
    }

    /// The next non-blank line's number and bytes (line ending, trailing blanks and a leading
    /// BOM removed), borrowed until the next call.
    pub fn next_raw(&mut self) -> Result<Option<(u64, &[u8])>, InputError> {
        if self.limit.is_some_and(|l| self.pos.yielded >= l) {
            return Ok(None);
        }
        loop {
            if self.end.is_some_and(|e| self.pos.offset >= e) {
                return Ok(None);
            }
            let start = self.pos.offset;
            self.buf.clear();
            let n = self
                .inner
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| InputError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                return match self.end {
                    Some(expected) => Err(InputError::Shrank {
                        path: self.path.clone(),
                        expected,
                        at: self.pos.offset,
                    }),
                    None => Ok(None),
                };
            }
            if let Some(head) = &mut self.head {
                head.feed(&self.buf[..n]);
            }
            // A last line that grew since the pre-pass is read as the pre-pass saw it.
            if let Some(e) = self.end
                && start + n as u64 > e
            {
                self.buf.truncate((e - start) as usize);
            }
            self.pos.offset += n as u64;
            self.pos.line += 1;
            let mut line = self.buf.trim_ascii_end();
            if start == 0 {
                line = line.strip_prefix(BOM).unwrap_or(line);
            }
            if !line.trim_ascii().is_empty() {
                self.pos.yielded += 1;
                let number = self.pos.line;
                let len = line.len();
                let from = line.as_ptr() as usize - self.buf.as_ptr() as usize;
                return Ok(Some((number, &self.buf[from..from + len])));
            }
        }
    }

    pub fn next_line(&mut self, ids: &mut Ids) -> Result<Option<Line>, InputError> {
        Ok(self.next_raw()?.map(|(n, bytes)| parse_line(n, bytes, ids)))
    }
}

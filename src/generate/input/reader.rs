//! Streaming the prompt file as bytes: non-blank lines with their numbers, a UTF-8 BOM skipped,
//! resumable from a byte position, and bounded by the end the pre-pass saw, so that lines
//! appended later are left out and a file that shrank is noticed.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::{Ids, InputError, Line, parse_line};

const BOM: &[u8] = b"\xEF\xBB\xBF";

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
        })
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

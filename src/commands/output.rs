//! Where commands print: tables and JSON to stdout, messages and logs to stderr. A reader that
//! goes away (`fleet status | head -1`, a closed terminal) ends the printing, never the command:
//! the first failed write marks that stream closed and later writes are dropped, where
//! `println!` would panic with "failed printing to stdout: Broken pipe" and exit 101.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes to stdout; `false` once stdout is gone (this write included).
pub fn stdout(bytes: &[u8]) -> bool {
    write(&mut io::stdout().lock(), &STDOUT_CLOSED, bytes)
}

/// Writes to stderr; `false` once stderr is gone (this write included).
pub fn stderr(bytes: &[u8]) -> bool {
    write(&mut io::stderr().lock(), &STDERR_CLOSED, bytes)
}

fn write(stream: &mut impl Write, closed: &AtomicBool, bytes: &[u8]) -> bool {
    if closed.load(Ordering::Relaxed) {
        return false;
    }
    // EPIPE (the reader left), EIO (the terminal hung up) or a full disk: the stream is no use
    // any more, and there is nowhere left to say so.
    match stream.write_all(bytes).and_then(|()| stream.flush()) {
        Ok(()) => true,
        Err(_) => {
            closed.store(true, Ordering::Relaxed);
            false
        }
    }
}

/// The `tracing` writer: log lines to stderr through [`stderr`], so a closed stderr drops them
/// instead of tracing-subscriber reporting (with `eprintln!`, which panics) that it could not
/// write.
#[derive(Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        stderr(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

/// `print!` to stdout through [`stdout`].
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = $crate::commands::output::stdout(format!($($arg)*).as_bytes());
    }};
}

/// `println!` to stdout through [`stdout`].
macro_rules! outln {
    () => {{
        let _ = $crate::commands::output::stdout(b"\n");
    }};
    ($($arg:tt)*) => {{
        let _ = $crate::commands::output::stdout(format!("{}\n", format_args!($($arg)*)).as_bytes());
    }};
}

/// `eprint!` to stderr through [`stderr`].
macro_rules! eout {
    ($($arg:tt)*) => {{
        let _ = $crate::commands::output::stderr(format!($($arg)*).as_bytes());
    }};
}

/// `eprintln!` to stderr through [`stderr`].
macro_rules! eoutln {
    ($($arg:tt)*) => {{
        let _ = $crate::commands::output::stderr(format!("{}\n", format_args!($($arg)*)).as_bytes());
    }};
}

pub(crate) use {eout, eoutln, out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream whose reader is gone.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_stream_stops_the_printing_and_stays_closed() {
        let closed = AtomicBool::new(false);
        let mut open = Vec::new();
        assert!(write(&mut open, &closed, b"row 1\n"));
        assert!(!write(&mut Closed, &closed, b"row 2\n"));
        assert!(closed.load(Ordering::Relaxed));
        assert!(
            !write(&mut open, &closed, b"row 3\n"),
            "dropped once closed"
        );
        assert_eq!(open, b"row 1\n");
    }
}

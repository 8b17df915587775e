//! SGLang-style log lines on stderr: `[YYYY-MM-DD HH:MM:SS] msg` from the server process and
//! `[YYYY-MM-DD HH:MM:SS TP0] msg` from the scheduler (the first TP rank of this node).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// UTC civil time of a Unix timestamp (Howard Hinnant's days-from-civil inverse).
fn civil(secs: u64) -> (i64, u64, u64, u64, u64, u64) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

fn stamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")
}

fn emit(line: String) {
    let mut err = std::io::stderr().lock();
    // A closed stderr must not take the server down.
    let _ = writeln!(err, "{line}");
}

/// A line from the HTTP server process.
pub fn server(msg: &str) {
    emit(format!("[{}] {msg}", stamp()));
}

/// The TP rank this node's scheduler lines carry: node_rank × tp ÷ nnodes.
static TP_RANK: AtomicU64 = AtomicU64::new(0);

pub fn set_tp_rank(rank: u64) {
    TP_RANK.store(rank, Ordering::Relaxed);
}

/// A line from the scheduler (this node's first tensor-parallel rank; TP0 on rank 0).
pub fn tp0(msg: &str) {
    let rank = TP_RANK.load(Ordering::Relaxed);
    emit(format!("[{} TP{rank}] {msg}", stamp()));
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(super::civil(1_796_000_000), (2026, 11, 30, 0, 53, 20));
        assert_eq!(super::civil(951_782_400), (2000, 2, 29, 0, 0, 0));
    }
}

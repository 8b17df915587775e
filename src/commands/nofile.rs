//! The process's open-file limit: raised from the soft to the hard limit at start, and what it
//! leaves for sockets. A job's every request holds a socket (two through fleet's own forwards),
//! and the common soft default of 1024 is far below what a fleet of servers takes.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit in effect after.
/// Failing leaves the limit as it was: the job then budgets within it.
pub fn raise() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write only the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        } else {
            tracing::debug!(
                "cannot raise the open-file limit from {} to {}: {}",
                lim.rlim_cur,
                lim.rlim_max,
                std::io::Error::last_os_error()
            );
        }
    }
    Some(lim.rlim_cur)
}

/// The soft `RLIMIT_NOFILE` now.
pub fn soft_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct passed.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim.rlim_cur)
}

/// How many descriptors the process has open now (`/proc/self/fd`), when it can be read.
pub fn open_now() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64)
}

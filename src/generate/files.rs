//! Opening a job's files while sockets hold nearly every descriptor: an open that finds the
//! table full waits for a request to end and free one, rather than failing the job.

use std::io;
use std::time::{Duration, Instant};

/// How long an open may wait for a descriptor: requests end within their timeout, and each
/// one that ends frees one or two.
const WAIT_AT_MOST: Duration = Duration::from_secs(30);
const FIRST_WAIT: Duration = Duration::from_millis(5);
const LONGEST_WAIT: Duration = Duration::from_millis(500);

/// Runs `op` until it succeeds, fails for another reason than a full descriptor table
/// (EMFILE, ENFILE), or has waited `WAIT_AT_MOST`. Blocking: call it on the writer's thread.
pub fn when_a_descriptor_frees<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let start = Instant::now();
    let mut wait = FIRST_WAIT;
    loop {
        match op() {
            Err(e) if out_of_descriptors(&e) && start.elapsed() < WAIT_AT_MOST => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(LONGEST_WAIT);
            }
            done => return done,
        }
    }
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_is_waited_out_and_other_errors_are_not() {
        let mut tries = 0;
        let got = when_a_descriptor_frees(|| {
            tries += 1;
            if tries < 3 {
                Err(io::Error::from_raw_os_error(libc::EMFILE))
            } else {
                Ok(tries)
            }
        });
        assert_eq!(got.unwrap(), 3);

        let mut tries = 0;
        let got: io::Result<()> = when_a_descriptor_frees(|| {
            tries += 1;
            Err(io::Error::from(io::ErrorKind::PermissionDenied))
        });
        assert_eq!(got.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(tries, 1);
    }
}

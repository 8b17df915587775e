//! A child's stderr read as it comes, so that a test waits for the line that says something
//! happened instead of sleeping a fixed time and hoping it did.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
struct Seen {
    text: String,
    /// The child closed its stderr (it exited, most likely).
    closed: bool,
}

/// The stderr of a running child, collected by a thread.
pub struct Watch {
    seen: Arc<(Mutex<Seen>, Condvar)>,
    reader: Option<JoinHandle<()>>,
}

impl Watch {
    /// Takes over `child`'s stderr, which must be piped.
    pub fn stderr(child: &mut Child) -> Watch {
        let pipe = child.stderr.take().expect("the child's stderr is piped");
        let seen = Arc::new((Mutex::new(Seen::default()), Condvar::new()));
        let shared = seen.clone();
        let reader = std::thread::spawn(move || {
            let mut pipe = BufReader::new(pipe);
            let mut line = Vec::new();
            let (lock, changed) = &*shared;
            loop {
                line.clear();
                let more = matches!(pipe.read_until(b'\n', &mut line), Ok(n) if n > 0);
                let mut s = lock.lock().unwrap();
                if more {
                    s.text.push_str(&String::from_utf8_lossy(&line));
                } else {
                    s.closed = true;
                }
                changed.notify_all();
                if !more {
                    return;
                }
            }
        });
        Watch {
            seen,
            reader: Some(reader),
        }
    }

    /// Waits until stderr has said `what` `times` times; fails the test, showing what it did
    /// say, when the child closes stderr first or `limit` passes.
    pub fn wait_for(&self, what: &str, times: usize, limit: Duration) {
        let (lock, changed) = &*self.seen;
        let s = lock.lock().unwrap();
        let (s, _) = changed
            .wait_timeout_while(s, limit, |s| {
                !s.closed && s.text.matches(what).count() < times
            })
            .unwrap();
        let said = s.text.matches(what).count();
        assert!(
            said >= times,
            "waited {limit:?} for {what:?} {times} time(s), saw it {said} time(s){}; stderr:\n{}",
            if s.closed {
                " before stderr closed"
            } else {
                ""
            },
            s.text
        );
    }

    /// How many times stderr has said `what` so far.
    pub fn count(&self, what: &str) -> usize {
        self.seen.0.lock().unwrap().text.matches(what).count()
    }

    /// All of stderr, once the child has closed it.
    pub fn finish(mut self) -> String {
        if let Some(r) = self.reader.take() {
            r.join().expect("the stderr reader");
        }
        std::mem::take(&mut self.seen.0.lock().unwrap().text)
    }
}

//! The end of what holds a host's servers (a Slurm allocation's time limit) as a `generate` run
//! meets it: a note when the job's ETA runs past it, and a clean stop `stop_before_end` ahead
//! of it, so that `--resume` in a new allocation continues exactly. [`Judge`] decides on the
//! times it is given (pure; its tests run on made-up clocks); [`Watch`] reads the hosts' time
//! left through their backends and acts on what the judge says.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::launch::backend::{Backend, Ending};

/// How often the time left is read again: a job's limit can change while it runs (`scontrol
/// update JobId=J TimeLimit=...`), and between reads it is the last one less the time since.
pub const REREAD: Duration = Duration::from_secs(60);

/// What the user should read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The job's ETA runs past the end of a host's servers.
    Short {
        host: String,
        what: String,
        left: Duration,
        eta: Duration,
        /// Other hosts' servers outlive these: their work moves there when they end.
        others_go_on: bool,
    },
    /// The job stops now, `left` before the end.
    Stopping {
        host: String,
        what: String,
        left: Duration,
    },
}

impl Note {
    pub fn message(&self) -> String {
        let d = |d: &Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
        match self {
            Note::Short {
                host,
                what,
                left,
                eta,
                others_go_on: true,
            } => format!(
                "warning: {what} on {host} ends in {}, before the job's ETA ({}): its servers' \
                 work moves to the other hosts then",
                d(left),
                d(eta)
            ),
            Note::Short {
                host,
                what,
                left,
                eta,
                others_go_on: false,
            } => format!(
                "warning: {what} on {host} ends in {}, before the job's ETA ({}): the job stops \
                 cleanly ahead of the end; continue in a new allocation (`fleet up`, then the \
                 same command plus --resume)",
                d(left),
                d(eta)
            ),
            Note::Stopping { host, what, left } => format!(
                "stopping: {what} on {host} ends in {} (its stop_before_end); the output is \
                 flushed, and `fleet up` in a new allocation, then the same command plus \
                 --resume, continues exactly",
                d(left)
            ),
        }
    }
}

/// What to do now, and when to look again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub notes: Vec<Note>,
    /// Stop the job now.
    pub stop: bool,
    /// How long from now to decide again (and read the time left again), at the latest.
    pub next: Duration,
}

/// Decides, on the times it is given, when to warn and when to stop. Its clock is the time since
/// the watch began.
#[derive(Debug, Clone)]
pub struct Judge {
    /// Each host that ends: when, on the judge's clock, and what was read of it.
    ends: BTreeMap<String, (Duration, Ending)>,
    /// Some host serving the job has nothing that ends its servers: the job never has to stop.
    open_ended: bool,
    /// The notes said, so each is said once: (host, what).
    warned: BTreeSet<(String, String)>,
    stopped: bool,
}

impl Judge {
    pub fn new(open_ended: bool) -> Judge {
        Judge {
            ends: BTreeMap::new(),
            open_ended,
            warned: BTreeSet::new(),
            stopped: false,
        }
    }

    /// What was read at `now` of one host's end; it replaces what was read before.
    pub fn read(&mut self, now: Duration, ending: Ending) {
        self.ends
            .insert(ending.host.clone(), (now + ending.left, ending));
    }

    /// A host whose end can no longer be read (its job is gone, or it cannot be asked) is
    /// left to the run, which sees its servers go.
    pub fn forget(&mut self, host: &str) {
        self.ends.remove(host);
    }

    /// When the job must stop, on the judge's clock: the last end less its margin, while every
    /// host serving the job ends.
    fn stop_at(&self) -> Option<(Duration, &Ending)> {
        if self.open_ended {
            return None;
        }
        self.ends
            .values()
            .map(|(end, e)| (end.saturating_sub(e.stop_before), e))
            .max_by_key(|(at, _)| *at)
    }

    /// At `now`, with the job's ETA (`None` while its rate is not known yet).
    pub fn decide(&mut self, now: Duration, eta: Option<Duration>) -> Decision {
        let mut notes = Vec::new();
        if self.stopped {
            return Decision {
                notes,
                stop: true,
                next: REREAD,
            };
        }
        let stop_at = self.stop_at().map(|(at, e)| (at, e.clone()));
        if let Some((at, e)) = &stop_at
            && now >= *at
        {
            self.stopped = true;
            let end = self.ends[&e.host].0;
            notes.push(Note::Stopping {
                host: e.host.clone(),
                what: e.what.clone(),
                left: end.saturating_sub(now),
            });
            return Decision {
                notes,
                stop: true,
                next: REREAD,
            };
        }
        if let Some(eta) = eta {
            let last_end = self.ends.values().map(|(end, _)| *end).max();
            for (end, e) in self.ends.values() {
                let left = end.saturating_sub(now);
                let key = (e.host.clone(), e.what.clone());
                if eta > left && !self.warned.contains(&key) {
                    self.warned.insert(key);
                    notes.push(Note::Short {
                        host: e.host.clone(),
                        what: e.what.clone(),
                        left,
                        eta,
                        others_go_on: self.open_ended || last_end > Some(*end),
                    });
                }
            }
        }
        let next = match &stop_at {
            Some((at, _)) => REREAD.min(at.saturating_sub(now)),
            None => REREAD,
        };
        Decision {
            notes,
            stop: false,
            next,
        }
    }
}

/// Reads the hosts' ends while a job runs, says what the [`Judge`] notes and stops the job
/// (cancels its token) when it says so. Fed the job's ETA through its [`EtaFeed`].
pub struct Watch {
    notes: mpsc::UnboundedReceiver<Note>,
    task: Option<(JoinHandle<Option<Note>>, CancellationToken)>,
}

impl Watch {
    /// Watches the hosts of `backends` named in `hosts` (those serving the job); `stop` is the
    /// job's cancellation. A watch of hosts of which none ends does nothing.
    pub async fn start(
        backends: Vec<Arc<dyn Backend>>,
        hosts: &BTreeSet<String>,
        stop: CancellationToken,
    ) -> (Watch, EtaFeed) {
        let (eta, eta_rx) = watch::channel(None);
        let (notes_tx, notes) = mpsc::unbounded_channel();
        let serving: Vec<Arc<dyn Backend>> = backends
            .into_iter()
            .filter(|b| hosts.contains(b.host()))
            .collect();
        let began = Instant::now();
        let mut judge = Judge::new(false);
        let mut ending = Vec::new();
        for b in serving {
            match b.time_left().await {
                Ok(Some(e)) => {
                    judge.read(began.elapsed(), e);
                    ending.push(b);
                }
                Ok(None) => judge.open_ended = true,
                Err(e) => {
                    tracing::warn!(
                        "{e}; the job is not stopped ahead of the end of {}'s servers",
                        b.host()
                    );
                    judge.open_ended = true;
                }
            }
        }
        if ending.is_empty() {
            return (Watch { notes, task: None }, EtaFeed(eta));
        }
        let quit = CancellationToken::new();
        let task = tokio::spawn(follow(
            judge,
            ending,
            began,
            eta_rx,
            notes_tx,
            stop,
            quit.clone(),
        ));
        let watch = Watch {
            notes,
            task: Some((task, quit)),
        };
        (watch, EtaFeed(eta))
    }

    /// The next note; pending forever when there is none to come.
    pub async fn next_note(&mut self) -> Note {
        match self.notes.recv().await {
            Some(n) => n,
            None => std::future::pending().await,
        }
    }

    /// Ends the watch; the note it stopped the job with, if it did.
    pub async fn finish(self) -> Option<Note> {
        let (task, quit) = self.task?;
        quit.cancel();
        task.await.ok().flatten()
    }
}

/// Where the job's ETA goes to the [`Watch`].
pub struct EtaFeed(watch::Sender<Option<Duration>>);

impl EtaFeed {
    /// The job's latest ETA (`None` while its rate is not known).
    pub fn observe(&self, eta: Option<Duration>) {
        self.0.send_if_modified(|old| {
            let changed = *old != eta;
            *old = eta;
            changed
        });
    }
}

async fn follow(
    mut judge: Judge,
    ending: Vec<Arc<dyn Backend>>,
    began: Instant,
    mut eta: watch::Receiver<Option<Duration>>,
    notes: mpsc::UnboundedSender<Note>,
    stop: CancellationToken,
    quit: CancellationToken,
) -> Option<Note> {
    let mut next_read = began + REREAD;
    loop {
        let current = *eta.borrow_and_update();
        let d = judge.decide(began.elapsed(), current);
        let stopping = d
            .notes
            .iter()
            .find(|n| matches!(n, Note::Stopping { .. }))
            .cloned();
        for n in d.notes {
            let _ = notes.send(n);
        }
        if d.stop {
            stop.cancel();
            return stopping;
        }
        let wake = Instant::now() + d.next;
        tokio::select! {
            _ = quit.cancelled() => return None,
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep_until(wake) => {}
            changed = eta.changed() => {
                if changed.is_err() {
                    return None;
                }
            }
        }
        // Read again every REREAD, and just before stopping (a limit raised meanwhile counts).
        if Instant::now() >= next_read || Instant::now() >= wake {
            next_read = Instant::now() + REREAD;
            for b in &ending {
                let read = tokio::select! {
                    _ = quit.cancelled() => return None,
                    read = b.time_left() => read,
                };
                match read {
                    Ok(Some(e)) => judge.read(began.elapsed(), e),
                    Ok(None) => judge.forget(b.host()),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn ending(host: &str, left: Duration) -> Ending {
        Ending {
            host: host.into(),
            what: format!("job 7 (fleet-{host})"),
            left,
            stop_before: 2 * MIN,
        }
    }

    #[test]
    fn stops_its_margin_before_the_end_and_looks_again_by_then() {
        let mut j = Judge::new(false);
        j.read(Duration::ZERO, ending("hpc", 10 * MIN));
        let d = j.decide(Duration::ZERO, Some(MIN));
        assert_eq!((d.stop, d.notes.len(), d.next), (false, 0, REREAD));
        // 7.5 min in: the stop is 30 s away, sooner than the next read.
        let d = j.decide(7 * MIN + MIN / 2, Some(MIN));
        assert_eq!((d.stop, d.next), (false, MIN / 2));
        let d = j.decide(8 * MIN, Some(MIN));
        assert!(d.stop);
        assert_eq!(
            d.notes,
            [Note::Stopping {
                host: "hpc".into(),
                what: "job 7 (fleet-hpc)".into(),
                left: 2 * MIN
            }]
        );
        // Once.
        let d = j.decide(8 * MIN + MIN, Some(MIN));
        assert!(d.stop && d.notes.is_empty());
    }

    #[test]
    fn warns_once_when_the_eta_runs_past_the_end() {
        let mut j = Judge::new(false);
        j.read(Duration::ZERO, ending("hpc", 10 * MIN));
        assert!(j.decide(Duration::ZERO, None).notes.is_empty());
        assert!(j.decide(MIN, Some(8 * MIN)).notes.is_empty());
        let d = j.decide(2 * MIN, Some(9 * MIN));
        assert_eq!(
            d.notes,
            [Note::Short {
                host: "hpc".into(),
                what: "job 7 (fleet-hpc)".into(),
                left: 8 * MIN,
                eta: 9 * MIN,
                others_go_on: false
            }]
        );
        assert!(d.notes[0].message().contains("--resume"));
        assert!(j.decide(3 * MIN, Some(9 * MIN)).notes.is_empty());
    }

    #[test]
    fn a_host_with_no_end_keeps_the_job_going() {
        let mut j = Judge::new(true);
        j.read(Duration::ZERO, ending("hpc", 3 * MIN));
        let d = j.decide(2 * MIN, Some(10 * MIN));
        assert!(!d.stop);
        assert!(matches!(
            &d.notes[..],
            [Note::Short {
                others_go_on: true,
                ..
            }]
        ));
        assert!(!j.decide(5 * MIN, Some(10 * MIN)).stop);
    }

    #[test]
    fn with_two_allocations_the_job_stops_before_the_last_ends() {
        let mut j = Judge::new(false);
        j.read(Duration::ZERO, ending("a", 5 * MIN));
        j.read(Duration::ZERO, ending("b", 10 * MIN));
        let d = j.decide(MIN, Some(20 * MIN));
        let said: Vec<bool> = d
            .notes
            .iter()
            .map(|n| match n {
                Note::Short { others_go_on, .. } => *others_go_on,
                _ => panic!("{n:?}"),
            })
            .collect();
        assert_eq!(said, [true, false]);
        assert!(!j.decide(4 * MIN, None).stop, "a's end is not the job's");
        let d = j.decide(8 * MIN, None);
        assert!(d.stop);
        assert!(matches!(&d.notes[..], [Note::Stopping { host, .. }] if host == "b"));
    }

    #[test]
    fn a_limit_raised_meanwhile_moves_the_stop() {
        let mut j = Judge::new(false);
        j.read(Duration::ZERO, ending("hpc", 5 * MIN));
        // Read again at 2 min: the user added an hour.
        j.read(2 * MIN, ending("hpc", 63 * MIN));
        assert!(!j.decide(3 * MIN, None).stop);
        assert!(!j.decide(62 * MIN, None).stop);
        assert!(j.decide(63 * MIN, None).stop);
        // A job already past its margin when first read stops at once.
        let mut j = Judge::new(false);
        j.read(Duration::ZERO, ending("hpc", MIN));
        assert!(j.decide(Duration::ZERO, None).stop);
        // A job gone from squeue is the run's to see.
        let mut j = Judge::new(false);
        j.read(Duration::ZERO, ending("hpc", MIN));
        j.forget("hpc");
        assert!(!j.decide(Duration::ZERO, None).stop);
    }
}

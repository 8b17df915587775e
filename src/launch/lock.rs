//! One `fleet up` at a time per run directory: a lock file on the target (`<run root>.up.lock`)
//! held while `up` looks at what runs, starts servers and records them, so two `up`s of the same
//! GPUs never both start a server on one port (the loser's record would overwrite the winner's,
//! leaving a server no record knows).
//!
//! Every operation on the lock is one short script run through the transport (so it works the
//! same locally, over ssh and inside a pct container) under `flock` on `<run root>.up.guard`,
//! which makes each test-and-set atomic. Both sit beside the run root, not in it: `up` takes the
//! lock while it learns the hosts, and a preflight that refuses leaves the run root as it was. The lock names its owner (pid, machine, command) and is
//! kept fresh by a heartbeat; an owner that stops beating for [`STALE_AFTER`] lost it, and an
//! owner on this machine whose process is gone lost it at once.
//!
//! Within one process (a sweep starts its batches side by side), starts on one run directory
//! take turns on an in-process mutex first: the next one goes the moment the last releases,
//! instead of polling the file and reporting its own process as "another `fleet up`".

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::launch::backend::machine::proc::ProcStat;
use crate::remote::{RemoteError, Transport};

/// How often the owner touches the lock.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// A lock not touched for this long belongs to an `up` that is gone.
pub const STALE_AFTER: Duration = Duration::from_secs(30);
/// How long an `up` waits for another one to finish with a host before giving up on it.
pub const WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(250);

/// `$1` run root, `$2` operation, `$3` token, `$4` owner (JSON), `$5` stale after (s). The lock
/// file is the holder's token, then its owner. `take` prints `taken`, or `taken\nAGE\n` and the
/// old lock over a stale one, or `held\nAGE\n` and the lock; `beat` prints `ok` or `lost`;
/// `release` and `break` remove the lock if it is still token `$3`'s, and print `ok`.
const SCRIPT: &str = r#"root=${1%/}; op=$2; token=$3; owner=$4; stale=$5
mkdir -p -- "$(dirname -- "$root")" || exit 1
exec 9>>"$root.up.guard" || exit 1
flock -w 10 9 || { echo "flock on $root.up.guard: no turn within 10s" >&2; exit 1; }
lock=$root.up.lock
if [ -f "$lock" ]; then
  held=$(head -n 1 "$lock"); age=$(( $(date +%s) - $(stat -c %Y "$lock") ))
else
  held=; age=0
fi
old=
case $op in
take)
  if [ -n "$held" ] && [ "$held" != "$token" ]; then
    if [ "$age" -le "$stale" ]; then printf 'held\n%s\n' "$age"; cat "$lock"; exit 0; fi
    old=$(cat "$lock")
  fi
  printf '%s\n%s\n' "$token" "$owner" >"$lock.tmp" && mv -f "$lock.tmp" "$lock" || exit 1
  if [ -n "$old" ]; then printf 'taken\n%s\n%s\n' "$age" "$old"; else echo taken; fi ;;
beat)
  if [ "$held" = "$token" ]; then touch "$lock" && echo ok; else echo lost; fi ;;
release|break)
  if [ "$held" = "$token" ]; then rm -f "$lock"; fi; echo ok ;;
esac"#;

/// Who holds a lock, as the lock file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// The machine `fleet up` runs on (its hostname).
    pub machine: String,
    /// `/proc/sys/kernel/random/boot_id` and the pid namespace: with both equal to ours, the
    /// pid can be looked up here.
    pub boot_id: String,
    pub pid_ns: String,
    /// The owner's start time in clock ticks after boot: a pid with another is another process.
    pub start_ticks: u64,
    /// Seconds since the Unix epoch.
    pub since: u64,
    pub command: String,
}

impl Owner {
    /// This process.
    pub fn me() -> Owner {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let pid = std::process::id();
        Owner {
            pid,
            machine: read("/proc/sys/kernel/hostname"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            pid_ns: std::fs::read_link("/proc/self/ns/pid")
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            start_ticks: ProcStat::parse(&read("/proc/self/stat")).map_or(0, |s| s.start_ticks),
            since: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            command: std::env::args().collect::<Vec<_>>().join(" "),
        }
    }

    /// For messages: `pid 4242 on laptop (fleet up --profile sim), since 2026-12-01T10:00:00Z`.
    pub fn describe(&self) -> String {
        let since = UNIX_EPOCH + Duration::from_secs(self.since);
        format!(
            "pid {} on {} ({}), since {}",
            self.pid,
            self.machine,
            self.command,
            humantime::format_rfc3339_seconds(since)
        )
    }

    /// Known to be gone: it ran on this machine, in this pid namespace, and its process is not
    /// there any more. An owner elsewhere is judged by its heartbeat alone.
    fn gone(&self, me: &Owner) -> bool {
        if self.boot_id.is_empty() || self.boot_id != me.boot_id || self.pid_ns != me.pid_ns {
            return false;
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| ProcStat::parse(s.trim()));
        !stat.is_some_and(|s| s.start_ticks == self.start_ticks && s.running())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "{host}: another `fleet up` holds {path}: {holder}, last heartbeat {age}s ago; nothing \
         was started there\n  hint: wait for it to finish; if it is gone, the lock frees itself \
         {}s after its last heartbeat",
        STALE_AFTER.as_secs()
    )]
    Held {
        host: String,
        path: String,
        holder: String,
        age: u64,
    },
    #[error("{host}: cannot lock the run directory {root}: {message}")]
    Command {
        host: String,
        root: String,
        message: String,
    },
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("interrupted while waiting for the run directory lock")]
    Interrupted,
}

/// What one `take` found.
#[derive(Debug, PartialEq)]
enum Take {
    /// With the age and owner of the stale lock it replaced, if any.
    Taken { stale: Option<(u64, Option<Owner>)> },
    Held {
        age: u64,
        token: String,
        owner: Option<Owner>,
    },
}

fn parse_take(out: &str) -> Option<Take> {
    let mut lines = out.lines();
    let verdict = lines.next()?;
    let age = lines.next().and_then(|a| a.trim().parse().ok());
    let token = lines.next().unwrap_or_default().trim().to_string();
    let owner = lines.next().and_then(|o| serde_json::from_str(o).ok());
    match verdict {
        "taken" => Some(Take::Taken {
            stale: age.map(|a| (a, owner)),
        }),
        "held" => Some(Take::Held {
            age: age.unwrap_or(0),
            token,
            owner,
        }),
        _ => None,
    }
}

/// A held lock on one host's run directory; [`HostLock::release`] gives it back.
pub struct HostLock {
    host: String,
    beat: CancellationToken,
    heartbeat: Option<JoinHandle<()>>,
    ops: Ops,
    /// This process's turn on the run directory, held as long as the lock.
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

/// A run directory's turn among this process's starts.
type Turn = Arc<tokio::sync::Mutex<()>>;

/// One turn per run directory (host and root).
static TURNS: LazyLock<Mutex<HashMap<(String, String), Turn>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn turn_of(host: &str, root: &str) -> Turn {
    let mut turns = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    turns
        .entry((host.to_string(), root.to_string()))
        .or_default()
        .clone()
}

/// Runs the lock script on one host.
#[derive(Clone)]
struct Ops {
    t: Arc<dyn Transport>,
    root: String,
    token: String,
    owner: String,
}

impl Ops {
    async fn run(&self, op: &str, token: &str) -> Result<String, LockError> {
        let stale = STALE_AFTER.as_secs().to_string();
        let argv: Vec<String> = [
            "sh",
            "-c",
            SCRIPT,
            "fleet-lock",
            &self.root,
            op,
            token,
            &self.owner,
            &stale,
        ]
        .map(String::from)
        .into();
        let out = self.t.run(&argv).await?;
        if !out.success() {
            return Err(LockError::Command {
                host: self.t.host().to_string(),
                root: self.root.clone(),
                message: out.stderr_lossy().trim().to_string(),
            });
        }
        Ok(out.stdout_lossy())
    }
}

/// Takes the run directory lock of `t`'s host, waiting up to [`WAIT`] for another `up` to
/// finish with it, and keeps it fresh until released. `token` is this `up`'s, shared by its
/// hosts (two inventory hosts on one machine share one run directory).
pub async fn acquire(
    t: Arc<dyn Transport>,
    root: &str,
    me: &Owner,
    token: &str,
    cancel: &CancellationToken,
) -> Result<HostLock, LockError> {
    let host = t.host().to_string();
    let turn = tokio::select! {
        _ = cancel.cancelled() => return Err(LockError::Interrupted),
        turn = turn_of(&host, root).lock_owned() => turn,
    };
    let ops = Ops {
        t,
        root: root.to_string(),
        token: token.to_string(),
        owner: serde_json::to_string(me).expect("an owner serializes"),
    };
    let path = format!("{}.up.lock", root.trim_end_matches('/'));
    let deadline = Instant::now() + WAIT;
    let mut told = false;
    loop {
        let out = ops.run("take", token).await?;
        let found = parse_take(&out).ok_or_else(|| LockError::Command {
            host: host.clone(),
            root: root.to_string(),
            message: format!("unexpected answer {:?}", out.trim()),
        })?;
        let (age, held, owner) = match found {
            Take::Taken { stale } => {
                if let Some((age, owner)) = stale {
                    let who = owner.map_or("an unknown owner".into(), |o| o.describe());
                    tracing::warn!(
                        "{host}: took over the run directory lock of {who}, silent for {age}s"
                    );
                }
                return Ok(HostLock::start(host, ops, turn));
            }
            Take::Held { age, token, owner } => (age, token, owner),
        };
        if let Some(o) = owner.as_ref().filter(|o| o.gone(me)) {
            tracing::warn!(
                "{host}: the run directory lock's owner ({}) is gone; taking it over",
                o.describe()
            );
            // Only the lock as it was seen: a new owner may have taken it meanwhile.
            ops.run("break", &held).await?;
            continue;
        }
        let holder = owner.map_or("an unknown owner".into(), |o| o.describe());
        if Instant::now() >= deadline {
            return Err(LockError::Held {
                host,
                path,
                holder,
                age,
            });
        }
        if !told {
            tracing::info!("{host}: waiting for another `fleet up` to finish here: {holder}");
            told = true;
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(LockError::Interrupted),
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

impl HostLock {
    fn start(host: String, ops: Ops, turn: tokio::sync::OwnedMutexGuard<()>) -> HostLock {
        let beat = CancellationToken::new();
        let heartbeat = Some(tokio::spawn(heartbeat(ops.clone(), beat.clone())));
        HostLock {
            host,
            beat,
            heartbeat,
            ops,
            _turn: turn,
        }
    }

    /// Stops the heartbeat and removes the lock (only if it is still this `up`'s).
    pub async fn release(mut self) {
        self.beat.cancel();
        if let Some(beating) = self.heartbeat.take() {
            let _ = beating.await;
        }
        if let Err(e) = self.ops.run("release", &self.ops.token).await {
            tracing::warn!(
                "{}: could not release the run directory lock ({e}); it frees itself {}s later",
                self.host,
                STALE_AFTER.as_secs()
            );
        }
    }
}

impl Drop for HostLock {
    /// A lock dropped unreleased (a panic) stops beating, so it goes stale instead of living on.
    fn drop(&mut self) {
        self.beat.cancel();
    }
}

async fn heartbeat(ops: Ops, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(HEARTBEAT) => {}
        }
        match ops.run("beat", &ops.token).await {
            Ok(answer) if answer.trim() == "lost" => {
                tracing::warn!(
                    "{}: this `fleet up` lost its run directory lock (silent for over {}s)",
                    ops.t.host(),
                    STALE_AFTER.as_secs()
                );
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!("{}: lock heartbeat: {e}", ops.t.host()),
        }
    }
}

/// A random token naming one `up`'s locks.
pub fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_answers_parse() {
        assert_eq!(parse_take("taken\n"), Some(Take::Taken { stale: None }));
        let me = Owner::me();
        let json = serde_json::to_string(&me).unwrap();
        assert_eq!(
            parse_take(&format!("held\n3\nabc\n{json}\n")),
            Some(Take::Held {
                age: 3,
                token: "abc".into(),
                owner: Some(me.clone())
            })
        );
        assert_eq!(
            parse_take(&format!("taken\n45\nabc\n{json}\n")),
            Some(Take::Taken {
                stale: Some((45, Some(me)))
            })
        );
        assert_eq!(parse_take("what\n"), None);
    }

    #[test]
    fn an_owner_here_is_gone_when_its_process_is() {
        let me = Owner::me();
        assert!(!me.gone(&me), "this process runs");
        let other_start = Owner {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(other_start.gone(&me), "the pid is another process now");
        let elsewhere = Owner {
            boot_id: "another-machine".into(),
            pid: u32::MAX,
            ..me.clone()
        };
        assert!(!elsewhere.gone(&me), "judged by its heartbeat alone");
    }

    #[tokio::test]
    async fn starts_of_one_process_take_turns_without_waiting_on_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let run_root = dir.path().join("fleet");
        let root = run_root.to_str().unwrap();
        let t: Arc<dyn Transport> = Arc::new(crate::remote::LocalTransport::new("local"));
        let me = Owner::me();
        let cancel = CancellationToken::new();
        let first = acquire(t.clone(), root, &me, &token(), &cancel)
            .await
            .unwrap();
        let second = tokio::spawn({
            let (t, root, me, cancel) = (t.clone(), root.to_string(), me.clone(), cancel.clone());
            async move { acquire(t, &root, &me, &token(), &cancel).await }
        });
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "the second start waits for its turn");
        first.release().await;
        // Its turn comes as the first releases: it never met the file held by its own process.
        let second = second.await.unwrap().unwrap();
        second.release().await;
        assert!(!dir.path().join("fleet.up.lock").exists());
        assert!(
            !run_root.exists(),
            "the lock lives beside the run root, not in it"
        );
    }
}

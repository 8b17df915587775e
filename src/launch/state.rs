//! What fleet leaves on a target and reads back: the instance records in the run directory, the
//! process table (`/proc/<pid>/stat`) that tells a live server from a dead or reused pid, and
//! the listening TCP ports (`/proc/net/tcp*`). Parsing is pure; reading goes through a transport.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::launch::plan::{RunFiles, SECRETS_FILE, Secret};
use crate::remote::{RemoteError, Transport, argv, mask};
use crate::sglang::client::Endpoint;

/// `instance.json`: written by `up` once the server is started; read by status, down and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub host: String,
    pub gpu: u32,
    pub port: u16,
    pub profile: String,
    pub fingerprint: String,
    /// The argv with secrets masked.
    pub argv: Vec<String>,
    /// Where the server is reached from the SSH side.
    pub address: String,
    /// Process (and process group) id.
    pub pid: u32,
    /// The process's start time in clock ticks after boot (`/proc/<pid>/stat` field 22): a pid
    /// with another start time is another process.
    pub start_ticks: u64,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    /// The environment variable holding the server's API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    pub dir: String,
    pub log: String,
    pub pidfile: String,
    pub record: String,
}

impl InstanceRecord {
    /// The server as an HTTP endpoint through a local port forwarded to it. The API key comes
    /// from the environment variable the profile named, here as at `up`.
    pub fn endpoint(&self, forwarded: std::net::SocketAddr) -> Endpoint {
        Endpoint {
            name: format!("{}:gpu{}", self.host, self.gpu),
            base_url: format!("http://{forwarded}"),
            api_key: self
                .api_key_env
                .as_ref()
                .and_then(|v| std::env::var(v).ok()),
        }
    }
}

/// One line of `/proc/<pid>/stat`, the fields fleet needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    pub state: char,
    pub pgrp: u32,
    pub start_ticks: u64,
}

impl ProcStat {
    /// A zombie has exited; it only waits to be reaped (containers' init may never do it).
    pub fn running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// `/proc/<pid>/stat`: the command name is in parentheses and may hold spaces or `)`, so
    /// fields are counted from the last `)`.
    pub fn parse(line: &str) -> Option<ProcStat> {
        let open = line.find(" (")?;
        let close = line.rfind(')')?;
        let pid = line[..open].trim().parse().ok()?;
        let fields: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
        Some(ProcStat {
            pid,
            state: fields.first()?.chars().next()?,
            pgrp: fields.get(2)?.parse().ok()?,
            start_ticks: fields.get(19)?.parse().ok()?,
        })
    }
}

/// A snapshot of a target's processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcTable {
    by_pid: BTreeMap<u32, ProcStat>,
}

/// What became of a recorded server process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    Running,
    /// Gone, or a zombie.
    Dead,
    /// The pid now belongs to another process: never touch it.
    Reused,
}

impl ProcTable {
    pub fn parse(text: &str) -> ProcTable {
        let by_pid = text
            .lines()
            .filter_map(ProcStat::parse)
            .map(|p| (p.pid, p))
            .collect();
        ProcTable { by_pid }
    }

    pub fn liveness(&self, pid: u32, start_ticks: u64) -> Liveness {
        match self.by_pid.get(&pid) {
            Some(p) if p.start_ticks != start_ticks => Liveness::Reused,
            Some(p) if p.running() => Liveness::Running,
            _ => Liveness::Dead,
        }
    }

    /// Running members of process group `pgid` (a server's workers outlive a dead leader).
    pub fn group(&self, pgid: u32) -> Vec<u32> {
        self.by_pid
            .values()
            .filter(|p| p.pgrp == pgid && p.running())
            .map(|p| p.pid)
            .collect()
    }
}

/// Ports in LISTEN state in `/proc/net/tcp` or `/proc/net/tcp6` text.
pub fn parse_listening(text: &str) -> BTreeSet<u16> {
    const LISTEN: &str = "0A";
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            let port = local.rsplit_once(':')?.1;
            (state == LISTEN)
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// Errors reading or writing fleet's state on a target.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("{host}: `{command}` failed: {stderr}")]
    Command {
        host: String,
        command: String,
        stderr: String,
    },
}

/// Runs an argv and insists on success; the failure names the command, secrets masked.
pub(crate) async fn run_ok(t: &dyn Transport, argv: &[String]) -> Result<String, StateError> {
    let out = t.run(argv).await?;
    if out.success() {
        Ok(out.stdout_lossy())
    } else {
        Err(StateError::Command {
            host: t.host().to_string(),
            command: mask(&argv.join(" ")),
            stderr: out.stderr_lossy().trim().to_string(),
        })
    }
}

/// What a stopped instance's `instance.json` becomes, beside its log: `fleet logs` still finds
/// the log by `host:gpu` or port until the next server on that port replaces both.
const STOPPED_RECORD: &str = "stopped.json";

/// Every instance record under the run root. A record that does not parse (half-written by an
/// interrupted `up`) is skipped with a warning naming its port.
pub async fn read_records(
    t: &dyn Transport,
    run_root: &str,
) -> Result<Vec<InstanceRecord>, StateError> {
    read_json(t, run_root, "instance.json").await
}

/// The records whose process still runs (its pid with its start time): what `fleet up` left
/// running.
pub async fn live_records(
    t: &dyn Transport,
    run_root: &str,
) -> Result<Vec<InstanceRecord>, StateError> {
    let (records, table) = tokio::try_join!(read_records(t, run_root), proc_table(t))?;
    Ok(records
        .into_iter()
        .filter(|r| table.liveness(r.pid, r.start_ticks) == Liveness::Running)
        .collect())
}

/// The records of instances fleet stopped whose directories are still there.
pub async fn read_stopped_records(
    t: &dyn Transport,
    run_root: &str,
) -> Result<Vec<InstanceRecord>, StateError> {
    read_json(t, run_root, STOPPED_RECORD).await
}

async fn read_json(
    t: &dyn Transport,
    run_root: &str,
    name: &str,
) -> Result<Vec<InstanceRecord>, StateError> {
    let script = r#"for f in "$1"/*/"$2"; do [ -f "$f" ] && cat "$f" && printf '\000'; done; true"#;
    let text = run_ok(t, &argv(&["sh", "-c", script, "sh", run_root, name])).await?;
    let mut records = Vec::new();
    for item in text.split('\0').filter(|s| !s.trim().is_empty()) {
        match serde_json::from_str::<InstanceRecord>(item) {
            Ok(r) => records.push(r),
            Err(e) => tracing::warn!(
                "{}: skipping an unreadable record under {run_root}: {e}",
                t.host()
            ),
        }
    }
    records.sort_by_key(|r| (r.gpu, r.port));
    Ok(records)
}

/// Writes a started instance's record; the stopped record of an earlier server on the port goes,
/// since the new server's log replaces that one's.
pub async fn write_record(t: &dyn Transport, record: &InstanceRecord) -> Result<(), StateError> {
    let json = serde_json::to_string(record).expect("a record always serializes");
    // Written aside and renamed so that a reader never sees half a record.
    let script = r#"printf '%s\n' "$1" > "$2.tmp" && mv -f "$2.tmp" "$2" && rm -f "$3""#;
    let stopped = stopped_path(record);
    run_ok(
        t,
        &argv(&["sh", "-c", script, "sh", &json, &record.record, &stopped]),
    )
    .await
    .map(drop)
}

/// Makes an instance's run directory ready for a start: the directory and the server log
/// readable by their owner only (the log shows the API key in `server_args=`: SGLang 0.5.23
/// prints it in plain text, srt/entrypoints/engine.py), and the secrets file, when there is
/// one, written with mode 0600 from its bytes on stdin, so the key is in no argv or script.
/// The start then truncates the log, which keeps its mode.
pub async fn prepare_run_dir(
    t: &dyn Transport,
    files: &RunFiles,
    secrets: Option<&Secret>,
) -> Result<(), StateError> {
    let script = r#"umask 077 && mkdir -p -- "$1" && chmod 700 -- "$1" && : >>"$2" && chmod 600 -- "$2" || exit 1
if [ "$4" = write ]; then
  rm -f -- "$3.tmp" && cat >"$3.tmp" && chmod 600 -- "$3.tmp" && mv -f -- "$3.tmp" "$3"
else
  cat >/dev/null && rm -f -- "$3"
fi"#;
    let (what, bytes) = match secrets {
        Some(s) => ("write", s.0.as_bytes()),
        None => ("remove", &b""[..]),
    };
    let argv = argv(&[
        "sh",
        "-c",
        script,
        "sh",
        &files.dir,
        &files.log,
        &files.secrets,
        what,
    ]);
    let out = t.run_input(&argv, bytes).await?;
    if out.success() {
        Ok(())
    } else {
        Err(StateError::Command {
            host: t.host().to_string(),
            command: format!("prepare {}", files.dir),
            stderr: out.stderr_lossy().trim().to_string(),
        })
    }
}

/// Forgets a stopped instance: its record becomes the stopped record kept beside its log, for
/// `fleet logs`; its secrets file goes.
pub async fn remove_record(t: &dyn Transport, record: &InstanceRecord) -> Result<(), StateError> {
    let script = r#"rm -f "$3" "$4" && if [ -f "$1" ]; then mv -f "$1" "$2"; fi"#;
    let secrets = format!("{}/{SECRETS_FILE}", record.dir.trim_end_matches('/'));
    let stopped = stopped_path(record);
    run_ok(
        t,
        &argv(&[
            "sh",
            "-c",
            script,
            "sh",
            &record.record,
            &stopped,
            &record.pidfile,
            &secrets,
        ]),
    )
    .await
    .map(drop)
}

fn stopped_path(record: &InstanceRecord) -> String {
    format!("{}/{STOPPED_RECORD}", record.dir.trim_end_matches('/'))
}

pub async fn proc_table(t: &dyn Transport) -> Result<ProcTable, StateError> {
    let script = "cat /proc/[0-9]*/stat 2>/dev/null; true";
    Ok(ProcTable::parse(
        &run_ok(t, &argv(&["sh", "-c", script])).await?,
    ))
}

/// One process's stat line, or `None` when it is gone.
pub async fn proc_stat(t: &dyn Transport, pid: u32) -> Result<Option<ProcStat>, StateError> {
    let out = t.run(&argv(&["cat", &format!("/proc/{pid}/stat")])).await?;
    Ok(if out.success() {
        ProcStat::parse(out.stdout_lossy().trim())
    } else {
        None
    })
}

pub async fn listening_ports(t: &dyn Transport) -> Result<BTreeSet<u16>, StateError> {
    let script = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null; true";
    Ok(parse_listening(
        &run_ok(t, &argv(&["sh", "-c", script])).await?,
    ))
}

/// Sends `signal` (e.g. `TERM`, `KILL`) to a whole process group.
pub async fn signal_group(t: &dyn Transport, pgid: u32, signal: &str) -> Result<(), StateError> {
    let out = t
        .run(&argv(&[
            "kill",
            &format!("-{signal}"),
            "--",
            &format!("-{pgid}"),
        ]))
        .await?;
    // A group that emptied since the last look is what we wanted anyway.
    if out.success() || out.stderr_lossy().contains("No such process") {
        Ok(())
    } else {
        Err(StateError::Command {
            host: t.host().to_string(),
            command: format!("kill -{signal} -- -{pgid}"),
            stderr: out.stderr_lossy().trim().to_string(),
        })
    }
}

/// The last `lines` lines of a server log on the target (empty when it does not exist), with
/// the secrets SGLang logs masked.
pub async fn tail(t: &dyn Transport, path: &str, lines: usize) -> Result<String, StateError> {
    let script = r#"[ -f "$2" ] && tail -n "$1" "$2"; true"#;
    run_ok(
        t,
        &argv(&["sh", "-c", script, "sh", &lines.to_string(), path]),
    )
    .await
    .map(|text| mask(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_with_awkward_command_names() {
        let line =
            "4242 (python3 (sgl) x) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 3 0 987654 0 0";
        assert_eq!(
            ProcStat::parse(line),
            Some(ProcStat {
                pid: 4242,
                state: 'S',
                pgrp: 4242,
                start_ticks: 987654
            })
        );
        assert_eq!(ProcStat::parse("garbage"), None);
    }

    #[test]
    fn liveness_tells_dead_zombie_and_reused_apart() {
        let table = ProcTable::parse(
            "10 (srv) S 1 10 10 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0\n\
             11 (worker) R 10 10 10 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 510 0 0\n\
             20 (srv) Z 1 20 20 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 600 0 0\n\
             30 (bash) S 1 30 30 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0\n",
        );
        assert_eq!(table.liveness(10, 500), Liveness::Running);
        assert_eq!(table.liveness(20, 600), Liveness::Dead);
        assert_eq!(table.liveness(30, 700), Liveness::Reused);
        assert_eq!(table.liveness(40, 1), Liveness::Dead);
        assert_eq!(table.group(10), vec![10, 11]);
        assert_eq!(table.group(20), Vec::<u32>::new());
    }

    #[test]
    fn listening_ports_from_proc_net_tcp() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:7535 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:7536 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0\n\
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 3 1 0 100 0 0 10 0\n";
        assert_eq!(parse_listening(tcp), BTreeSet::from([30005, 8080]));
    }
}

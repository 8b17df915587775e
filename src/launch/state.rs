//! What fleet keeps in the run directory on a host's shell and reads back, whatever backend runs
//! the servers: each started server's record (the recorded stage of a server, with the
//! backend's [`Handle`] to it), the record a stopped server leaves beside its log, the secrets
//! file, and the logs' tails. Every operation is one short script through the shell's
//! transport.

use serde::{Deserialize, Serialize};

use crate::launch::plan::{RunFiles, SECRETS_FILE, Secret};
use crate::remote::{Detached, RemoteError, Transport, argv, mask, parse_started, spawn_argv};
use crate::server::{ServerId, host_gpu};
use crate::sglang::client::Endpoint;

/// `instance.json`: a started server, written by its backend once it runs; read by status,
/// down, logs, generate and sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRecord {
    #[serde(flatten, with = "host_gpu")]
    pub id: ServerId,
    pub port: u16,
    pub profile: String,
    pub fingerprint: String,
    /// The argv with secrets masked.
    pub argv: Vec<String>,
    /// Where the server is reached from the SSH side.
    pub address: String,
    /// How the backend finds the server again.
    #[serde(flatten)]
    pub handle: Handle,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    /// The environment variable holding the server's API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    pub dir: String,
    pub log: String,
    pub pidfile: String,
    pub record: String,
    /// The server's GPUs and their slowest link, when it spans several (its id names the
    /// first); absent for one GPU, and in records written before layouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::layout::Group>,
    /// Who started it; absent in records written before owners were, which count as another
    /// fleet's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<crate::launch::owner::Owner>,
    /// The server's other nodes (rank 1 on) when it spans several; `handle` is rank 0's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankRecord>,
}

/// A rank ≥ 1 of a server over several nodes, as started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankRecord {
    #[serde(flatten)]
    pub handle: Handle,
    pub log: String,
    pub pidfile: String,
}

/// How a backend finds a server it started again. The kind of backend decides the kind of
/// handle; each is stored flat in the record, as its own fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Handle {
    /// A process group on a machine: its leader's pid (also the group's id) and the leader's
    /// start time in clock ticks after boot (`/proc/<pid>/stat` field 22), since a pid with
    /// another start time is another process.
    Process { pid: u32, start_ticks: u64 },
    /// A step of a Slurm job (`srun` on the host's shell is its lifeline): the job, the step's
    /// number in it, the node Slurm runs it on, and the GPUs Slurm gave it (the step's
    /// `CUDA_VISIBLE_DEVICES`).
    Step {
        job: crate::slurm::JobId,
        step: u32,
        node: String,
        gpus: String,
    },
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handle::Process { pid, .. } => write!(f, "pid {pid}"),
            Handle::Step {
                job,
                step,
                node,
                gpus,
            } => write!(f, "step {job}.{step} on {node} gpu {gpus}"),
        }
    }
}

impl Handle {
    /// The process id to show, where the server is a process fleet can name.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Handle::Process { pid, .. } => Some(*pid),
            Handle::Step { .. } => None,
        }
    }
}

/// What became of a recorded server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    Running,
    /// Gone, or a zombie.
    Dead,
    /// The handle now names another server or process: never touch it.
    Reused,
}

impl InstanceRecord {
    /// The inventory host it runs on.
    pub fn host(&self) -> &str {
        self.id.host().unwrap_or_default()
    }

    /// `ct200 gpu5 :30005`, as up, down and the sweep name a server in messages.
    pub fn label(&self) -> String {
        crate::launch::plan::group_label(&self.id, self.gpus(), self.port)
    }

    /// The record of `planned`, started now as `handle` (rank 0's) with its other `ranks`.
    pub fn started(
        planned: &crate::launch::plan::Instance,
        handle: Handle,
        ranks: Vec<RankRecord>,
        owner: &crate::launch::owner::Owner,
    ) -> InstanceRecord {
        InstanceRecord {
            id: planned.id.clone(),
            port: planned.port,
            profile: planned.profile.clone(),
            fingerprint: planned.fingerprint.clone(),
            argv: planned.display_argv(),
            address: planned.address.clone(),
            handle,
            started_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            api_key_env: planned.api_key_env.clone(),
            dir: planned.files.dir.clone(),
            log: planned.files.log.clone(),
            pidfile: planned.files.pidfile.clone(),
            record: planned.files.record.clone(),
            group: planned.group.if_multi(),
            ranks,
            owner: Some(owner.clone()),
        }
    }

    /// How the backend finds every process of the server: rank 0's, then the other ranks'.
    pub fn handles(&self) -> impl Iterator<Item = &Handle> {
        std::iter::once(&self.handle).chain(self.ranks.iter().map(|r| &r.handle))
    }

    /// Every GPU of the server, its id's first.
    pub fn gpus(&self) -> &[u32] {
        match (&self.group, &self.id) {
            (Some(g), _) => &g.gpus,
            (None, ServerId::Gpu { gpu, .. }) => std::slice::from_ref(gpu),
            (None, ServerId::Named(_)) => &[],
        }
    }

    /// The server as an HTTP endpoint through a local port forwarded to it. The API key comes
    /// from the environment variable the profile named, here as at `up`.
    pub fn endpoint(&self, forwarded: std::net::SocketAddr) -> Endpoint {
        Endpoint {
            id: self.id.clone(),
            base_url: format!("http://{forwarded}"),
            api_key: self
                .api_key_env
                .as_ref()
                .and_then(|v| std::env::var(v).ok()),
        }
    }
}

/// Errors reading or writing fleet's state on a target.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
    #[error("{host}: `{command}` failed: {stderr}")]
    Command {
        host: String,
        command: String,
        stderr: String,
    },
    #[error(
        "{host}: no running allocation there to hold the job: start its servers first \
         (`fleet up --profile P`)"
    )]
    NoAllocation { host: String },
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
    records.sort_by_key(|r| (r.id.gpu_index(), r.port));
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

/// Makes an instance's run directory ready for a start: `$1` the directory and `$2` the server
/// log readable by their owner only (the log shows the API key in `server_args=`: SGLang 0.5.23
/// prints it in plain text, srt/entrypoints/engine.py), and `$3` the secrets file, when `$4`
/// is `write`, written with mode 0600 from its bytes on stdin, so the key is in no argv or
/// script. The start then truncates the log, which keeps its mode.
const PREPARE: &str = r#"umask 077 && mkdir -p -- "$1" && chmod 700 -- "$1" && : >>"$2" && chmod 600 -- "$2" || exit 1
if [ "$4" = write ]; then
  rm -f -- "$3.tmp" && cat >"$3.tmp" && chmod 600 -- "$3.tmp" && mv -f -- "$3.tmp" "$3" || exit 1
else
  cat >/dev/null && rm -f -- "$3" || exit 1
fi"#;

/// [`PREPARE`]'s argv and the bytes for its stdin; `then`, when given, is the script's tail.
fn prepare_argv<'a>(
    files: &RunFiles,
    secrets: Option<&'a Secret>,
    then: &str,
) -> (Vec<String>, &'a [u8]) {
    let (what, bytes) = match secrets {
        Some(s) => ("write", s.0.as_bytes()),
        None => ("remove", &b""[..]),
    };
    let script = format!("{PREPARE}{then}");
    let argv = argv(&[
        "sh",
        "-c",
        &script,
        "sh",
        &files.dir,
        &files.log,
        &files.secrets,
        what,
    ]);
    (argv, bytes)
}

/// Prepares an instance's run directory ([`PREPARE`]).
pub async fn prepare_run_dir(
    t: &dyn Transport,
    files: &RunFiles,
    secrets: Option<&Secret>,
) -> Result<(), StateError> {
    let (argv, bytes) = prepare_argv(files, secrets, "");
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

/// Prepares an instance's run directory and starts `d` detached in it, in one command on the
/// host: on a Proxmox host each command pays `pct exec`'s own start, and a server's start is
/// on the path to its readiness. The pid the process wrote, as [`Transport::spawn_detached`],
/// and its `/proc` stat line where it was still there to read.
pub async fn start_in_run_dir(
    t: &dyn Transport,
    files: &RunFiles,
    secrets: Option<&Secret>,
    d: &Detached,
) -> Result<(u32, Option<String>), StateError> {
    let (mut argv, bytes) = prepare_argv(files, secrets, "\nshift 4 && exec \"$@\"");
    argv.extend(spawn_argv(t.host(), d)?);
    let out = t.run_input(&argv, bytes).await?;
    Ok(parse_started(t.host(), d, &out)?)
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
    fn a_record_reads_back_from_the_fields_it_has_always_had() {
        // As `fleet up` has written instance.json: the id and the handle are plain fields.
        let text = r#"{"host":"ct200","gpu":5,"port":30005,"profile":"p","fingerprint":"ab",
            "argv":["sglang-sim"],"address":"10.1.2.50","pid":4242,"start_ticks":987654,
            "started_at":1700000000,"dir":"/tmp/fleet/30005","log":"/tmp/fleet/30005/server.log",
            "pidfile":"/tmp/fleet/30005/pid","record":"/tmp/fleet/30005/instance.json"}"#;
        let r: InstanceRecord = serde_json::from_str(text).unwrap();
        assert_eq!(r.id, ServerId::gpu("ct200", 5));
        assert_eq!(
            r.handle,
            Handle::Process {
                pid: 4242,
                start_ticks: 987654
            }
        );
        assert_eq!((r.host(), r.label()), ("ct200", "ct200 gpu5 :30005".into()));
        assert_eq!(r.api_key_env, None);
        let back: serde_json::Value = serde_json::to_value(&r).unwrap();
        let before: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut expected = before.as_object().unwrap().clone();
        expected.insert("api_key_env".into(), serde_json::Value::Null);
        assert_eq!(back.as_object().unwrap(), &expected);
        let e = r.endpoint("127.0.0.1:40000".parse().unwrap());
        assert_eq!(
            (e.id, e.base_url.as_str()),
            (r.id, "http://127.0.0.1:40000")
        );
    }
}

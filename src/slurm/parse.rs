//! Readers for what Slurm's commands print: `sbatch --parsable`, `squeue` rows in the formats
//! [`super::argv`] asks for, and `scontrol --oneliner show job|node` records. Pure: each takes
//! the text and returns typed values, or the line it could not read and why.

use serde::Serialize;

use super::state::{JobId, JobState, NodeState, Reason, StepId};
use super::time::{SlurmTime, parse_time};

/// Why a line of output could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("no output")]
    Empty,
    #[error("expected {expected} fields separated by `|`, found {found}")]
    Fields { expected: usize, found: usize },
    #[error("`{text}` is not a {what}")]
    Value { what: &'static str, text: String },
    #[error("no `{key}=` in the record")]
    MissingKey { key: &'static str },
}

/// A line that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{problem} in {line:?}")]
pub struct BadLine {
    pub line: String,
    pub problem: Problem,
}

fn bad(line: &str, problem: Problem) -> BadLine {
    BadLine {
        line: line.to_string(),
        problem,
    }
}

/// `sbatch --parsable`: `JOBID` or `JOBID;CLUSTER`.
pub fn submitted(stdout: &str) -> Result<JobId, BadLine> {
    let line = stdout.lines().map(str::trim).rfind(|l| !l.is_empty());
    let Some(line) = line else {
        return Err(bad(stdout, Problem::Empty));
    };
    let id = line.split(';').next().unwrap_or(line);
    id.parse().map_err(|_| {
        bad(
            line,
            Problem::Value {
                what: "job id",
                text: id.to_string(),
            },
        )
    })
}

/// The squeue format of [`JobStatus`]: the name last, so a `|` in it stays in it.
pub const JOB_FORMAT: &str = "%i|%T|%r|%L|%D|%N|%j";

/// A job as squeue shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobStatus {
    pub id: JobId,
    pub state: JobState,
    /// Why it waits (pending), or why it ended; `None` while it runs normally.
    pub reason: Reason,
    /// `None` when Slurm has none to give (`NOT_SET`); zero once past the limit (`INVALID`,
    /// while the job is being ended).
    pub time_left: Option<SlurmTime>,
    pub node_count: u32,
    /// Its nodes as a Slurm hostlist (`n[1-2]`); empty while pending.
    pub nodes: String,
    pub name: String,
}

/// The rows of `squeue --format=JOB_FORMAT --noheader`.
pub fn jobs(stdout: &str) -> Result<Vec<JobStatus>, BadLine> {
    rows(stdout, 7)?
        .into_iter()
        .map(|(line, f)| {
            let value = |what, text: &str| {
                bad(
                    line,
                    Problem::Value {
                        what,
                        text: text.to_string(),
                    },
                )
            };
            let time_left = match f[3] {
                "NOT_SET" => None,
                "INVALID" => Some(SlurmTime::Limited(std::time::Duration::ZERO)),
                t => Some(parse_time(t).map_err(|_| value("time left", t))?),
            };
            Ok(JobStatus {
                id: f[0].parse().map_err(|_| value("job id", f[0]))?,
                state: JobState::parse(f[1]),
                reason: Reason::parse(f[2]),
                time_left,
                node_count: f[4].parse().map_err(|_| value("node count", f[4]))?,
                nodes: f[5].to_string(),
                name: f[6].to_string(),
            })
        })
        .collect()
}

/// The squeue `--steps` format of [`StepStatus`].
pub const STEP_FORMAT: &str = "%i|%N|%j";

/// A job step as `squeue --steps` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepStatus {
    pub id: StepId,
    /// Its nodes as a hostlist: one node name for the steps fleet starts.
    pub nodes: String,
    /// `srun --job-name`; `batch` and `extern` for Slurm's own.
    pub name: String,
}

/// The rows of `squeue --steps --format=STEP_FORMAT --noheader`.
pub fn steps(stdout: &str) -> Result<Vec<StepStatus>, BadLine> {
    rows(stdout, 3)?
        .into_iter()
        .map(|(line, f)| {
            Ok(StepStatus {
                id: f[0].parse().map_err(|_| {
                    bad(
                        line,
                        Problem::Value {
                            what: "step id",
                            text: f[0].to_string(),
                        },
                    )
                })?,
                nodes: f[1].to_string(),
                name: f[2].to_string(),
            })
        })
        .collect()
}

/// Non-empty lines split on `|` into `n` fields, the last one taking the rest.
fn rows(stdout: &str, n: usize) -> Result<Vec<(&str, Vec<&str>)>, BadLine> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.splitn(n, '|').map(str::trim).collect();
            if fields.len() == n {
                Ok((line, fields))
            } else {
                Err(bad(
                    line,
                    Problem::Fields {
                        expected: n,
                        found: fields.len(),
                    },
                ))
            }
        })
        .collect()
}

/// One `scontrol --oneliner` record: `Key=Value` words in order. A word without `=` (as in
/// `OS=Linux 6.1 #1 SMP` or `Reason=Not responding`) continues the value before it. Keys may
/// repeat: `--details` adds one `Nodes= CPU_IDs= Mem= GRES=` group per set of nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record(pub Vec<(String, String)>);

impl Record {
    pub fn parse(line: &str) -> Record {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for word in line.split_whitespace() {
            match word.split_once('=') {
                Some((key, value)) if is_key(key) => pairs.push((key.into(), value.into())),
                _ => match pairs.last_mut() {
                    Some((_, value)) => {
                        value.push(' ');
                        value.push_str(word);
                    }
                    None => pairs.push((word.into(), String::new())),
                },
            }
        }
        Record(pairs)
    }

    /// The first value of `key`; empty and `(null)` read as absent.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty() && *v != "(null)")
    }

    fn require(&self, key: &'static str) -> Result<&str, Problem> {
        self.get(key).ok_or(Problem::MissingKey { key })
    }
}

/// `NodeName`, `CPU_IDs`, `AllocNode:Sid`, `CPUs/Task`, `NtasksPerN:B:S:C`: what scontrol
/// uses as keys; a value word such as `[root@2026-01-01T00:00:00]` is none.
fn is_key(key: &str) -> bool {
    key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_:/".contains(c))
}

/// A node as `scontrol --oneliner show node` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    pub name: String,
    /// Where the node is reached (`NodeAddr=`): what its servers bind and clients connect to.
    pub addr: String,
    pub hostname: String,
    pub state: NodeState,
    /// Its generic resources, e.g. `gpu:8` or `gpu:a100:4(S:0-1)`.
    pub gres: Option<String>,
    /// Why an administrator or Slurm took it out (`Not responding`), if it was.
    pub reason: Option<String>,
}

/// The records of `scontrol --oneliner show node LIST`.
pub fn nodes(stdout: &str) -> Result<Vec<NodeInfo>, BadLine> {
    records(stdout)
        .map(|(line, r)| {
            let node = || -> Result<NodeInfo, Problem> {
                Ok(NodeInfo {
                    name: r.require("NodeName")?.to_string(),
                    addr: r.require("NodeAddr")?.to_string(),
                    hostname: r.get("NodeHostName").unwrap_or_default().to_string(),
                    state: NodeState::parse(r.require("State")?),
                    gres: r.get("Gres").map(String::from),
                    reason: r.get("Reason").map(String::from),
                })
            };
            node().map_err(|p| bad(line, p))
        })
        .collect()
}

/// A job as `scontrol --oneliner --details show job` shows it: what `squeue` does not say
/// (the batch host, the tasks, the GPUs of each set of nodes), for an allocation fleet did
/// not make itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobRecord {
    pub id: JobId,
    pub name: String,
    /// `UserId=alice(1000)`: the user name.
    pub user: String,
    pub state: JobState,
    pub reason: Reason,
    pub partition: Option<String>,
    /// The allocation's nodes as a hostlist; absent while pending.
    pub nodes: Option<String>,
    pub batch_host: Option<String>,
    pub tasks: u32,
    pub time_limit: Option<SlurmTime>,
    /// Per set of nodes: the hostlist and its generic resources with their indices, e.g.
    /// (`n[1-2]`, `gpu:8(IDX:0-7)`).
    pub allocated: Vec<(String, String)>,
}

/// The record of `scontrol --oneliner --details show job J`.
pub fn job_record(stdout: &str) -> Result<JobRecord, BadLine> {
    let Some((line, r)) = records(stdout).next() else {
        return Err(bad(stdout, Problem::Empty));
    };
    let value = |what, text: &str| Problem::Value {
        what,
        text: text.to_string(),
    };
    let job = || -> Result<JobRecord, Problem> {
        let id = r.require("JobId")?;
        let tasks = r.require("NumTasks")?;
        let user = r.require("UserId")?;
        let mut allocated = Vec::new();
        let mut pending_nodes: Option<&str> = None;
        for (k, v) in &r.0 {
            match k.as_str() {
                "Nodes" => pending_nodes = Some(v),
                "GRES" => {
                    if let Some(n) = pending_nodes.take() {
                        allocated.push((n.to_string(), v.clone()));
                    }
                }
                _ => {}
            }
        }
        Ok(JobRecord {
            id: id.parse().map_err(|_| value("job id", id))?,
            name: r.get("JobName").unwrap_or_default().to_string(),
            user: user.split('(').next().unwrap_or(user).to_string(),
            state: JobState::parse(r.require("JobState")?),
            reason: Reason::parse(r.get("Reason").unwrap_or_default()),
            partition: r.get("Partition").map(String::from),
            nodes: r.get("NodeList").map(String::from),
            batch_host: r.get("BatchHost").map(String::from),
            tasks: tasks.parse().map_err(|_| value("task count", tasks))?,
            time_limit: r.get("TimeLimit").and_then(|t| parse_time(t).ok()),
            allocated,
        })
    };
    job().map_err(|p| bad(line, p))
}

fn records(stdout: &str) -> impl Iterator<Item = (&str, Record)> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| (l, Record::parse(l)))
}

/// The lines of `scontrol show hostnames LIST`.
pub fn hostnames(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;

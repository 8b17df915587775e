//! The inventory's `slurm:` block as a typed value: an allocation fleet makes (partition, GPUs,
//! time limit, extra `sbatch` options) or one the user already holds (`job:`), and the pure
//! checks of its values. `config` reads the YAML into it, reporting each problem at its place.

use serde::Serialize;

use super::state::JobId;
use super::time::SlurmTime;

/// How long before the allocation's end a `generate` run on its servers stops, by default:
/// room for `generate`'s grace for requests in flight (30 s) and for writing its journal.
pub const STOP_BEFORE_END: std::time::Duration = std::time::Duration::from_secs(120);

/// A Slurm host of the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlurmSpec {
    /// fleet submits the allocation, and cancels it at `down`.
    New(NewAllocation),
    /// An allocation the user holds (`job:`): fleet starts steps in it and never cancels it.
    Existing {
        job: JobId,
        /// How many of its GPUs to use, one server each; all of them when `None`.
        gpus: Option<u32>,
    },
}

impl SlurmSpec {
    /// How many servers the inventory asks for; `None`: one per GPU of a held allocation.
    pub fn servers(&self) -> Option<u32> {
        match self {
            SlurmSpec::New(n) => Some(n.gpus),
            SlurmSpec::Existing { gpus, .. } => *gpus,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewAllocation {
    /// The cluster's default partition when `None`. Slurm takes a comma-separated list.
    pub partition: Option<String>,
    /// GPUs to allocate, one server per GPU.
    pub gpus: u32,
    pub time: SlurmTime,
    /// CPUs per server, from `--cpus-per-task` (or `-c`) in `sbatch_args`: the allocation
    /// and each step ask for it, or a step would get one CPU.
    pub cpus_per_task: Option<u32>,
    /// The rest of `sbatch_args`, passed to sbatch as written.
    pub sbatch_args: Vec<String>,
}

/// What is wrong with one item of `sbatch_args`, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecProblem {
    #[error("`{arg}` is set by fleet")]
    Reserved { arg: String, instead: &'static str },
    #[error("`{arg}` is not an sbatch option")]
    NotAnOption { arg: String },
    #[error("`{arg}` needs a value")]
    MissingValue { arg: String },
    #[error("`{arg}`: `{value}` is not a number of CPUs")]
    BadCpus { arg: String, value: String },
}

impl SpecProblem {
    pub fn hint(&self) -> String {
        match self {
            SpecProblem::Reserved { instead, .. } => instead.to_string(),
            SpecProblem::NotAnOption { .. } => {
                "write each option as `--name=value`, or `--name` then its value as the next item"
                    .into()
            }
            SpecProblem::MissingValue { .. } | SpecProblem::BadCpus { .. } => {
                "e.g. --cpus-per-task=8".into()
            }
        }
    }
}

/// The options fleet sets itself, long and short, with what to write instead.
const RESERVED: &[(&str, Option<char>, &str)] = &[
    (
        "job-name",
        Some('J'),
        "fleet names the job after the host, so it recognises it",
    ),
    ("partition", Some('p'), "use the Slurm host's `partition:`"),
    ("time", Some('t'), "use the Slurm host's `time:`"),
    (
        "ntasks",
        Some('n'),
        "use `gpus:`: fleet asks for one task per server",
    ),
    (
        "ntasks-per-node",
        None,
        "use `gpus:`: fleet asks for one task per server",
    ),
    (
        "nodes",
        Some('N'),
        "use `gpus:`: fleet lays out the servers",
    ),
    (
        "gres",
        None,
        "use `gpus:`: fleet asks for one GPU per server",
    ),
    ("gpus", Some('G'), "use `gpus:`"),
    (
        "gpus-per-task",
        None,
        "use `gpus:`: fleet asks for one GPU per server",
    ),
    (
        "gpus-per-node",
        None,
        "use `gpus:`: fleet asks for one GPU per server",
    ),
    (
        "output",
        Some('o'),
        "fleet keeps the allocation's output with its own state",
    ),
    (
        "error",
        Some('e'),
        "fleet keeps the allocation's output with its own state",
    ),
    ("wrap", None, "fleet sends its own batch script"),
    (
        "array",
        Some('a'),
        "fleet makes one allocation, not an array",
    ),
    ("parsable", None, "fleet sets it to read the job id"),
    (
        "no-kill",
        Some('k'),
        "fleet sets it: a failed node takes only its own servers",
    ),
    (
        "no-requeue",
        None,
        "fleet sets it: a failed allocation must not pend again unseen",
    ),
    (
        "requeue",
        None,
        "a requeued allocation loses its servers; fleet sets --no-requeue",
    ),
    ("hold", Some('H'), "fleet waits for the allocation to run"),
    (
        "wait",
        Some('W'),
        "fleet waits for the allocation to run, not to end",
    ),
    ("test-only", None, "fleet submits a real allocation"),
];

/// `sbatch_args` read: `--cpus-per-task` (which steps need too) and the options passed through.
pub type SbatchArgs = (Option<u32>, Vec<String>);

/// Splits `sbatch_args` into `--cpus-per-task` and the options passed through, reporting each
/// item that fleet sets itself or that is no option. `Err` holds the index and problem of
/// every bad item.
pub fn sbatch_args(args: &[String]) -> Result<SbatchArgs, Vec<(usize, SpecProblem)>> {
    let mut problems = Vec::new();
    let mut kept = Vec::new();
    let mut cpus = None;
    let mut i = 0;
    // The previous item was an option without `=`, so this one may be its value.
    let mut may_be_value = false;
    while i < args.len() {
        let arg = &args[i];
        let (name, short, inline) = match option(arg) {
            Some(o) => o,
            None => {
                if may_be_value {
                    kept.push(arg.clone());
                } else {
                    problems.push((i, SpecProblem::NotAnOption { arg: arg.clone() }));
                }
                may_be_value = false;
                i += 1;
                continue;
            }
        };
        if name == "cpus-per-task" || short == Some('c') {
            let value = match inline {
                Some(v) => Some(v.to_string()),
                None => {
                    i += 1;
                    args.get(i).cloned()
                }
            };
            match value.as_deref().map(str::parse::<u32>) {
                Some(Ok(n)) if n > 0 => cpus = Some(n),
                Some(_) => problems.push((
                    i.min(args.len() - 1),
                    SpecProblem::BadCpus {
                        arg: arg.clone(),
                        value: value.unwrap_or_default(),
                    },
                )),
                None => problems.push((i - 1, SpecProblem::MissingValue { arg: arg.clone() })),
            }
            may_be_value = false;
            i += 1;
            continue;
        }
        let reserved = RESERVED
            .iter()
            .find(|(long, s, _)| *long == name || (short.is_some() && *s == short));
        if let Some((_, _, instead)) = reserved {
            problems.push((
                i,
                SpecProblem::Reserved {
                    arg: arg.clone(),
                    instead,
                },
            ));
        } else {
            kept.push(arg.clone());
        }
        may_be_value = inline.is_none();
        i += 1;
    }
    if problems.is_empty() {
        Ok((cpus, kept))
    } else {
        Err(problems)
    }
}

/// `--name[=value]` as (`name`, None, value) and `-x[value]` as ("", Some('x'), value).
fn option(arg: &str) -> Option<(&str, Option<char>, Option<&str>)> {
    if let Some(long) = arg.strip_prefix("--") {
        if long.is_empty() {
            return None;
        }
        return Some(match long.split_once('=') {
            Some((name, value)) => (name, None, Some(value)),
            None => (long, None, None),
        });
    }
    let short = arg.strip_prefix('-')?;
    let mut chars = short.chars();
    let letter = chars.next().filter(char::is_ascii_alphabetic)?;
    let rest = chars.as_str();
    Some(("", Some(letter), (!rest.is_empty()).then_some(rest)))
}

/// A partition name (or comma-separated list) as sbatch takes it.
pub fn partition_ok(p: &str) -> bool {
    !p.is_empty()
        && p.split(',').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_pass_through_and_cpus_are_kept_for_the_steps() {
        let (cpus, kept) = sbatch_args(&args(&[
            "--account=ml",
            "--qos",
            "normal",
            "-c",
            "8",
            "--exclusive",
        ]))
        .unwrap();
        assert_eq!(cpus, Some(8));
        assert_eq!(
            kept,
            args(&["--account=ml", "--qos", "normal", "--exclusive"])
        );
        let (cpus, _) = sbatch_args(&args(&["--cpus-per-task=4"])).unwrap();
        assert_eq!(cpus, Some(4));
        let (cpus, _) = sbatch_args(&args(&["-c16"])).unwrap();
        assert_eq!(cpus, Some(16));
    }

    #[test]
    fn what_fleet_sets_is_refused_with_the_field_to_use() {
        let problems = sbatch_args(&args(&[
            "--time=1:00:00",
            "-p",
            "gpu",
            "--gres=gpu:8",
            "-J",
            "x",
        ]))
        .unwrap_err();
        let at: Vec<usize> = problems.iter().map(|(i, _)| *i).collect();
        assert_eq!(at, [0, 1, 3, 4]);
        assert!(problems[0].1.hint().contains("`time:`"), "{problems:?}");
        assert!(
            problems[1].1.hint().contains("`partition:`"),
            "{problems:?}"
        );
        assert!(problems[2].1.hint().contains("`gpus:`"), "{problems:?}");
        assert_eq!(problems[3].1.to_string(), "`-J` is set by fleet");
    }

    #[test]
    fn bad_items_are_named() {
        let problems = sbatch_args(&args(&["account=ml"])).unwrap_err();
        assert_eq!(
            problems,
            [(
                0,
                SpecProblem::NotAnOption {
                    arg: "account=ml".into()
                }
            )]
        );
        let problems = sbatch_args(&args(&["--cpus-per-task=many"])).unwrap_err();
        assert!(matches!(problems[0].1, SpecProblem::BadCpus { .. }));
        let problems = sbatch_args(&args(&["--exclusive", "-c"])).unwrap_err();
        assert_eq!(problems[0].0, 1);
        assert!(matches!(problems[0].1, SpecProblem::MissingValue { .. }));
    }

    #[test]
    fn partitions() {
        assert!(partition_ok("gpu"));
        assert!(partition_ok("gpu,gpu-long"));
        assert!(!partition_ok("gpu long"));
        assert!(!partition_ok("gpu,"));
        assert!(!partition_ok(""));
    }
}

//! The inventory's `slurm:` block, read from YAML into a [`SlurmSpec`] with every problem
//! reported at its place (the values' own rules live in `slurm::spec`).

use std::time::Duration;

use super::check::{Checker, Fields};
use super::yaml::{Node, Value};
use crate::slurm::spec::{self, NewAllocation, SlurmSpec};
use crate::slurm::state::JobId;
use crate::slurm::time::{TimeError, parse_limit};

const KEYS: &[&str] = &[
    "partition",
    "gpus",
    "time",
    "sbatch_args",
    "job",
    "stop_before_end",
];

/// Only for an allocation fleet makes: with `job:` the allocation already has them.
const NEW_ONLY: &[&str] = &["partition", "time", "sbatch_args"];

/// Reads a host's `slurm:` block at `path` (e.g. `hosts[0].slurm`): the allocation, and how
/// long before its end a `generate` run stops (`stop_before_end`).
pub(super) fn slurm_block(
    c: &mut Checker,
    node: &Node,
    path: &str,
) -> Option<(SlurmSpec, Duration)> {
    let f = c.fields(node, path, KEYS)?;
    let stop_before_end = match f.get("stop_before_end") {
        Some(n) => c.duration(n, &f.field("stop_before_end")),
        None => Some(spec::STOP_BEFORE_END),
    };
    let spec = allocation(c, &f)?;
    Some((spec, stop_before_end?))
}

fn allocation(c: &mut Checker, f: &Fields) -> Option<SlurmSpec> {
    let gpus = f.get("gpus").map(|n| {
        c.int(n, &f.field("gpus"), 1, i128::from(u32::MAX))
            .map(|g| g as u32)
    });
    if let Some(job_node) = f.get("job") {
        let job = c
            .int(job_node, &f.field("job"), 1, i128::from(u32::MAX))
            .map(|j| JobId(j as u32));
        for key in NEW_ONLY {
            if let Some(n) = f.get(key) {
                c.report(
                    n.loc,
                    &f.field(key),
                    "applies only to an allocation fleet makes, not to `job:`",
                    Some("remove it, or remove `job:` to have fleet submit the allocation".into()),
                );
            }
        }
        return Some(SlurmSpec::Existing {
            job: job?,
            gpus: match gpus {
                Some(g) => Some(g?),
                None => None,
            },
        });
    }
    let gpus = match gpus {
        Some(g) => g,
        None => {
            f.required(c, "gpus");
            None
        }
    };
    let partition = f.get("partition").and_then(|n| {
        let field = f.field("partition");
        let p = c.string(n, &field)?;
        if spec::partition_ok(&p) {
            return Some(p);
        }
        c.report(
            n.loc,
            &field,
            format!("`{p}` is not a partition name"),
            Some("one name, or several separated by commas; `sinfo --summarize` lists them".into()),
        );
        None
    });
    let time = f.required(c, "time").and_then(|n| {
        let field = f.field("time");
        let text = match &n.value {
            // `time: 60` is minutes to Slurm, as it is to sbatch.
            Value::Int(i) => i.to_string(),
            _ => c.string(n, &field)?,
        };
        parse_limit(&text)
            .map_err(|e| c.report(n.loc, &field, e.to_string(), Some(TimeError::HINT.into())))
            .ok()
    });
    let args = match f.get("sbatch_args") {
        Some(n) => sbatch_args(c, n, &f.field("sbatch_args")),
        None => Some((None, Vec::new())),
    };
    let (cpus_per_task, sbatch_args) = args?;
    Some(SlurmSpec::New(NewAllocation {
        partition: match f.get("partition") {
            Some(_) => Some(partition?),
            None => None,
        },
        gpus: gpus?,
        time: time?,
        cpus_per_task,
        sbatch_args,
    }))
}

fn sbatch_args(c: &mut Checker, node: &Node, field: &str) -> Option<(Option<u32>, Vec<String>)> {
    let items = c.list(node, field, |c, n, f| c.text(n, f))?;
    let Value::Seq(nodes) = &node.value else {
        return None;
    };
    spec::sbatch_args(&items)
        .map_err(|problems| {
            for (i, p) in problems {
                c.report(
                    nodes[i].loc,
                    &format!("{field}[{i}]"),
                    p.to_string(),
                    Some(p.hint()),
                );
            }
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::config::ConfigError;
    use crate::slurm::time::SlurmTime;

    fn read(text: &str) -> Result<SlurmSpec, Vec<String>> {
        let mut c = Checker::default();
        let file = c.add_file(PathBuf::from("fleet.yaml"));
        let root = c.parse(text, file).expect("YAML");
        let Value::Map(entries) = &root.value else {
            panic!("a mapping")
        };
        let spec = slurm_block(&mut c, &entries[0].1, "hosts[0].slurm");
        c.finish(spec.map(|(s, _)| s)).map_err(|e| match e {
            ConfigError::Invalid(p) => p.iter().map(|p| p.to_string()).collect(),
            other => vec![other.to_string()],
        })
    }

    #[test]
    fn the_issue_example_reads() {
        let spec = read(
            "slurm:\n  partition: gpu\n  gpus: 16\n  time: \"2-00:00:00\"\n  sbatch_args: [--account=ml, --qos=normal, --cpus-per-task=8]\n",
        )
        .unwrap();
        assert_eq!(
            spec,
            SlurmSpec::New(NewAllocation {
                partition: Some("gpu".into()),
                gpus: 16,
                time: SlurmTime::Limited(Duration::from_secs(2 * 86_400)),
                cpus_per_task: Some(8),
                sbatch_args: vec!["--account=ml".into(), "--qos=normal".into()],
            })
        );
    }

    #[test]
    fn an_allocation_the_user_holds() {
        assert_eq!(
            read("slurm:\n  job: 123456\n").unwrap(),
            SlurmSpec::Existing {
                job: JobId(123_456),
                gpus: None
            }
        );
        assert_eq!(
            read("slurm:\n  job: 7\n  gpus: 4\n").unwrap(),
            SlurmSpec::Existing {
                job: JobId(7),
                gpus: Some(4)
            }
        );
        let problems = read("slurm:\n  job: 7\n  time: 10\n  partition: gpu\n").unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("fleet.yaml:3:9: hosts[0].slurm.time: applies only"));
        assert!(
            problems[1].contains("hosts[0].slurm.partition"),
            "{problems:?}"
        );
    }

    #[test]
    fn every_problem_at_its_place() {
        let problems = read(
            "slurm:\n  partition: gpu long\n  time: 1h\n  sbatch_args: [--account=ml, -t, \"10\", --gres=gpu:8]\n  gpu: 8\n",
        )
        .unwrap_err();
        let joined = problems.join("\n");
        for expected in [
            "fleet.yaml:2:14: hosts[0].slurm.partition: `gpu long` is not a partition name",
            "fleet.yaml:3:9: hosts[0].slurm.time: `1h` is not a Slurm time",
            "hosts[0].slurm.sbatch_args[1]: `-t` is set by fleet (use the Slurm host's `time:`)",
            "hosts[0].slurm.sbatch_args[3]: `--gres=gpu:8` is set by fleet",
            "fleet.yaml:5:3: hosts[0].slurm.gpu: unknown key (did you mean `gpus`?)",
            "hosts[0].slurm.gpus: missing required key",
        ] {
            assert!(joined.contains(expected), "{expected}\nin\n{joined}");
        }
    }

    #[test]
    fn stop_before_end_is_a_duration_with_a_default() {
        let mut c = Checker::default();
        let file = c.add_file(PathBuf::from("fleet.yaml"));
        let root = c
            .parse("slurm:\n  job: 7\n  stop_before_end: 90s\n", file)
            .unwrap();
        let Value::Map(entries) = &root.value else {
            panic!()
        };
        let (_, stop) = slurm_block(&mut c, &entries[0].1, "s").unwrap();
        assert_eq!(stop, Duration::from_secs(90));
        let root = c.parse("slurm:\n  job: 7\n", file).unwrap();
        let Value::Map(entries) = &root.value else {
            panic!()
        };
        let (_, stop) = slurm_block(&mut c, &entries[0].1, "s").unwrap();
        assert_eq!(stop, spec::STOP_BEFORE_END);
        let problems = read("slurm:\n  job: 7\n  stop_before_end: 90\n").unwrap_err();
        assert!(
            problems[0].contains("hosts[0].slurm.stop_before_end: a duration needs a unit"),
            "{problems:?}"
        );
    }

    #[test]
    fn time_in_minutes_and_zero() {
        let spec = read("slurm:\n  gpus: 1\n  time: 90\n").unwrap();
        let SlurmSpec::New(new) = spec else { panic!() };
        assert_eq!(new.time, SlurmTime::Limited(Duration::from_secs(5400)));
        let problems = read("slurm:\n  gpus: 1\n  time: \"0\"\n").unwrap_err();
        assert!(problems[0].contains("no limit at all"), "{problems:?}");
        let problems = read("slurm:\n  gpus: 0\n").unwrap_err();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("gpus: 0 is out of range")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("time: missing")),
            "{problems:?}"
        );
    }
}

//! Tables and JSON for `up`, `status` and `down`. Pure: values in, strings out; secrets are
//! already masked in what this module is given.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::launch::down::StopOutcome;
use crate::launch::plan::Instance;
use crate::launch::status::InstanceStatus;
use crate::launch::up::{UpOutcome, UpState};
use crate::layout::Group;
use crate::report::table;
use crate::server::ServerId;

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The HOST column.
fn host(id: &ServerId) -> &str {
    id.host().unwrap_or("-")
}

/// The GPU column: `5`, or a group's GPUs and its slowest link, `0+2 PIX`.
fn gpu(id: &ServerId, group: Option<&Group>) -> String {
    match group {
        Some(g) => {
            let gpus: Vec<String> = g.gpus.iter().map(u32::to_string).collect();
            match g.slowest {
                Some(link) => format!("{} {link}", gpus.join("+")),
                None => gpus.join("+"),
            }
        }
        None => opt(id.gpu_index()),
    }
}

/// `fleet up --dry-run`: what would run where, with the exact (masked) command line, one block
/// per instance (a command line is far wider than a table column).
pub fn plan_text(instances: &[Instance], versions: &BTreeMap<String, Option<String>>) -> String {
    let mut out = String::new();
    for i in instances {
        let version = opt(versions.get(i.host()).cloned().flatten());
        let env: Vec<String> = i.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let argv = shlex::try_join(i.display_argv().iter().map(String::as_str))
            .unwrap_or_else(|_| i.display_argv().join(" "));
        out.push_str(&format!("{} (SGLang {version})\n", i.label()));
        if i.group.is_multi() {
            let link = i
                .group
                .slowest
                .map_or("unknown: no board read".to_string(), |l| l.to_string());
            out.push_str(&format!(
                "  gpus: {} (slowest link {link})\n",
                i.group.visible_devices()
            ));
        }
        out.push_str(&format!("  env: {}\n  $ {argv}\n", env.join(" ")));
    }
    out
}

/// `fleet up --dry-run --json`: `[{"host","gpu","port","argv":[...],"env":{...}}]`.
pub fn plan_json(instances: &[Instance]) -> Value {
    Value::Array(
        instances
            .iter()
            .map(|i| {
                let mut row = json!({
                    "host": i.host(), "gpu": i.id.gpu_index(), "port": i.port,
                    "argv": i.display_argv(), "env": i.env,
                });
                if let Some(group) = i.group.if_multi() {
                    row["group"] = json!(group);
                }
                row
            })
            .collect(),
    )
}

/// The table `fleet up` ends with. The version is the server's own, else the host's.
pub fn up_table(outcomes: &[UpOutcome], versions: &BTreeMap<String, Option<String>>) -> String {
    let rows = outcomes.iter().map(|o| {
        let version = o
            .info
            .version
            .clone()
            .or_else(|| versions.get(host(&o.id)).cloned().flatten());
        vec![
            host(&o.id).to_string(),
            gpu(&o.id, o.group.as_ref()),
            o.port.to_string(),
            opt(o.pid),
            o.state.as_str().to_string(),
            opt(o.ready_after.map(|s| format!("{s:.1}s"))),
            opt(o.info.mamba_strategy.as_deref()),
            opt(o.info.effective_max_running_requests),
            opt(o.info.max_total_num_tokens),
            opt(version),
        ]
    });
    table(
        &[
            "HOST",
            "GPU",
            "PORT",
            "PID",
            "STATE",
            "READY AFTER",
            "STRATEGY",
            "MAX RUNNING",
            "KV TOKENS",
            "VERSION",
        ],
        rows,
    )
}

/// Each failed instance's reason and log tail, for stderr.
pub fn up_failures(outcomes: &[UpOutcome]) -> String {
    let mut out = String::new();
    for o in outcomes.iter().filter(|o| o.state == UpState::Failed) {
        out.push_str(&format!(
            "{}: {}\n",
            o.id.label(o.port),
            o.error.as_deref().unwrap_or("failed")
        ));
        out.push_str(&indented_tail(o.log_tail.as_deref()));
    }
    out
}

fn indented_tail(tail: Option<&str>) -> String {
    match tail.map(str::trim_end).filter(|t| !t.is_empty()) {
        Some(t) => crate::render::log_tail(t.lines()),
        None => "    (the log is empty)\n".to_string(),
    }
}

/// `fleet status`.
pub fn status_table(statuses: &[InstanceStatus]) -> String {
    let rows = statuses.iter().map(|s| {
        let load = s.load.as_ref();
        vec![
            host(&s.id).to_string(),
            gpu(&s.id, s.group.as_ref()),
            s.port.to_string(),
            match &s.slurm {
                // A Slurm step has no pid fleet can name: its step, node and GPU instead.
                Some(st) => format!("{}.{} {} gpu{}", st.job, st.step, st.node, st.slurm_gpus),
                None => opt(s.pid),
            },
            s.state().to_string(),
            format_uptime(s.uptime),
            opt(s.mamba_strategy.as_deref()),
            opt(load.and_then(|l| l.num_running_reqs)),
            opt(load.and_then(|l| l.num_queue_reqs)),
            opt(load
                .and_then(|l| l.gen_throughput)
                .map(|g| format!("{g:.0}"))),
            opt(load
                .and_then(|l| l.token_usage)
                .map(|u| format!("{:.0}%", u * 100.0))),
            opt(s
                .gpu_reading
                .as_ref()
                .map(|g| format!("{}/{} MiB", g.memory_used_mib, g.memory_total_mib))),
            opt(s
                .gpu_reading
                .as_ref()
                .and_then(|g| g.utilization_pct)
                .map(|u| format!("{u}%"))),
            s.profile.clone(),
            fleet_cell(s.owner.as_ref(), s.mine),
        ]
    });
    table(
        &[
            "HOST",
            "GPU",
            "PORT",
            "PID",
            "STATE",
            "UP",
            "STRATEGY",
            "RUNNING",
            "QUEUED",
            "GEN TOK/S",
            "TOKEN USAGE",
            "GPU MEM",
            "GPU UTIL",
            "PROFILE",
            "FLEET",
        ],
        rows,
    )
}

/// The log tails of dead instances (`fleet status -v`).
pub fn dead_tails(statuses: &[InstanceStatus]) -> String {
    statuses
        .iter()
        .filter(|s| s.log_tail.is_some())
        .map(|s| {
            format!(
                "{} ({}):\n{}",
                s.id.label(s.port),
                s.state(),
                indented_tail(s.log_tail.as_deref())
            )
        })
        .collect()
}

fn format_uptime(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// `fleet down`.
/// The FLEET cell: the fleet's id, `(other)` after it when it is not this fleet's; `unknown`
/// for a server from before owners were recorded.
fn fleet_cell(owner: Option<&crate::launch::owner::Owner>, mine: bool) -> String {
    match (owner, mine) {
        (Some(o), true) => o.fleet.clone(),
        (Some(o), false) => format!("{} (other)", o.fleet),
        (None, _) => "unknown (other)".into(),
    }
}

pub fn down_table(outcomes: &[StopOutcome]) -> String {
    let rows = outcomes.iter().map(|o| {
        vec![
            host(&o.id).to_string(),
            gpu(&o.id, o.group.as_ref()),
            o.port.to_string(),
            opt(o.pid),
            o.profile.clone(),
            (o.owner.as_ref()).map_or("unknown".into(), |w| w.fleet.clone()),
            o.state.as_str().to_string(),
            format!("{:.1}s", o.took.as_secs_f64()),
            if o.port_closed { "closed" } else { "OPEN" }.to_string(),
            opt(o.gpu_memory_used_mib.map(|m| format!("{m} MiB"))),
        ]
    });
    table(
        &[
            "HOST", "GPU", "PORT", "PID", "PROFILE", "FLEET", "RESULT", "TOOK", "PORT", "GPU MEM",
        ],
        rows,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::launch::backend::StopState;
    use crate::launch::up::Capacity;

    fn outcome(state: UpState) -> UpOutcome {
        UpOutcome {
            id: ServerId::gpu("ct200", 5),
            group: None,
            port: 30005,
            pid: Some(4242),
            state,
            recorded: true,
            ready_after: Some(94.04),
            info: Capacity {
                version: None,
                max_total_num_tokens: Some(1_234_567),
                effective_max_running_requests: Some(72),
                context_length: Some(8192),
                mamba_strategy: Some("no_buffer".into()),
            },
            error: None,
            log_tail: None,
            argv: vec![],
            phases: Default::default(),
        }
    }

    #[test]
    fn up_table_has_the_columns_users_read() {
        let versions = BTreeMap::from([("ct200".to_string(), Some("0.5.10".to_string()))]);
        let text = up_table(&[outcome(UpState::Ready)], &versions);
        let lines: Vec<&str> = text.lines().collect();
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(header[..5], ["HOST", "GPU", "PORT", "PID", "STATE"]);
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "ct200",
                "5",
                "30005",
                "4242",
                "ready",
                "94.0s",
                "no_buffer",
                "72",
                "1234567",
                "0.5.10"
            ]
        );
    }

    #[test]
    fn failures_show_the_reason_and_log_tail() {
        let mut o = outcome(UpState::Failed);
        o.error = Some("the server process exited during startup".into());
        o.log_tail = Some("loading\ntorch.OutOfMemoryError: CUDA out of memory\n".into());
        assert_eq!(
            up_failures(&[o, outcome(UpState::Ready)]),
            "ct200 gpu5 :30005: the server process exited during startup\n    | loading\n    | torch.OutOfMemoryError: CUDA out of memory\n"
        );
    }

    #[test]
    fn down_table_marks_ports_left_open() {
        let o = StopOutcome {
            id: ServerId::gpu("h", 0),
            group: None,
            port: 30000,
            pid: Some(7),
            profile: "p".into(),
            owner: None,
            state: StopState::AlreadyDead,
            took: Duration::from_millis(120),
            port_closed: false,
            gpu_memory_used_mib: Some(0),
            error: None,
        };
        let text = down_table(&[o]);
        let row: Vec<&str> = text
            .lines()
            .nth(1)
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            row,
            [
                "h",
                "0",
                "30000",
                "7",
                "p",
                "unknown",
                "already dead",
                "0.1s",
                "OPEN",
                "0 MiB"
            ]
        );
    }

    #[test]
    fn uptime_reads_naturally() {
        assert_eq!(format_uptime(59), "59s");
        assert_eq!(format_uptime(61), "1m01s");
        assert_eq!(format_uptime(7260), "2h01m");
    }
}

//! What a POSIX target tells of its processes and ports, read through its transport: the
//! process table (`/proc/<pid>/stat`) that tells a live server from a dead or reused pid and
//! finds the members of its process group, the listening TCP ports (`/proc/net/tcp*`), and
//! signals to a whole process group. Parsing is pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::launch::state::{Liveness, StateError, run_ok};
use crate::remote::{Transport, argv};

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

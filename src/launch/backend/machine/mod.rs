//! The machine backend: servers as detached process groups on a POSIX host reached through one
//! transport (this machine, one over SSH, a Proxmox container on either). A server is started
//! with `setsid` and found again by its leader's pid and start time in `/proc`; it is stopped by
//! signalling its group (never by name), SIGTERM then SIGKILL, until the port is closed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Backend, Home, Seen, StopState, Stopped};
use crate::config::MachineSpec;
use crate::gpu::{self, GpuError, GpuProcess, GpuReading};
use crate::launch::help_cache;
use crate::launch::owner::Owner;
use crate::launch::plan::{HostFacts, Instance};
use crate::launch::preflight::{self, FactsError, Learn};
use crate::launch::state::{self, Handle, InstanceRecord, Liveness, StateError};
use crate::remote::{Detached, RemoteError, Transport, Tunnel};

pub mod proc;

use proc::ProcTable;

/// How often a stopping group and a closing port are looked at.
const POLL: Duration = Duration::from_millis(100);
/// How long after SIGKILL (or after the group is gone, for the port) before giving up.
pub const AFTER_KILL: Duration = Duration::from_secs(5);

/// A machine of the inventory, through its transport (the `home`'s shell).
#[derive(Debug)]
pub struct Machine {
    spec: MachineSpec,
    home: Home,
}

impl Machine {
    pub fn new(spec: MachineSpec, home: Home) -> Machine {
        Machine { spec, home }
    }

    fn t(&self) -> &dyn Transport {
        self.home.shell.as_ref()
    }

    async fn record_started(
        &self,
        planned: &Instance,
        owner: &Owner,
        (pid, stat): (u32, Option<String>),
    ) -> Result<InstanceRecord, StateError> {
        let stat = match stat.as_deref().and_then(proc::ProcStat::parse) {
            Some(stat) => Some(stat),
            None => proc::proc_stat(self.t(), pid).await?,
        };
        // A process that died at once has no stat; record start time 0 so it reads as dead.
        let start_ticks = stat.map_or(0, |p| p.start_ticks);
        let record = InstanceRecord::started(
            planned,
            Handle::Process { pid, start_ticks },
            Vec::new(),
            owner,
        );
        state::write_record(self.t(), &record).await?;
        Ok(record)
    }

    async fn stop_group(
        &self,
        record: &InstanceRecord,
        grace: Duration,
    ) -> Result<StopState, StateError> {
        let Some((pid, start_ticks)) = process_of(&record.handle) else {
            return Ok(StopState::PidReused);
        };
        let table = proc::proc_table(self.t()).await?;
        let members = table.group(pid);
        match table.liveness(pid, start_ticks) {
            Liveness::Reused => return Ok(StopState::PidReused),
            // The leader is gone, but workers it left in its group still hold the GPU: while
            // the group exists its id cannot have been handed to anyone else, so it is ours.
            Liveness::Dead if members.is_empty() => return Ok(StopState::AlreadyDead),
            Liveness::Dead | Liveness::Running => {}
        }
        proc::signal_group(self.t(), pid, "TERM").await?;
        if self.wait_group_gone(pid, grace).await? {
            return Ok(StopState::Stopped);
        }
        tracing::warn!(
            "{}: still running {}s after SIGTERM; sending SIGKILL",
            record.label(),
            grace.as_secs()
        );
        proc::signal_group(self.t(), pid, "KILL").await?;
        if self.wait_group_gone(pid, AFTER_KILL).await? {
            Ok(StopState::Killed)
        } else {
            Err(StateError::Command {
                host: self.spec.name.clone(),
                command: format!("kill -KILL -- -{pid}"),
                stderr: "the process group is still there".to_string(),
            })
        }
    }

    async fn wait_group_gone(&self, pgid: u32, within: Duration) -> Result<bool, StateError> {
        let deadline = Instant::now() + within;
        loop {
            if proc::proc_table(self.t()).await?.group(pgid).is_empty() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_port_closed(&self, port: u16) -> Result<bool, StateError> {
        let deadline = Instant::now() + AFTER_KILL;
        loop {
            if !proc::listening_ports(self.t()).await?.contains(&port) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The process group a machine's record names; `None` for another backend's handle.
fn process_of(handle: &Handle) -> Option<(u32, u64)> {
    match handle {
        Handle::Process { pid, start_ticks } => Some((*pid, *start_ticks)),
        Handle::Step { .. } => None,
    }
}

/// What the process table says became of a recorded server.
fn seen(record: InstanceRecord, table: &ProcTable) -> Seen {
    let Some((pid, start_ticks)) = process_of(&record.handle) else {
        // Not a process of this machine's: never touch it.
        return Seen {
            record,
            liveness: Liveness::Reused,
            lingering: false,
        };
    };
    let liveness = table.liveness(pid, start_ticks);
    // A reused pid is someone else's, and so is its group: Linux hands out no pid still in use
    // as a group id, so our group was empty by then.
    let lingering = liveness == Liveness::Dead && !table.group(pid).is_empty();
    Seen {
        record,
        liveness,
        lingering,
    }
}

#[async_trait]
impl Backend for Machine {
    fn home(&self) -> &Home {
        &self.home
    }

    fn through(&self, shell: Arc<dyn Transport>) -> Option<Arc<dyn Backend>> {
        let home = Home {
            shell,
            ..self.home.clone()
        };
        Some(Arc::new(Machine::new(self.spec.clone(), home)))
    }

    async fn facts(&self, learn: &Learn<'_>) -> Result<HostFacts, FactsError> {
        let cache = help_cache::dir(&self.home.run_root);
        preflight::host_facts(&self.home.shell, &self.spec, learn, Some(&cache)).await
    }

    async fn survey(&self) -> Result<Vec<Seen>, StateError> {
        let (records, table) = tokio::try_join!(
            state::read_records(self.t(), &self.home.run_root),
            proc::proc_table(self.t())
        )?;
        Ok(records.into_iter().map(|r| seen(r, &table)).collect())
    }

    async fn ports_in_use(&self) -> Result<BTreeSet<u16>, StateError> {
        proc::listening_ports(self.t()).await
    }

    async fn start(&self, planned: &Instance, owner: &Owner) -> Result<InstanceRecord, StateError> {
        let detached = Detached {
            argv: planned.argv.clone(),
            env: planned.env.clone(),
            log: planned.files.log.clone(),
            pidfile: planned.files.pidfile.clone(),
        };
        let secrets = planned.secrets.as_ref();
        let started = state::start_in_run_dir(self.t(), &planned.files, secrets, &detached).await?;
        let pid = started.0;
        match self.record_started(planned, owner, started).await {
            Ok(record) => Ok(record),
            Err(e) => {
                // Unrecorded, nothing would ever stop it (`down` goes by the records): the group
                // `setsid` made goes now, while its pid is surely the one just started.
                let _ = proc::signal_group(self.t(), pid, "KILL").await;
                Err(e)
            }
        }
    }

    async fn alive(&self, record: &InstanceRecord) -> Result<bool, StateError> {
        let Some((pid, start_ticks)) = process_of(&record.handle) else {
            return Ok(false);
        };
        Ok(proc::proc_stat(self.t(), pid)
            .await?
            .is_some_and(|p| p.running() && p.start_ticks == start_ticks))
    }

    async fn stop(&self, record: &InstanceRecord, grace: Duration) -> Result<Stopped, StateError> {
        let state = self.stop_group(record, grace).await?;
        let port_closed = self.wait_port_closed(record.port).await.unwrap_or(false);
        if let Err(e) = state::remove_record(self.t(), record).await {
            tracing::warn!("{e}");
        }
        Ok(Stopped { state, port_closed })
    }

    async fn log_tail(&self, log: &str, lines: usize) -> Result<String, StateError> {
        state::tail(self.t(), log, lines).await
    }

    async fn endpoint(&self, address: &str, port: u16) -> Result<Tunnel, RemoteError> {
        self.t().forward(address, port).await
    }

    async fn gpus(&self) -> Result<Vec<GpuReading>, GpuError> {
        gpu::read_host(self.home.shell.clone(), self.spec.is_local()).await
    }

    async fn gpu_processes(&self) -> Result<Vec<GpuProcess>, GpuError> {
        gpu::read_processes(self.t()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::backend::fake::record;

    /// A process table line: `pid (name) state ppid pgrp ...` with start time at field 22.
    fn proc(pid: u32, state: char, pgrp: u32, start: u64) -> String {
        format!(
            "{pid} (sglang-sim) {state} 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n"
        )
    }

    fn with_pid(port: u16, pid: u32, start_ticks: u64) -> InstanceRecord {
        InstanceRecord {
            handle: Handle::Process { pid, start_ticks },
            ..record("h", 0, port, "aaa")
        }
    }

    #[test]
    fn the_process_table_tells_running_dead_reused_and_lingering_apart() {
        // pid 10 runs; 20 is a zombie; 30 is now another process; 40's leader is gone but a
        // worker of its group runs on.
        let table = ProcTable::parse(
            &[
                proc(10, 'S', 10, 500),
                proc(20, 'Z', 20, 600),
                proc(30, 'S', 30, 999),
                proc(41, 'R', 40, 710),
            ]
            .concat(),
        );
        let look = |pid, start| {
            let s = seen(with_pid(30000, pid, start), &table);
            (s.liveness, s.lingering, s.holds_gpu())
        };
        assert_eq!(look(10, 500), (Liveness::Running, false, true));
        assert_eq!(look(20, 600), (Liveness::Dead, false, false));
        assert_eq!(look(30, 700), (Liveness::Reused, false, false));
        assert_eq!(look(40, 700), (Liveness::Dead, true, true));
    }
}

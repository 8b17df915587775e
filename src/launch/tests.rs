//! Launch over the backend seam, on fake backends: what up, down, status, the registry, the
//! fleet's targets and logs ask of a host's backend, and what they make of its answers.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::backend::fake::{FakeBackend, closed_port, planned, ready_server, record};
use super::backend::{Backend, Seen, StopState};
use super::down::{Whose, choose, confirm_gpus_released, stop};
use super::logs::{LogsError, Selector, locate};
use super::registry::{FleetProfileError, Registry};
use super::state::Liveness;
use super::status::{Look, host_status};
use super::up::{self, Conflict, Run, UpError, UpEvent, UpOptions, UpState};
use super::{Fleet, plan};
use crate::config::{GpuSelection, HealthSettings, Inventory};
use crate::server::ServerId;

/// A fake host `name` whose running servers answer at `ready`, with its run root in `dir`.
fn fake(name: &str, dir: &tempfile::TempDir, ready: std::net::SocketAddr) -> Arc<FakeBackend> {
    let root = dir.path().join(name);
    Arc::new(FakeBackend::new(name, &root.display().to_string(), ready))
}

fn fleet_of(hosts: &[&Arc<FakeBackend>]) -> Fleet {
    let inventory = Inventory {
        path: PathBuf::from("fleet.yaml"),
        fleet: Some("test".into()),
        hosts: hosts
            .iter()
            .map(|b| plan::tests::host(b.host(), GpuSelection::All))
            .collect(),
    };
    let backends = hosts
        .iter()
        .map(|b| Arc::clone(b) as Arc<dyn Backend>)
        .collect();
    Fleet::of(inventory, backends, Vec::new(), "/tmp/fleet".into())
}

const HEALTH: HealthSettings = HealthSettings {
    startup_timeout: Duration::from_secs(30),
    poll: Duration::from_millis(100),
};

fn options(replace: bool) -> UpOptions {
    UpOptions {
        replace,
        keep_on_interrupt: false,
        grace: Duration::from_secs(1),
    }
}

/// Runs `up` of `instances` on `fleet`, with the events it sent.
async fn run_up(
    fleet: &Fleet,
    instances: &[plan::Instance],
    opts: &UpOptions,
    cancel: &CancellationToken,
) -> (Result<Vec<up::UpOutcome>, UpError>, Vec<UpEvent>) {
    let http = crate::sglang::client::http_client(Default::default()).unwrap();
    let (events, mut received) = mpsc::unbounded_channel();
    let run = Run {
        fleet,
        http: &http,
        api_key: None,
        events: &events,
        cancel,
    };
    let result = up::up(instances, &HEALTH, opts, &run).await;
    drop(events);
    let mut seen = Vec::new();
    while let Some(e) = received.recv().await {
        seen.push(e);
    }
    (result, seen)
}

/// What the fake shows of the log of the server on `port`.
fn tail_of(port: u16) -> Option<String> {
    Some(format!("the end of /tmp/fleet/{port}/server.log\n"))
}

/// Servers on GPUs `0..n` of host `h`, ports from 30000, of the config `fingerprint`.
fn plan_on_h(n: u32, fingerprint: &str) -> Vec<plan::Instance> {
    (0..n)
        .map(|g| planned("h", g, 30000 + g as u16, fingerprint))
        .collect()
}

fn calls(b: &FakeBackend) -> Vec<String> {
    let mut calls = b.table().calls.clone();
    calls.sort();
    calls
}

#[tokio::test]
async fn up_starts_each_planned_server_through_its_backend_and_reads_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let h = fake("h", &dir, ready_server(72).await);
    let fleet = fleet_of(&[&h]);
    let plan = plan_on_h(2, "aaa");
    let (result, events) = run_up(&fleet, &plan, &options(false), &CancellationToken::new()).await;
    let outcomes = result.unwrap();
    assert_eq!(calls(&h), ["start :30000", "start :30001"]);
    for (o, p) in outcomes.iter().zip(&plan) {
        assert_eq!((&o.id, o.port, o.state), (&p.id, p.port, UpState::Ready));
        assert_eq!(o.info.effective_max_running_requests, Some(72));
        assert_eq!(o.pid, Some(u32::from(p.port)));
    }
    let ready = events
        .iter()
        .filter(|e| matches!(e, UpEvent::Ready { .. }))
        .count();
    assert_eq!(ready, 2, "{events:?}");
    // The same plan again finds both running and leaves them be.
    let (again, _) = run_up(&fleet, &plan, &options(false), &CancellationToken::new()).await;
    let states: Vec<UpState> = again.unwrap().iter().map(|o| o.state).collect();
    assert_eq!(states, [UpState::AlreadyRunning; 2]);
    assert_eq!(calls(&h).len(), 2, "nothing more was started");
}

#[tokio::test]
async fn another_config_or_a_foreign_port_starts_nothing_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let h = fake("h", &dir, closed_port());
    h.running(record("h", 0, 30000, "old"));
    h.table().foreign.insert(30001);
    let fleet = fleet_of(&[&h]);
    let plan = plan_on_h(3, "new");
    let (result, _) = run_up(&fleet, &plan, &options(false), &CancellationToken::new()).await;
    let Err(UpError::Conflicts(conflicts)) = result else {
        panic!("expected conflicts, got {result:?}");
    };
    assert!(
        matches!(
            &conflicts[..],
            [
                Conflict::DifferentConfig { .. },
                Conflict::ForeignPort { .. }
            ]
        ),
        "{conflicts:?}"
    );
    assert!(calls(&h).is_empty(), "{:?}", calls(&h));
}

#[tokio::test]
async fn replace_stops_the_old_server_before_it_starts_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let h = fake("h", &dir, ready_server(8).await);
    h.running(record("h", 0, 30000, "old"));
    let fleet = fleet_of(&[&h]);
    let plan = plan_on_h(1, "new");
    let (result, _) = run_up(&fleet, &plan, &options(true), &CancellationToken::new()).await;
    assert_eq!(result.unwrap()[0].state, UpState::Ready);
    assert_eq!(h.table().calls, ["stop :30000", "start :30000"]);
    let fingerprints: Vec<String> = h
        .table()
        .seen
        .iter()
        .map(|s| s.record.fingerprint.clone())
        .collect();
    assert_eq!(fingerprints, ["new"]);
}

#[tokio::test]
async fn a_server_that_cannot_start_or_dies_fails_alone_with_its_reason_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let h = fake("h", &dir, ready_server(8).await);
    h.table().refuse.insert(30001);
    h.table().dies.insert(30002);
    let fleet = fleet_of(&[&h]);
    let plan = plan_on_h(3, "a");
    let (result, _) = run_up(&fleet, &plan, &options(false), &CancellationToken::new()).await;
    let o = result.unwrap();
    let states: Vec<UpState> = o.iter().map(|o| o.state).collect();
    assert_eq!(states, [UpState::Ready, UpState::Failed, UpState::Failed]);
    assert!(
        o[1].error
            .as_deref()
            .unwrap()
            .contains("refused by the test"),
        "{:?}",
        o[1].error
    );
    assert_eq!(
        o[2].error.as_deref(),
        Some("the server process exited during startup")
    );
    assert_eq!(o[2].log_tail, tail_of(30002));
}

#[tokio::test]
async fn an_interrupted_up_stops_what_it_started_and_only_that() {
    let dir = tempfile::tempdir().unwrap();
    // Never ready: the interrupt comes while it loads.
    let h = fake("h", &dir, closed_port());
    h.running(record("h", 1, 30001, "a"));
    let fleet = fleet_of(&[&h]);
    let plan = plan_on_h(2, "a");
    let cancel = CancellationToken::new();
    let http = crate::sglang::client::http_client(Default::default()).unwrap();
    let (events, mut received) = mpsc::unbounded_channel();
    let run = Run {
        fleet: &fleet,
        http: &http,
        api_key: None,
        events: &events,
        cancel: &cancel,
    };
    let interrupt = async {
        while let Some(e) = received.recv().await {
            if matches!(e, UpEvent::Started { .. }) {
                cancel.cancel();
                break;
            }
        }
    };
    let opts = options(false);
    let (result, ()) = tokio::join!(up::up(&plan, &HEALTH, &opts, &run), interrupt);
    let states: Vec<UpState> = result.unwrap().iter().map(|o| o.state).collect();
    assert_eq!(states, [UpState::Interrupted; 2]);
    assert_eq!(h.table().calls, ["start :30000", "stop :30000"]);
    let left: Vec<u16> = h.table().seen.iter().map(|s| s.record.port).collect();
    assert_eq!(left, [30001], "the server found running stays");
}

#[tokio::test]
async fn down_stops_a_profiles_servers_and_a_stuck_one_keeps_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let h = fake("h", &dir, closed_port());
    h.running(record("h", 0, 30000, "a"));
    h.running(record("h", 1, 30001, "a"));
    let mut other = record("h", 2, 30002, "b");
    other.profile = "q".into();
    h.running(other);
    h.table().stuck.insert(30001);
    h.table().gpu_used_mib.insert(0, 300);
    let seen = h.survey().await.unwrap();
    let choice = choose(&seen, Whose::Mine("test"), Some("p"), None);
    let stops = (choice.stop.iter()).map(|r| stop(h.as_ref(), r, Duration::from_secs(1)));
    let mut outcomes = futures::future::join_all(stops).await;
    confirm_gpus_released(h.as_ref(), &mut outcomes).await;
    let got: Vec<(u16, StopState, bool, Option<u64>)> = outcomes
        .iter()
        .map(|o| (o.port, o.state, o.port_closed, o.gpu_memory_used_mib))
        .collect();
    assert_eq!(
        got,
        [
            (30000, StopState::Stopped, true, Some(300)),
            (30001, StopState::Failed, false, None)
        ]
    );
    assert!(outcomes[1].error.as_deref().unwrap().contains("refused"));
    let left: BTreeSet<u16> = h.table().seen.iter().map(|s| s.record.port).collect();
    assert_eq!(left, BTreeSet::from([30001, 30002]));
}

#[tokio::test]
async fn status_reads_each_server_as_its_backend_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let h = fake("h", &dir, ready_server(8).await);
    h.running(record("h", 0, 30000, "a"));
    for (port, liveness, lingering) in [
        (30001, Liveness::Dead, false),
        (30002, Liveness::Dead, true),
        (30003, Liveness::Reused, false),
    ] {
        h.table().seen.push(Seen {
            record: record("h", u32::from(port - 30000), port, "a"),
            liveness,
            lingering,
        });
    }
    let http = crate::sglang::client::http_client(Default::default()).unwrap();
    let look = Look {
        dead_log_tails: true,
        now_unix: 0,
        me: "test",
        only_mine: false,
    };
    let statuses = host_status(h.as_ref(), &http, look).await.unwrap();
    let got: Vec<(String, &str, Option<u16>)> = statuses
        .iter()
        .map(|s| (s.id.to_string(), s.state(), s.health))
        .collect();
    assert_eq!(
        got,
        [
            ("h:gpu0".to_string(), "ready", Some(200)),
            ("h:gpu1".to_string(), "dead", None),
            ("h:gpu2".to_string(), "failing", None),
            ("h:gpu3".to_string(), "gone", None),
        ]
    );
    assert_eq!(statuses[0].mamba_strategy.as_deref(), Some("no_buffer"));
    assert_eq!(statuses[0].log_tail, None);
    assert_eq!(statuses[1].log_tail, tail_of(30001));
}

#[tokio::test]
async fn the_registry_names_servers_by_id_and_the_fleet_reaches_the_running_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ready = ready_server(8).await;
    let (a, b) = (fake("a", &dir, ready), fake("b", &dir, ready));
    a.running(record("a", 0, 30000, "x"));
    a.table().seen.push(Seen {
        record: record("a", 1, 30001, "x"),
        liveness: Liveness::Dead,
        lingering: false,
    });
    b.running(record("b", 0, 30000, "x"));
    let fleet = fleet_of(&[&a, &b]);
    let registry = fleet.servers().await;
    assert_eq!(registry.all().len(), 3);
    let running: Vec<String> = registry
        .running()
        .map(|s| s.record.id.to_string())
        .collect();
    assert_eq!(running, ["a:gpu0", "b:gpu0"]);
    assert!(registry.get(&ServerId::gpu("b", 0), 30000).is_some());
    assert!(registry.get(&ServerId::gpu("b", 0), 30001).is_none());
    assert_eq!(
        registry
            .running_profile("fleet.yaml".into(), "/tmp/fleet")
            .unwrap(),
        "p"
    );
    let targets = fleet.reach(&registry).await;
    let ids: Vec<String> = targets.endpoints.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids, ["a:gpu0", "b:gpu0"]);
    assert_eq!(targets.endpoints[0].base_url, format!("http://{ready}"));
    let links: Vec<&str> = targets.links.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!((targets.tunnels.len(), links), (2, vec!["a", "b"]));
}

#[test]
fn the_running_fleet_names_one_profile_or_says_why_not() {
    let running = |entries: &[(&str, &str, u32)]| {
        let servers = entries
            .iter()
            .map(|(profile, host, gpu)| {
                let mut r = record(host, *gpu, 30000 + *gpu as u16, "x");
                r.profile = profile.to_string();
                Seen {
                    record: r,
                    liveness: Liveness::Running,
                    lingering: false,
                }
            })
            .collect();
        Registry::of(servers).running_profile("fleet.yaml".into(), "/r")
    };
    assert_eq!(
        running(&[("sim", "local", 0), ("sim", "local", 1)]).unwrap(),
        "sim"
    );
    let none = running(&[]).unwrap_err().to_string();
    assert!(
        none.contains("no fleet is up on the hosts of fleet.yaml (run directory /r)"),
        "{none}"
    );
    let several = running(&[("a", "h", 0), ("b", "h", 1), ("b", "g", 0)]);
    assert!(
        several
            .unwrap_err()
            .to_string()
            .contains("runs 2 profiles: a (on h:0), b (on h:1, g:0)")
    );
    assert!(matches!(
        running(&[("base[no_buffer]", "h", 0)]),
        Err(FleetProfileError::Candidate(name)) if name == "base[no_buffer]"
    ));
}

#[tokio::test]
async fn logs_find_a_server_by_host_and_gpu_and_a_port_two_hosts_share_is_ambiguous() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        fake("a", &dir, closed_port()),
        fake("b", &dir, closed_port()),
    );
    a.running(record("a", 0, 30000, "x"));
    b.running(record("b", 0, 30000, "x"));
    let fleet = fleet_of(&[&a, &b]);
    let by_gpu = Selector::HostGpu {
        host: "b".into(),
        gpu: 0,
    };
    let (shell, log) = locate(&fleet, &by_gpu).await.unwrap();
    assert_eq!(
        (shell.host(), log.as_str()),
        ("b", "/tmp/fleet/30000/server.log")
    );
    let shared = locate(&fleet, &Selector::Port(30000)).await.unwrap_err();
    assert!(
        matches!(&shared, LogsError::Ambiguous { port: 30000, hosts } if hosts == "a, b"),
        "{shared}"
    );
}

//! The gateway in tables, pure: after `up`, in `status`, after `down`.

use super::life::RouterStatus;
use super::run::{RouterState, RouterUp};
use crate::launch::backend::StopState;

/// One line after `up`'s table.
pub fn up_line(u: &RouterUp) -> String {
    let ready = u.workers.iter().filter(|w| w.status == "ready").count();
    let how = match u.state {
        RouterState::Started => "started",
        RouterState::AlreadyRunning => "already running",
        RouterState::Replaced => "replaced (its config changed)",
    };
    format!(
        "gateway {} on {} ({how}, pid {}): policy {}, {ready} of {} workers ready\n",
        u.record.url(),
        u.record.host,
        u.record.pid,
        u.record.policy,
        u.workers.len()
    )
}

/// `status`'s block for the gateway: where it is, its policy, and each worker as it says.
pub fn status_text(s: &RouterStatus) -> String {
    let state = if s.running { "running" } else { "dead" };
    let mut out = format!(
        "gateway {} on {} (pid {}, {state}): policy {}\n",
        s.url, s.host, s.pid, s.policy
    );
    match (&s.workers, &s.error) {
        (Some(ws), _) => {
            out.push_str(&format!("  {} workers:\n", ws.len()));
            let mut ws: Vec<_> = ws.iter().collect();
            ws.sort_by(|a, b| a.url.cmp(&b.url));
            for w in ws {
                let health = if w.is_healthy { "healthy" } else { "unhealthy" };
                out.push_str(&format!(
                    "    {}  {}  {health}  load {}\n",
                    w.url, w.status, w.load
                ));
            }
        }
        (None, Some(e)) => out.push_str(&format!("  workers unknown: {e}\n")),
        (None, None) => {}
    }
    out
}

/// One line after `down` stopped the gateway.
pub fn down_line(url: &str, host: &str, state: StopState) -> String {
    format!("gateway {url} on {host}: {}\n", state.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::gateway::GatewayWorker;

    #[test]
    fn status_lists_each_worker_as_the_gateway_reports_it() {
        let s = RouterStatus {
            host: "ct200".into(),
            url: "http://10.0.0.5:30080".into(),
            policy: "cache_aware".into(),
            pid: 42,
            running: true,
            workers: Some(vec![GatewayWorker {
                id: "u1".into(),
                url: "http://10.0.0.5:30000".into(),
                status: "ready".into(),
                is_healthy: true,
                load: 3,
            }]),
            error: None,
        };
        assert_eq!(
            status_text(&s),
            "gateway http://10.0.0.5:30080 on ct200 (pid 42, running): policy cache_aware\n  \
             1 workers:\n    http://10.0.0.5:30000  ready  healthy  load 3\n"
        );
        let unknown = RouterStatus {
            workers: None,
            error: Some("refused".into()),
            running: false,
            ..s
        };
        assert!(
            status_text(&unknown).contains("dead")
                && status_text(&unknown).contains("workers unknown: refused")
        );
    }
}

//! Keeping the gateway's workers true, pure: from the servers fleet sees running and the
//! workers the gateway lists, what to add and what to remove.

use std::collections::BTreeSet;

use super::gateway::GatewayWorker;

/// What the gateway must be told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// URLs to `POST /workers`.
    pub add: Vec<String>,
    /// Workers to `DELETE /workers/{id}`: (id, url).
    pub remove: Vec<(String, String)>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

/// `want`: the URLs of the servers that run. A listed worker no server stands behind goes; a
/// server the gateway does not list (or lists only as draining, on its way out) comes in.
/// Workers already draining are left to finish.
pub fn reconcile(want: &BTreeSet<String>, listed: &[GatewayWorker]) -> Changes {
    let kept: BTreeSet<&str> = listed
        .iter()
        .filter(|w| !w.draining())
        .map(|w| w.url.as_str())
        .collect();
    Changes {
        add: want
            .iter()
            .filter(|u| !kept.contains(u.as_str()))
            .cloned()
            .collect(),
        remove: listed
            .iter()
            .filter(|w| !w.draining() && !want.contains(&w.url))
            .map(|w| (w.id.clone(), w.url.clone()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: &str, port: u16, status: &str) -> GatewayWorker {
        GatewayWorker {
            id: id.into(),
            url: format!("http://10.0.0.5:{port}"),
            status: status.into(),
            is_healthy: status == "ready",
            load: 0,
        }
    }

    fn want(ports: &[u16]) -> BTreeSet<String> {
        ports
            .iter()
            .map(|p| format!("http://10.0.0.5:{p}"))
            .collect()
    }

    #[test]
    fn a_lost_server_goes_and_a_new_one_comes() {
        let listed = [w("a", 30000, "ready"), w("b", 30001, "ready")];
        let c = reconcile(&want(&[30000, 30002]), &listed);
        assert_eq!(c.add, vec!["http://10.0.0.5:30002".to_string()]);
        assert_eq!(
            c.remove,
            vec![("b".to_string(), "http://10.0.0.5:30001".to_string())]
        );
    }

    #[test]
    fn in_step_means_nothing_to_do_and_draining_is_left_alone() {
        let listed = [
            w("a", 30000, "ready"),
            w("b", 30001, "pending"),
            w("c", 30002, "draining"),
        ];
        assert!(reconcile(&want(&[30000, 30001]), &listed).is_empty());
        // A server back on a port whose old worker still drains is added again.
        let c = reconcile(&want(&[30000, 30001, 30002]), &listed);
        assert_eq!(c.add, vec!["http://10.0.0.5:30002".to_string()]);
        assert!(c.remove.is_empty());
    }
}

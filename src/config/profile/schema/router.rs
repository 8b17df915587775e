//! The `router:` section of the schema: the gateway `fleet up` starts in front of the servers.

use super::super::super::RouterSettings;
use super::super::super::check::{Checker, Fields};
use super::super::super::yaml::{Node, Value};
use super::{Field, Optional, Profile, Section, arg_list, launcher, opt_str, string, strs};

/// Clear of SGLang's 30000 and the servers counted up from it.
pub(crate) const DEFAULT_PORT: u16 = 30080;
/// The gateway's own default policy (`smg launch --help`).
const DEFAULT_POLICY: &str = "cache_aware";

/// The gateway flags fleet renders itself, refused in `router.extra_args`.
pub(crate) const RENDERED: &[&str] = &[
    "--host",
    "--port",
    "--worker-urls",
    "--policy",
    "--dp-aware",
    "--api-key",
    "--prometheus-host",
    "--prometheus-port",
];

fn settings(p: &mut Profile) -> &mut RouterSettings {
    p.router.get_or_insert_with(blank)
}

fn blank() -> RouterSettings {
    RouterSettings {
        launcher: Vec::new(),
        port: DEFAULT_PORT,
        policy: DEFAULT_POLICY.to_string(),
        host: None,
        dp_aware: false,
        extra_args: Vec::new(),
    }
}

fn get<T>(p: &Profile, f: impl Fn(&RouterSettings) -> T, default: T) -> T {
    p.router.as_ref().map_or(default, f)
}

pub(super) const SECTION: Section = Section {
    key: "router",
    fields: &[
        Field {
            key: "launcher",
            required: true,
            flags: &[],
            read: |c, n, f, p| {
                if let Some(n) = n {
                    settings(p).launcher = launcher(c, n, f);
                }
            },
            write: |p| get(p, |r| strs(&r.launcher), Value::Null),
        },
        Field {
            key: "port",
            required: false,
            flags: &[],
            read: |c, n, f, p| {
                if let Some(v) = n.and_then(|n| c.int(n, f, 1, 65535)) {
                    settings(p).port = v as u16;
                }
            },
            write: |p| get(p, |r| Value::Int(r.port.into()), Value::Null),
        },
        Field {
            key: "policy",
            required: false,
            flags: &[],
            read: |c, n, f, p| {
                if let Some(v) = string(c, n, f) {
                    settings(p).policy = v;
                }
            },
            write: |p| get(p, |r| Value::Str(r.policy.clone()), Value::Null),
        },
        Field {
            key: "host",
            required: false,
            flags: &[],
            read: |c, n, f, p| {
                if let Some(v) = string(c, n, f) {
                    settings(p).host = Some(v);
                }
            },
            write: |p| get(p, |r| opt_str(&r.host), Value::Null),
        },
        Field {
            key: "dp_aware",
            required: false,
            flags: &[],
            read: |c, n, f, p| {
                if let Some(v) = n.and_then(|n| c.bool(n, f)) {
                    settings(p).dp_aware = v;
                }
            },
            write: |p| get(p, |r| Value::Bool(r.dp_aware), Value::Null),
        },
        Field {
            key: "extra_args",
            required: false,
            flags: &[],
            read: |c, n, f, p| {
                if let Some(n) = n {
                    settings(p).extra_args = extra_args(c, n, f);
                }
            },
            write: |p| get(p, |r| strs(&r.extra_args), Value::Null),
        },
    ],
    optional: Some(Optional {
        open: |p| p.router = Some(blank()),
        is_set: |p| p.router.is_some(),
    }),
    check: Some(port_apart),
};

fn extra_args(c: &mut Checker, node: &Node, field: &str) -> Vec<String> {
    arg_list(c, node, field, |flag| {
        RENDERED.contains(&flag).then(|| {
            "use router.port, router.policy, router.dp_aware or api_key_env; the workers are \
             the fleet's ready servers"
                .to_string()
        })
    })
}

/// The gateway's port must not be one a server of this profile listens on: GPU i's is
/// `port_base + i`, and no host has more than 64 GPUs.
fn port_apart(c: &mut Checker, f: &Fields, p: &Profile) {
    let Some(r) = &p.router else { return };
    let servers = p.port_base..p.port_base.saturating_add(64);
    if servers.contains(&r.port)
        && let Some(node) = f.get("port")
    {
        c.report(
            node.loc,
            &f.field("port"),
            format!(
                "{} is among the servers' ports ({} and up, one per GPU)",
                r.port, p.port_base
            ),
            Some("choose a port below port_base or far above it".into()),
        );
    }
}

//! Using fleet as a library: plan the Proxmox fleet of `examples/fleet.yaml` with the shipped
//! `blackwell-no-buffer` profile, as `fleet up --dry-run` would, and preflight it against two
//! SGLang versions' real `--help` — all pure, no host is contacted.
//!
//!     cargo run --example plan

use std::collections::BTreeMap;
use std::path::Path;

use fleet::config::{self, MambaStrategy};
use fleet::launch::plan::{self, HostFacts};
use fleet::launch::{preflight, report};
use fleet::sglang::help::HelpSpec;

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let inventory = config::load_inventory(&root.join("examples/fleet.yaml"))?;
    let profile = config::load_profile("blackwell-no-buffer", &root.join("profiles"))?;

    for (version, help) in [
        (
            "0.5.23",
            include_str!("../tests/fixtures/sglang/help-0.5.23.txt"),
        ),
        (
            "0.5.10",
            include_str!("../tests/fixtures/sglang/help-0.5.10.txt"),
        ),
    ] {
        // What `fleet up` learns from each host before planning: its `--help`, its SGLang
        // version and the address its servers are reached at.
        let hosts: Vec<_> = inventory
            .hosts
            .iter()
            .map(|h| {
                let facts = HostFacts {
                    help: Some(HelpSpec::parse(help)),
                    version: Some(version.to_string()),
                    address: h
                        .machine()
                        .and_then(|m| m.address.clone())
                        .unwrap_or_else(|| "127.0.0.1".into()),
                    gpus_present: (0..8).collect(),
                    places: Vec::new(),
                    topology: fleet::launch::plan::Topology::NotRead,
                };
                (h.clone(), facts)
            })
            .collect();
        let instances = plan::plan(&profile, &hosts, None, None, plan::DEFAULT_RUN_ROOT)?;
        let versions: BTreeMap<_, _> = hosts
            .iter()
            .map(|(h, f)| (h.name().to_string(), f.version.clone()))
            .collect();
        println!(
            "== SGLang {version}: the mamba strategy flag is rendered as the host's --help names it"
        );
        print!("{}", report::plan_text(&instances[..2], &versions));
        println!("   ... {} instances in all", instances.len());

        // extra_buffer_lazy exists only from 0.5.15: preflight says so before anything starts.
        let mut lazy = profile.clone();
        lazy.server.mamba_strategy = Some(MambaStrategy::ExtraBufferLazy);
        let instances = plan::plan(&lazy, &hosts, None, None, plan::DEFAULT_RUN_ROOT)?;
        let facts: BTreeMap<_, _> = hosts
            .into_iter()
            .map(|(h, f)| (h.name().to_string(), f))
            .collect();
        match preflight::preflight(&instances, &facts) {
            Ok(()) => println!("preflight of mamba_strategy: extra_buffer_lazy: ok\n"),
            Err(e) => println!("preflight of mamba_strategy: extra_buffer_lazy:\n{e}\n"),
        }
    }
    Ok(())
}

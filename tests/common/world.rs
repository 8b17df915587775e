//! A test world of several SSH hosts, as the field has them: each host its own sshd on
//! 127.0.0.1 with its own host key, one Proxmox container each (its own id, its own `/tmp`
//! through the fake `pct`), its servers on its own loopback address (127.0.0.2, 127.0.0.3, …,
//! the inventory's `address:`), and one HOME whose `~/.ssh/config` names them all.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::{Sshd, TestHome};

pub struct WorldHost {
    /// The inventory name, `ct<container>`.
    pub name: String,
    /// Its `Host` alias in `~/.ssh/config`.
    pub alias: String,
    pub container: u32,
    /// Where its container's servers listen (distinct per host).
    pub address: String,
    pub sshd: Sshd,
}

pub struct World {
    pub hosts: Vec<WorldHost>,
    pub home: TestHome,
}

impl World {
    /// `n` hosts; host i has container `200 + i` and address `127.0.0.{2 + i}`.
    pub fn new(n: usize) -> World {
        World::with_env(n, &[])
    }

    /// [`World::new`] with `env` in every SSH session of every host (e.g. the fake
    /// `nvidia-smi`'s board, `FAKE_NVIDIA_SMI_TOPO`).
    pub fn with_env(n: usize, env: &[(&str, &str)]) -> World {
        let home = TestHome::empty();
        let hosts: Vec<WorldHost> = (0..n)
            .map(|i| {
                let container = 200 + i as u32;
                let running = container.to_string();
                let mut session = vec![("FAKE_PCT_RUNNING", running.as_str())];
                session.extend_from_slice(env);
                let sshd = Sshd::start_with_env(&session);
                let alias = format!("world-host{}", i + 1);
                let key = format!("{alias}_key");
                home.add_key(&sshd.client_key, &key);
                home.append_config(&sshd.config_block(&alias, &format!("~/.ssh/{key}")));
                home.trust(&sshd.known_hosts_line());
                WorldHost {
                    name: format!("ct{container}"),
                    alias,
                    container,
                    address: format!("127.0.0.{}", 2 + i),
                    sshd,
                }
            })
            .collect();
        World { hosts, home }
    }

    /// Writes `fleet.yaml` with every host (`gpus` as YAML, e.g. `[0, 1]`) and returns its path.
    pub fn inventory(&self, gpus: &str) -> PathBuf {
        let mut yaml = String::from("hosts:\n");
        for h in &self.hosts {
            yaml.push_str(&format!(
                "  - name: {}\n    ssh: {}\n    container: {}\n    address: {}\n    gpus: {gpus}\n",
                h.name, h.alias, h.container, h.address
            ));
        }
        self.home.write_inventory(&yaml)
    }

    /// The real `fleet` as this world's user: its HOME (so its `~/.ssh`) and working
    /// directory, no SSH agent and none of the caller's `FLEET_*` settings, stdin closed.
    pub fn fleet(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fleet"));
        c.env("HOME", self.home.path())
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("FLEET_CONFIG")
            .env_remove("FLEET_LOG")
            .env_remove("FLEET_RUN_DIR")
            .current_dir(self.home.path())
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// `fleet up` of a no_buffer sim profile (`profiles/sim.yaml`, `server` lines added under
    /// its `server:`) on GPUs `0..gpus` of every host, its time sped up `time_scale` times.
    pub fn up_sims(&self, gpus: u16, server: &[&str], time_scale: u32) {
        let list: Vec<String> = (0..gpus).map(|g| g.to_string()).collect();
        self.inventory(&format!("[{}]", list.join(", ")));
        let port_base = super::free_port_base(gpus);
        let extra: String = server.iter().map(|l| format!("  {l}\n")).collect();
        std::fs::create_dir_all(self.home.path().join("profiles")).unwrap();
        std::fs::write(
            self.home.path().join("profiles/sim.yaml"),
            format!(
                "model: /models/test\nlauncher: [{}]\nport_base: {port_base}\nserver:\n  \
                 mamba_strategy: no_buffer\n{extra}env:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  \
                 SGLANG_SIM_TIME_SCALE: \"{time_scale}\"\n",
                super::local_fleet::SIM
            ),
        )
        .unwrap();
        let o = self.fleet(&["up", "--profile", "sim"]).output().unwrap();
        assert!(
            o.status.success(),
            "up: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Where `path` (under `/tmp` inside host i's container) is seen from here.
    pub fn container_path(&self, i: usize, path: &str) -> PathBuf {
        let h = &self.hosts[i];
        h.sshd.container_path(h.container, path)
    }
}

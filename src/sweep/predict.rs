//! The sweep's memory prediction (`layout::predict`): each host's model and GPU memory, read
//! once before anything starts; each candidate predicted on the host of its first GPU, so that
//! a layout predicted not to fit is skipped with its reason and the others' predicted cap is
//! held against the measured one.

use std::collections::BTreeMap;

use crate::config::Profile;
use crate::launch::fleet::Fleet;
use crate::launch::model_facts;
use crate::layout::predict::{self, Model, Prediction, Server};

use super::assign::Slot;

/// What one host's servers of the sweep's model are predicted from.
#[derive(Debug, Clone, PartialEq)]
pub struct HostMemory {
    pub model: Model,
    /// The smallest GPU of the host, MiB.
    pub gpu_mib: u64,
}

/// The hosts the prediction could read, and the model path read there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Predictor {
    pub model_path: String,
    pub hosts: BTreeMap<String, HostMemory>,
}

/// What the prediction says of a candidate before it starts.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Fits(Prediction),
    /// Predicted not to fit: never started, with the reason.
    Unfit(String),
    /// Nothing to predict from (no model read, no static fraction set).
    Unknown,
}

/// The value of `--name` in an argument list, as `--name V` or `--name=V` (the last wins, as
/// argparse takes it).
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let mut found = None;
    for (i, a) in args.iter().enumerate() {
        if a == name {
            found = args.get(i + 1).map(String::as_str);
        } else if let Some(v) = a.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            found = Some(v);
        }
    }
    found
}

/// The server as the profile asks for it; `None` without a static fraction, which SGLang would
/// pick itself at start-up from what it measures.
pub fn server(profile: &Profile, gpu_mib: u64) -> Option<Server> {
    let s = &profile.server;
    let extra = |name: &str| flag(&s.extra_args, name);
    let num = |name: &str| extra(name).and_then(|v| v.trim().parse::<u64>().ok());
    Some(Server {
        parallel: s.parallel,
        gpu_mib,
        mem_fraction_static: s
            .mem_fraction_static
            .or_else(|| extra("--mem-fraction-static")?.trim().parse().ok())?,
        context_length: s
            .context_length
            .map(u64::from)
            .or_else(|| num("--context-length")),
        max_running_requests: s
            .max_running_requests
            .map(u64::from)
            .or_else(|| num("--max-running-requests")),
        max_total_tokens: num("--max-total-tokens"),
    })
}

impl Predictor {
    /// Predicts `profile`'s servers on the host of `slots`' first GPU.
    pub fn verdict(&self, profile: &Profile, slots: &[Slot]) -> Verdict {
        let Some(host) = slots.first().and_then(|s| self.hosts.get(&s.host)) else {
            return Verdict::Unknown;
        };
        if profile.model != self.model_path {
            return Verdict::Unknown;
        }
        let Some(server) = server(profile, host.gpu_mib) else {
            return Verdict::Unknown;
        };
        match predict::predict(&host.model, &server) {
            Ok(p) => Verdict::Fits(p),
            Err(unfit) => Verdict::Unfit(format!("predicted not to fit: {unfit}")),
        }
    }

    /// Reads `base`'s model and each host's GPU memory on every host of `fleet`. What cannot
    /// be read leaves that host without a prediction; the reasons come back to be said once.
    pub async fn read(fleet: &Fleet, base: &Profile) -> (Predictor, Vec<String>) {
        let path = base.model.clone();
        let reads = fleet.backends().map(|b| {
            let path = &path;
            async move {
                let (model, gpus) =
                    tokio::join!(model_facts::read(b.shell().as_ref(), path), b.gpus());
                let gpu_mib = gpus
                    .map_err(|e| e.to_string())?
                    .iter()
                    .map(|g| g.memory_total_mib)
                    .min()
                    .ok_or_else(|| format!("{}: no GPU memory read", b.host()))?;
                let model = model.map_err(|e| e.to_string())?;
                Ok::<_, String>((b.host().to_string(), HostMemory { model, gpu_mib }))
            }
        });
        let mut predictor = Predictor {
            model_path: path.clone(),
            hosts: BTreeMap::new(),
        };
        let mut notes = Vec::new();
        for read in futures::future::join_all(reads).await {
            match read {
                Ok((host, memory)) => {
                    predictor.hosts.insert(host, memory);
                }
                Err(e) => notes.push(format!("no memory prediction: {e}")),
            }
        }
        if base.server.mem_fraction_static.is_none()
            && flag(&base.server.extra_args, "--mem-fraction-static").is_none()
        {
            notes.push(
                "no memory prediction where a candidate sets no mem_fraction_static: SGLang \
                 picks it at start-up"
                    .into(),
            );
        }
        (predictor, notes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn flags_are_read_as_argparse_takes_them() {
        let args = s(&["--max-total-tokens", "100", "--x", "--max-total-tokens=200"]);
        assert_eq!(flag(&args, "--max-total-tokens"), Some("200"));
        assert_eq!(flag(&args, "--max-total"), None);
    }

    #[test]
    fn a_candidate_is_predicted_on_its_hosts_gpus_from_its_own_settings() {
        let config = r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16,
            "max_position_embeddings": 512}"#;
        let predictor = Predictor {
            model_path: "/m".into(),
            hosts: BTreeMap::from([(
                "h".to_string(),
                HostMemory {
                    model: Model::from_config(config, 3 << 30).unwrap(),
                    gpu_mib: 4096,
                },
            )]),
        };
        let slot = [Slot {
            host: "h".into(),
            gpu: 0,
        }];
        let mut p = crate::sglang::flags::tests::profile();
        p.model = "/m".into();
        p.server.mem_fraction_static = None;
        assert_eq!(
            predictor.verdict(&p, &slot),
            Verdict::Unknown,
            "no fraction"
        );
        p.server.extra_args = s(&["--mem-fraction-static", "0.5"]);
        let Verdict::Unfit(why) = predictor.verdict(&p, &slot) else {
            panic!("3 GiB in a 2 GiB pool");
        };
        assert!(why.contains("weights 3.0 GiB per GPU"), "{why}");
        p.server.parallel.tp = 2;
        assert!(matches!(predictor.verdict(&p, &slot), Verdict::Fits(_)));
        p.model = "/other".into();
        assert_eq!(predictor.verdict(&p, &slot), Verdict::Unknown);
    }
}

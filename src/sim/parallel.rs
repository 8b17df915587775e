//! Servers over several GPUs and nodes: SGLang's layout rules (how many GPUs a server takes,
//! which of the visible ones each rank takes, what start-up refuses), and the all-reduce a
//! tensor-parallel group pays each step, by the slowest link between its GPUs.
//!
//! All-reduce calibration (`--sim-link-gb-s`, `--sim-link-latency-ms`,
//! `--sim-allreduce-mib-per-token`): a step of b tokens on a TP group of t GPUs costs
//! `(t − 1) × latency + 2(t − 1)/t × b × 1.25 MiB ÷ bandwidth` (a ring: every rank sends and
//! receives 2(t − 1)/t of the buffer; each extra rank adds a hop to every one of the step's
//! 128 all-reduces). 1.25 MiB a token is a 27B model's 64 layers × 2 all-reduces × hidden 5120
//! × bf16. The bandwidths are NCCL bus bandwidths of the link classes as boards deliver them:
//! NVLink 25 GB/s per bonded link (NV12 = 300), PCIe 5.0 x16 peer-to-peer through one switch
//! (PIX) 40, several bridges (PXB) 32, through the CPU's root complex (PHB) 24, between host
//! bridges of one socket (NODE) 20, across the socket interconnect (SYS, where peer-to-peer
//! is staged through host memory) 10, and between nodes (NET, a 100 Gb/s NIC) 12. The
//! latencies (per step and extra rank: 0.1 ms on NVLink to 1.8 ms across sockets, 2.5 between
//! nodes) are those 128 all-reduces at 1–20 µs each.
//!
//! With the defaults and a 120 GiB model (too big for one 95.59 GiB GPU), output tok/s per GPU
//! at saturation: TP2 on a PCIe switch pair 1,176, TP2 across sockets 914, TP4 within a socket
//! (NODE) 836, TP8 over both sockets 347, TP8 on NVLink (NV18) 1,353
//! (`tests::layouts_rank_as_on_a_pcie_board`).

use std::fmt;

use crate::layout::topology::{Board, Link};
use crate::sim::server_args::Refusal;

/// How the server spreads over GPUs, as SGLang resolves its flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub tp: u64,
    /// Plain data-parallel replicas (`--dp-size` without attention DP), each a TP group.
    pub dp: u64,
    /// Attention data parallelism: the TP group's attention split into this many DP ranks
    /// (`--attn-dp-size`, or the deprecated `--dp-size N --enable-dp-attention`).
    pub attn_dp: u64,
    /// `--ep-size`: accepted and reported; the simulated model has no experts to place.
    pub ep: u64,
    pub nnodes: u64,
    pub node_rank: u64,
    pub base_gpu_id: u64,
    pub gpu_id_step: u64,
    /// `--dist-init-addr HOST:PORT`: rank 0's rendezvous.
    pub dist_init_addr: Option<String>,
    /// `--dist-timeout` in seconds, if given.
    pub dist_timeout_secs: Option<f64>,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            tp: 1,
            dp: 1,
            attn_dp: 1,
            ep: 1,
            nnodes: 1,
            node_rank: 0,
            base_gpu_id: 0,
            gpu_id_step: 1,
            dist_init_addr: None,
            dist_timeout_secs: None,
        }
    }
}

/// The flags as given, before SGLang resolves them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Given {
    pub tp: i64,
    pub dp: i64,
    pub attn_dp: Option<i64>,
    pub enable_dp_attention: bool,
    pub ep: i64,
    pub nnodes: i64,
    pub node_rank: i64,
    pub base_gpu_id: i64,
    pub gpu_id_step: i64,
    pub dist_init_addr: Option<String>,
    pub dist_timeout_secs: Option<f64>,
}

/// Why a rank cannot take its GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `torch.cuda.set_device` of an ordinal past CUDA_VISIBLE_DEVICES (`model_runner.py`).
    #[error("CUDA error: invalid device ordinal")]
    InvalidOrdinal { ordinal: u64, visible: usize },
}

fn refusal(file: &'static str, function: &'static str, line: u32, code: &'static str) -> Refusal {
    Refusal {
        file,
        function,
        line,
        code,
        error: String::new(),
    }
}

impl Layout {
    /// Resolves the flags as 0.5.23's `srt/arg_groups/parallel_hook.py` and
    /// `validation_hook.py` do, refusing what they refuse (a traceback, exit 1).
    pub fn resolve(g: &Given) -> Result<Layout, Refusal> {
        // validation_hook.py `check_server_args`.
        if g.base_gpu_id < 0 {
            return Err(Refusal {
                error: "AssertionError: base_gpu_id must be non-negative".into(),
                ..refusal(
                    "srt/arg_groups/validation_hook.py",
                    "check_server_args",
                    202,
                    "assert cfg.base_gpu_id >= 0, \"base_gpu_id must be non-negative\"",
                )
            });
        }
        if g.gpu_id_step < 1 {
            return Err(Refusal {
                error: "AssertionError: gpu_id_step must be positive".into(),
                ..refusal(
                    "srt/arg_groups/validation_hook.py",
                    "check_server_args",
                    203,
                    "assert cfg.gpu_id_step >= 1, \"gpu_id_step must be positive\"",
                )
            });
        }
        let (mut dp, mut attn_dp) = (g.dp.max(1), g.attn_dp.unwrap_or(1));
        if g.enable_dp_attention {
            // parallel_hook.py `handle_deprecated_dp_attention`: the old spelling's dp_size is
            // the attention-DP width, and dp_size counts replicas again (one).
            if attn_dp == 1 {
                attn_dp = dp;
            }
            dp = 1;
        }
        // parallel_hook.py `handle_data_parallelism`.
        if attn_dp < 1 {
            return Err(Refusal {
                error: format!("ValueError: --attn-dp-size must be positive (got {attn_dp})."),
                ..refusal(
                    "srt/arg_groups/parallel_hook.py",
                    "handle_data_parallelism",
                    286,
                    "raise ValueError(f\"--attn-dp-size must be positive (got {cfg.attn_dp_size}).\")",
                )
            });
        }
        if attn_dp > 1 && dp > 1 {
            return Err(Refusal {
                error: format!(
                    "ValueError: --dp-size {dp} with --attn-dp-size {attn_dp}: data-parallel \
                     replicas combined with attention data parallelism are not supported."
                ),
                ..refusal(
                    "srt/arg_groups/parallel_hook.py",
                    "handle_data_parallelism",
                    288,
                    "raise ValueError(",
                )
            });
        }
        let tp = g.tp.max(1);
        if attn_dp > 1 && tp % attn_dp != 0 {
            return Err(Refusal {
                error: "AssertionError".into(),
                ..refusal(
                    "srt/arg_groups/parallel_hook.py",
                    "handle_data_parallelism",
                    326,
                    "assert cfg.tp_size % cfg.attn_dp_size == 0",
                )
            });
        }
        let nnodes = g.nnodes.max(1);
        if tp % nnodes != 0 {
            return Err(Refusal {
                error: "AssertionError: tp_size must be divisible by number of nodes".into(),
                ..refusal(
                    "srt/arg_groups/validation_hook.py",
                    "check_server_args",
                    179,
                    "assert (cfg.tp_size * cfg.pp_size) % cfg.nnodes == 0, (",
                )
            });
        }
        if dp > 1 && nnodes != 1 {
            return Err(Refusal {
                error: "AssertionError: multi-node data-parallel replicas are not supported; \
                        use attention DP (--attn-dp-size) across nodes"
                    .into(),
                ..refusal(
                    "srt/arg_groups/validation_hook.py",
                    "check_server_args",
                    199,
                    "assert not (cfg.dp_size > 1 and cfg.nnodes != 1), (",
                )
            });
        }
        Ok(Layout {
            tp: tp as u64,
            dp: dp as u64,
            attn_dp: attn_dp as u64,
            ep: g.ep.max(1) as u64,
            nnodes: nnodes as u64,
            node_rank: g.node_rank.max(0) as u64,
            base_gpu_id: g.base_gpu_id as u64,
            gpu_id_step: g.gpu_id_step as u64,
            dist_init_addr: g.dist_init_addr.clone(),
            dist_timeout_secs: g.dist_timeout_secs,
        })
    }

    /// GPUs of the whole server: tp × dp replicas; with attention DP the DP ranks share the
    /// TP group's GPUs.
    pub fn gpus(&self) -> u64 {
        self.tp * self.dp
    }

    pub fn gpus_per_node(&self) -> u64 {
        self.gpus() / self.nnodes
    }

    /// Schedulers with their own pool and cap: one per replica or attention-DP rank
    /// (`num_dp_ranks_of` in `srt/runtime_context.py`).
    pub fn dp_ranks(&self) -> u64 {
        self.dp * self.attn_dp
    }

    /// The GPUs the attention heads (and KV heads) are split over (`derive_attn_tp_size`).
    pub fn attn_tp(&self) -> u64 {
        self.tp / self.attn_dp
    }

    /// The device ordinals this node's ranks take: replica r's TP rank t (of the tp ÷ nnodes on
    /// this node) on `base_gpu_id + (r × tp_per_node + t) × gpu_id_step`
    /// (`srt/entrypoints/engine.py`, `srt/managers/data_parallel_controller.py`).
    pub fn ordinals(&self) -> Vec<u64> {
        let per_node = self.tp / self.nnodes;
        (0..self.dp)
            .flat_map(|r| {
                (0..per_node).map(move |t| self.base_gpu_id + (r * per_node + t) * self.gpu_id_step)
            })
            .collect()
    }

    /// The physical GPUs of this node's ranks: each ordinal indexes CUDA_VISIBLE_DEVICES.
    pub fn local_gpus(&self, visible: &[u32]) -> Result<Vec<u32>, DeviceError> {
        self.ordinals()
            .into_iter()
            .map(|o| {
                visible
                    .get(o as usize)
                    .copied()
                    .ok_or(DeviceError::InvalidOrdinal {
                        ordinal: o,
                        visible: visible.len(),
                    })
            })
            .collect()
    }

    /// The slowest hop any TP group's all-reduce crosses: a group over several nodes crosses
    /// the network; on one node, the board's slowest link inside each replica's group (every
    /// step waits for the slowest replica). No board: a PCIe switch (`PIX`).
    pub fn hop(&self, board: Option<&Board>, local: &[u32]) -> Hop {
        if self.nnodes > 1 {
            return Hop::Net;
        }
        let per_group = (self.tp as usize).max(1);
        local
            .chunks(per_group)
            .map(|group| {
                board
                    .and_then(|b| b.slowest(group))
                    .map_or(Hop::Link(Link::Pix), Hop::Link)
            })
            .min()
            .unwrap_or(Hop::Link(Link::Pix))
    }
}

/// What an all-reduce crosses: a link of the board, or the network between nodes (slowest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hop {
    Net,
    Link(Link),
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hop::Net => f.write_str("NET"),
            Hop::Link(l) => l.fmt(f),
        }
    }
}

/// `--sim-link-gb-s`'s default (see the calibration above).
pub const DEFAULT_GB_S: &str = "NV=25,PIX=40,PXB=32,PHB=24,NODE=20,SYS=10,NET=12";
/// `--sim-link-latency-ms`'s default.
pub const DEFAULT_LATENCY_MS: &str = "NV=0.1,PIX=0.6,PXB=0.7,PHB=0.9,NODE=1,SYS=1.8,NET=2.5";

const CLASSES: [&str; 7] = ["NV", "PIX", "PXB", "PHB", "NODE", "SYS", "NET"];

/// One number per link class (`NV` per bonded NVLink), parsed from `NV=25,PIX=40,...`.
#[derive(Debug, Clone, PartialEq)]
pub struct PerLink([f64; 7]);

impl PerLink {
    /// Every class must be named once: a forgotten class would silently cost nothing.
    pub fn parse(spec: &str) -> Result<PerLink, String> {
        let mut v = [f64::NAN; 7];
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, x) = item
                .split_once('=')
                .ok_or_else(|| format!("`{item}` is not CLASS=NUMBER"))?;
            let i = CLASSES
                .iter()
                .position(|c| c.eq_ignore_ascii_case(k.trim()))
                .ok_or_else(|| format!("`{k}` is not one of {}", CLASSES.join(", ")))?;
            v[i] = x
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("`{x}` is not a non-negative number"))?;
        }
        match CLASSES.iter().zip(v).find(|(_, x)| x.is_nan()) {
            Some((c, _)) => Err(format!("no value for {c}")),
            None => Ok(PerLink(v)),
        }
    }

    fn class(hop: Hop) -> usize {
        match hop {
            Hop::Link(Link::Nv(_)) => 0,
            Hop::Link(Link::Pix) => 1,
            Hop::Link(Link::Pxb) => 2,
            Hop::Link(Link::Phb) => 3,
            Hop::Link(Link::Node) => 4,
            Hop::Link(Link::Sys) => 5,
            Hop::Net => 6,
        }
    }

    pub fn get(&self, hop: Hop) -> f64 {
        self.0[Self::class(hop)]
    }
}

/// The parallel shape a memory plan and step times are computed for.
#[derive(Debug, Clone, PartialEq)]
pub struct Parallel {
    pub tp: u64,
    pub attn_tp: u64,
    pub dp_ranks: u64,
    /// Attention DP: the DP ranks share one TP group, whose all-reduce carries every rank's
    /// tokens (plain replicas all-reduce only their own).
    pub attention_dp: bool,
    pub hop: Hop,
    /// Resolved for `hop`: GB/s and ms per extra rank.
    pub gb_s: f64,
    pub latency_ms: f64,
}

impl Default for Parallel {
    fn default() -> Self {
        Parallel {
            tp: 1,
            attn_tp: 1,
            dp_ranks: 1,
            attention_dp: false,
            hop: Hop::Link(Link::Pix),
            gb_s: 40.0,
            latency_ms: 0.6,
        }
    }
}

impl Parallel {
    pub fn new(layout: &Layout, hop: Hop, gb_s: &PerLink, latency_ms: &PerLink) -> Parallel {
        let links = match hop {
            Hop::Link(Link::Nv(n)) => f64::from(n.max(1)),
            _ => 1.0,
        };
        Parallel {
            tp: layout.tp,
            attn_tp: layout.attn_tp(),
            dp_ranks: layout.dp_ranks(),
            attention_dp: layout.attn_dp > 1,
            hop,
            gb_s: gb_s.get(hop) * links,
            latency_ms: latency_ms.get(hop),
        }
    }

    /// Requests (or prompt tokens) each DP rank runs of a step's `n`: the DP controller
    /// round-robins requests, so the sim runs one scheduler whose step takes as long as one
    /// rank's share.
    pub fn per_rank(&self, n: u64) -> u64 {
        n.div_ceil(self.dp_ranks.max(1))
    }

    /// Milliseconds of the all-reduces of one step over `tokens` tokens (a step's batch).
    pub fn allreduce_ms(&self, tokens: u64, mib_per_token: f64) -> f64 {
        if self.tp <= 1 {
            return 0.0;
        }
        let t = self.tp as f64;
        let carried = if self.attention_dp {
            tokens
        } else {
            self.per_rank(tokens)
        };
        let bytes = carried as f64 * mib_per_token * 1024.0 * 1024.0;
        let transfer_ms = 2.0 * (t - 1.0) / t * bytes / (self.gb_s.max(1e-6) * 1e9) * 1000.0;
        (t - 1.0) * self.latency_ms + transfer_ms
    }
}

/// CUDA_VISIBLE_DEVICES as a list, or, unset, every GPU of the board (`FAKE_NVIDIA_SMI_TOPO`)
/// or of the fake `nvidia-smi` (`FAKE_NVIDIA_SMI_GPUS`, 8).
pub fn visible_gpus(cuda_visible: Option<&str>, board: Option<&Board>, count: u32) -> Vec<u32> {
    match cuda_visible {
        Some(v) => v.split(',').filter_map(|g| g.trim().parse().ok()).collect(),
        None => match board {
            Some(b) => b.gpus().to_vec(),
            None => (0..count).collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNORDERED: &str = include_str!("../../tests/fixtures/boards/pcie-8-unordered.txt");
    const NVLINK: &str = include_str!("../../tests/fixtures/boards/nvlink-8.txt");

    fn given(tp: i64, dp: i64) -> Given {
        Given {
            tp,
            dp,
            ep: 1,
            nnodes: 1,
            gpu_id_step: 1,
            ..Given::default()
        }
    }

    #[test]
    fn gpu_counts_follow_sglang() {
        let l = Layout::resolve(&given(2, 2)).unwrap();
        assert_eq!((l.gpus(), l.dp_ranks(), l.attn_tp()), (4, 2, 2));
        assert_eq!(l.ordinals(), vec![0, 1, 2, 3]);
        let l = Layout::resolve(&Given {
            enable_dp_attention: true,
            ..given(4, 2)
        })
        .unwrap();
        assert_eq!((l.gpus(), l.dp_ranks(), l.attn_tp(), l.dp), (4, 2, 2, 1));
        let l = Layout::resolve(&Given {
            nnodes: 2,
            node_rank: 1,
            base_gpu_id: 1,
            gpu_id_step: 2,
            ..given(4, 1)
        })
        .unwrap();
        assert_eq!((l.gpus_per_node(), l.ordinals()), (2, vec![1, 3]));
        assert_eq!(
            l.local_gpus(&[4, 5, 6]),
            Err(DeviceError::InvalidOrdinal {
                ordinal: 3,
                visible: 3
            })
        );
        assert_eq!(l.local_gpus(&[4, 5, 6, 7]), Ok(vec![5, 7]));
    }

    #[test]
    fn start_up_refuses_what_sglang_refuses() {
        let err = |g: Given| Layout::resolve(&g).unwrap_err().error;
        assert_eq!(
            err(Given {
                nnodes: 2,
                ..given(3, 1)
            }),
            "AssertionError: tp_size must be divisible by number of nodes"
        );
        assert!(
            err(Given {
                nnodes: 2,
                ..given(2, 2)
            })
            .contains("multi-node data-parallel replicas are not supported")
        );
        assert_eq!(
            err(Given {
                attn_dp: Some(2),
                ..given(4, 2)
            }),
            "ValueError: --dp-size 2 with --attn-dp-size 2: data-parallel replicas combined \
             with attention data parallelism are not supported."
        );
        assert_eq!(
            err(Given {
                enable_dp_attention: true,
                ..given(3, 2)
            }),
            "AssertionError"
        );
    }

    #[test]
    fn the_slowest_link_of_each_group_prices_its_all_reduce() {
        let board = Board::parse(UNORDERED).unwrap();
        let tp2 = Layout::resolve(&given(2, 1)).unwrap();
        assert_eq!(tp2.hop(Some(&board), &[0, 2]), Hop::Link(Link::Pix));
        assert_eq!(tp2.hop(Some(&board), &[0, 1]), Hop::Link(Link::Node));
        assert_eq!(tp2.hop(Some(&board), &[0, 4]), Hop::Link(Link::Sys));
        assert_eq!(tp2.hop(None, &[0, 1]), Hop::Link(Link::Pix));
        // Two replicas: the worse group sets the pace.
        let dp2 = Layout::resolve(&given(2, 2)).unwrap();
        assert_eq!(dp2.hop(Some(&board), &[0, 2, 1, 5]), Hop::Link(Link::Sys));
        let nv = Board::parse(NVLINK).unwrap();
        assert!(matches!(
            tp2.hop(Some(&nv), &[0, 1]),
            Hop::Link(Link::Nv(_))
        ));
        let two_nodes = Layout::resolve(&Given {
            nnodes: 2,
            ..given(2, 1)
        })
        .unwrap();
        assert_eq!(two_nodes.hop(Some(&board), &[0]), Hop::Net);

        let gb = PerLink::parse(DEFAULT_GB_S).unwrap();
        let lat = PerLink::parse(DEFAULT_LATENCY_MS).unwrap();
        let cost = |hop| Parallel::new(&tp2, hop, &gb, &lat).allreduce_ms(64, 1.25);
        let ordered = [
            Hop::Link(Link::Nv(4)),
            Hop::Link(Link::Pix),
            Hop::Link(Link::Pxb),
            Hop::Link(Link::Phb),
            Hop::Link(Link::Node),
            Hop::Link(Link::Sys),
        ];
        for w in ordered.windows(2) {
            assert!(cost(w[0]) < cost(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(
            Parallel::default().allreduce_ms(64, 1.25),
            0.0,
            "one GPU all-reduces nothing"
        );
        assert!(
            PerLink::parse("NV=1")
                .unwrap_err()
                .contains("no value for PIX")
        );
        assert!(PerLink::parse("XX=1").is_err());
    }

    use crate::sim::model::{self, LoadError, Params, Settings, Strategy};

    /// A 120 GiB model: too big for one 95.59 GiB GPU.
    fn big() -> Params {
        Params {
            weights_mib: 120.0 * 1024.0,
            ..Params::default()
        }
    }

    fn on(layout: &Layout, hop: Hop) -> Settings {
        let gb = PerLink::parse(DEFAULT_GB_S).unwrap();
        let lat = PerLink::parse(DEFAULT_LATENCY_MS).unwrap();
        Settings {
            context_length: Some(8192),
            strategy: Strategy::NoBuffer,
            overlap_disabled: true,
            parallel: Parallel::new(layout, hop, &gb, &lat),
            ..Settings::default()
        }
    }

    fn tp(n: i64) -> Layout {
        Layout::resolve(&given(n, 1)).unwrap()
    }

    /// Output tok/s per GPU at saturation.
    fn per_gpu(p: &Params, layout: &Layout, hop: Hop) -> f64 {
        let plan = model::plan(p, &on(layout, hop)).unwrap();
        plan.ideal_output_tok_s() / layout.gpus() as f64
    }

    #[test]
    fn weights_split_over_tp_and_kv_heads_replicate_beyond_their_count() {
        let p = big();
        let pix = Hop::Link(Link::Pix);
        assert_eq!(
            model::plan(&p, &on(&tp(1), pix)),
            Err(LoadError::NotEnoughMemory)
        );
        let two = on(&tp(2), pix);
        let plan2 = model::plan(&p, &two).unwrap();
        assert_eq!(model::weights_per_gpu_mib(&p, &two), 60.0 * 1024.0);
        // 4 KV heads: 2 a GPU at TP2, 1 at TP4, still 1 (replicated) at TP8.
        assert_eq!(model::kv_kib_per_token_per_gpu(&p, &two), 32.0);
        assert_eq!(model::kv_kib_per_token_per_gpu(&p, &on(&tp(4), pix)), 16.0);
        assert_eq!(model::kv_kib_per_token_per_gpu(&p, &on(&tp(8), pix)), 16.0);
        // Per GPU: 0.85 × 97887 − 61440 MiB of weights, less the mamba share, at 32 KiB a token.
        let rest: f64 = 0.85 * 97887.0 - 61440.0;
        let kv = rest - rest * 0.9 / 1.9;
        assert_eq!(
            plan2.max_total_num_tokens,
            (kv * 1024.0 / 32.0).floor() as u64
        );
        // A mamba slot halves over TP2, so twice as many fit the same memory.
        assert_eq!(
            plan2.max_mamba_cache_size,
            (rest * 0.9 / 1.9 / 36.0).floor() as u64
        );
        let plan8 = model::plan(&p, &on(&tp(8), pix)).unwrap();
        assert!(plan8.max_total_num_tokens > 4 * plan2.max_total_num_tokens);
    }

    #[test]
    fn a_tp_that_does_not_divide_the_heads_is_refused_in_sglang_s_words() {
        let p = Params::default();
        let three = on(&tp(3), Hop::Link(Link::Pix));
        let err = model::plan(&p, &three).unwrap_err();
        assert_eq!(err, LoadError::HeadsNotDivisible { heads: 32, tp: 3 });
        assert_eq!(
            err.to_string(),
            "Total number of attention heads (32) must be divisible by tensor parallel size (3)."
        );
        // With attention DP the heads split over the attention-TP size only: tp 6 ÷ dp 3 = 2.
        let attn = Layout::resolve(&Given {
            attn_dp: Some(3),
            ..given(6, 1)
        })
        .unwrap();
        assert!(model::check_heads(&p, &on(&attn, Hop::Link(Link::Pix))).is_ok());
    }

    #[test]
    fn each_dp_rank_has_its_own_cap_and_pool() {
        let p = Params::default();
        let one = model::plan(&p, &on(&tp(1), Hop::Link(Link::Pix))).unwrap();
        let dp2 = Layout::resolve(&given(1, 2)).unwrap();
        let two = model::plan(&p, &on(&dp2, Hop::Link(Link::Pix))).unwrap();
        assert_eq!(two.cap, one.cap);
        assert_eq!(two.running_cap(), 2 * one.cap);
        assert_eq!(two.pool_tokens(), 2 * one.max_total_num_tokens);
        // Two replicas decode twice the batch in the time one decodes half of it.
        assert_eq!(
            two.decode_step_secs(2 * one.cap),
            one.decode_step_secs(one.cap)
        );
        let ratio = two.ideal_output_tok_s() / one.ideal_output_tok_s();
        assert!((ratio - 2.0).abs() < 0.05, "{ratio}");
    }

    #[test]
    fn layouts_rank_as_on_a_pcie_board() {
        let p = big();
        let pair = per_gpu(&p, &tp(2), Hop::Link(Link::Pix));
        let sockets = per_gpu(&p, &tp(2), Hop::Link(Link::Sys));
        let socket = per_gpu(&p, &tp(4), Hop::Link(Link::Node));
        let board = per_gpu(&p, &tp(8), Hop::Link(Link::Sys));
        let nvlink = per_gpu(&p, &tp(8), Hop::Link(Link::Nv(18)));
        eprintln!(
            "per GPU: TP2 pair {pair:.0}, TP2 across sockets {sockets:.0}, TP4 socket {socket:.0}, TP8 PCIe {board:.0}, TP8 NVLink {nvlink:.0}"
        );
        assert!(pair > 1.05 * sockets, "{pair} vs {sockets}");
        assert!(pair > socket && socket > board, "{pair} {socket} {board}");
        assert!(board < 0.7 * pair, "{board} vs {pair}");
        assert!(nvlink > board, "{nvlink} vs {board}");
    }

    #[test]
    fn visible_gpus_come_from_cuda_visible_devices_or_the_board() {
        let board = Board::parse(UNORDERED).unwrap();
        assert_eq!(visible_gpus(Some("6,4"), Some(&board), 8), vec![6, 4]);
        assert_eq!(visible_gpus(None, Some(&board), 2).len(), 8);
        assert_eq!(visible_gpus(None, None, 2), vec![0, 1]);
    }
}

//! The simulated model load, logged like SGLang's scheduler: the device, torch.distributed,
//! the weights, the memory pools and CUDA graph capture, each a phase of `--sim-startup-secs`,
//! and the fake GPU state of every GPU the rank holds as it fills. A failure prints the
//! scheduler's traceback.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::sim::config::Config;
use crate::sim::gpu_state::{GpuState, StateFiles};
use crate::sim::log;
use crate::sim::model::{self, LoadError, Plan};

/// Memory a CUDA context takes before any weights are loaded.
pub const CUDA_CONTEXT_MIB: f64 = 512.0;

pub fn gib(mib: f64) -> f64 {
    mib / 1024.0
}

/// Why the simulated load stopped early.
pub enum LoadEnd {
    Interrupted,
    Failed,
}

pub struct Loader<'a> {
    pub cfg: &'a Config,
    pub cancel: &'a CancellationToken,
    pub state: &'a StateFiles,
    pub pid: u32,
}

impl Loader<'_> {
    /// Sleeps `fraction` of the (scaled) startup time, or stops on shutdown.
    async fn phase(&self, fraction: f64) -> Result<(), LoadEnd> {
        let secs = self.cfg.startup_secs * fraction / self.cfg.time_scale;
        tokio::select! {
            _ = self.cancel.cancelled() => Err(LoadEnd::Interrupted),
            _ = tokio::time::sleep(Duration::from_secs_f64(secs)) => Ok(()),
        }
    }

    pub fn gpu(&self, used_mib: f64, utilization: u32) {
        let s = GpuState {
            gpu: 0,
            pid: self.pid,
            port: self.cfg.port,
            memory_used_mib: used_mib.round() as u64,
            memory_total_mib: self.cfg.params.gpu_total_mib.round() as u64,
            utilization_gpu: utilization,
        };
        if let Err(e) = self.state.write(&s) {
            log::server(&format!(
                "WARNING sglang-sim: cannot write the fake GPU state {}: {e}",
                self.state
                    .path()
                    .map_or_else(String::new, |p| p.display().to_string())
            ));
        }
    }

    pub fn crash_log(&self, lines: &[&str]) {
        log::tp0("Scheduler hit an exception: Traceback (most recent call last):");
        for l in lines {
            eprintln!("{l}");
        }
        log::server("Received sigquit from a child process. It usually means the child failed.");
    }

    /// The model load: weights, memory pools, CUDA graphs, each logged like SGLang.
    /// `ModelRunner.__init__` (`srt/model_executor/model_runner.py`) sets each rank's device
    /// before torch.distributed: an ordinal past CUDA_VISIBLE_DEVICES fails there, after a
    /// warning with the context.
    pub fn init_device(&self) -> Result<(), LoadEnd> {
        let Err(e) = &self.cfg.local_gpus else {
            log::tp0("Init torch distributed begin.");
            return Ok(());
        };
        let crate::sim::parallel::DeviceError::InvalidOrdinal { ordinal, .. } = e;
        let layout = &self.cfg.layout;
        let per_node = layout.tp / layout.nnodes;
        let tp_rank = layout.node_rank * per_node + ordinal % per_node.max(1);
        let visible = std::env::var("CUDA_VISIBLE_DEVICES")
            .map_or_else(|_| "None".to_string(), |v| format!("'{v}'"));
        log::tp0(&format!(
            "Context: self.device='cuda' get_device().gpu_id={ordinal} \
             os.environ.get('CUDA_VISIBLE_DEVICES')={visible} get_parallel().tp_rank={tp_rank} \
             get_parallel().tp_size={}",
            layout.tp
        ));
        self.crash_log(&[
            "  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py\", line 455, in __init__",
            "    torch.get_device_module(self.device).set_device(get_device().gpu_id)",
            &format!("torch.AcceleratorError: {e}"),
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        ]);
        Err(LoadEnd::Failed)
    }

    /// The load after torch.distributed is up (every rank has joined).
    pub async fn load(&self) -> Result<Plan, LoadEnd> {
        let p = &self.cfg.params;
        let total = p.gpu_total_mib;
        self.gpu(CUDA_CONTEXT_MIB, 0);
        self.phase(0.05).await?;
        log::tp0("Init torch distributed ends. mem usage=0.50 GB");
        log::tp0(&format!(
            "Load weight begin. avail mem={:.2} GB",
            gib(total - CUDA_CONTEXT_MIB)
        ));
        // The model is built before any weight is read: srt/models/qwen3_next.py refuses an
        // attention-TP size that does not divide the heads in `Qwen3NextAttention.__init__`.
        if let Err(e) = model::check_heads(p, &self.cfg.settings) {
            self.crash_log(&[
                "  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py\", line 1312, in load_model",
                "    loaded = load_model_with_memory_saver(",
                "  [...]",
                "  File \"/sgl-workspace/sglang/python/sglang/srt/models/qwen3_next.py\", line 624, in __init__",
                "    assert self.total_num_heads % self.attn_tp_size == 0",
                &format!("AssertionError: {e}"),
            ]);
            return Err(LoadEnd::Failed);
        }
        if self.cfg.die_after == Some(0) {
            self.phase(0.2).await?;
            self.crash_log(&[
                "  File \"/sgl-workspace/sglang/python/sglang/srt/model_loader/loader.py\", line 412, in load_weights_and_postprocess",
                "    model.load_weights(weights)",
                "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            ]);
            return Err(LoadEnd::Failed);
        }
        self.phase(0.55).await?;
        let weights = model::weights_per_gpu_mib(p, &self.cfg.settings);
        let after_weights = CUDA_CONTEXT_MIB + weights;
        self.gpu(after_weights, 0);
        log::tp0(&format!(
            "Load weight end. type=Qwen3NextForCausalLM, dtype=torch.bfloat16, avail mem={:.2} GB, mem usage={:.2} GB.",
            gib(total - after_weights),
            gib(weights)
        ));
        let plan = match model::plan(p, &self.cfg.settings) {
            // Checked above, before the weights.
            Err(LoadError::HeadsNotDivisible { .. }) => return Err(LoadEnd::Failed),
            Err(LoadError::NotEnoughMemory) => {
                self.crash_log(&[
                    "  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py\", line 1822, in init_memory_pool",
                    "    raise RuntimeError(",
                    &format!("RuntimeError: {}", LoadError::NotEnoughMemory),
                ]);
                return Err(LoadEnd::Failed);
            }
            Err(oom @ LoadError::CudaGraphOom { .. }) => {
                self.phase(0.1).await?;
                log::tp0(&format!(
                    "Capture cuda graph begin. This can take up to several minutes. avail mem={:.2} GB",
                    gib(total * (1.0 - self.cfg.settings.mem_fraction_static))
                ));
                self.phase(0.1).await?;
                self.crash_log(&[
                    "  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py\", line 471, in __init__",
                    "    self.capture()",
                    &format!(
                        "Exception: Capture cuda graph failed: {oom}\nPossible solutions:\n\
                         1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n\
                         2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n\
                         3. disable torch compile by not using --enable-torch-compile\n\
                         4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)"
                    ),
                ]);
                return Err(LoadEnd::Failed);
            }
            Ok(plan) => plan,
        };
        self.phase(0.1).await?;
        log::tp0(&format!(
            "Mamba Cache is allocated. max_mamba_cache_size: {}, conv_state size: {:.2} GB, ssm_state size: {:.2} GB",
            plan.max_mamba_cache_size,
            gib(plan.mamba_mib) * 0.02,
            gib(plan.mamba_mib) * 0.98
        ));
        log::tp0(&format!(
            "KV Cache is allocated. #tokens: {}, K size: {:.2} GB, V size: {:.2} GB",
            plan.max_total_num_tokens,
            gib(plan.kv_mib) / 2.0,
            gib(plan.kv_mib) / 2.0
        ));
        self.gpu(plan.static_mib, 0);
        let free = total - plan.static_mib;
        log::tp0(&format!("Memory pool end. avail mem={:.2} GB", gib(free)));
        log::tp0(&format!(
            "Capture cuda graph begin. This can take up to several minutes. avail mem={:.2} GB",
            gib(free)
        ));
        self.phase(0.3).await?;
        let used = plan.static_mib + model::graph_mib(p, &plan.settings);
        self.gpu(used, 0);
        log::tp0(&format!(
            "Capture cuda graph end. Time elapsed: {:.2} s. mem usage={:.2} GB. avail mem={:.2} GB.",
            self.cfg.startup_secs * 0.3,
            gib(model::graph_mib(p, &plan.settings)),
            gib(total - used)
        ));
        log::tp0(&format!(
            "max_total_num_tokens={}, chunked_prefill_size={}, max_prefill_tokens={}, \
             max_running_requests={}, context_len={}, available_gpu_mem={:.2} GB, \
             ideal_output_tok_s={:.2}",
            plan.max_total_num_tokens,
            plan.settings.chunked_prefill_size.map_or(-1, |n| n as i64),
            plan.settings.max_prefill_tokens,
            plan.cap,
            plan.context_len,
            gib(total - used),
            plan.ideal_output_tok_s() * self.cfg.time_scale
        ));
        Ok(plan)
    }
}

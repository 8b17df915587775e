//! The SGLang options the sim models: their argparse types (so `/server_info` reports numbers
//! as numbers) and help texts; every other option of the table is accepted as data.

use crate::sim::argparse::Kind;

/// Types and help texts for the options the sim models; every other option is accepted as data.
pub fn modeled(dest: &str) -> Option<(Kind, &'static str)> {
    Some(match dest {
        "model_path" => (
            Kind::Str,
            "The path of the model weights. This can be a local folder or a Hugging Face repo ID.",
        ),
        "host" => (Kind::Str, "The host of the HTTP server."),
        "port" => (Kind::Int, "The port of the HTTP server."),
        "mem_fraction_static" => (
            Kind::Float,
            "The fraction of the memory used for static allocation (model weights and KV cache \
             memory pool). Use a smaller value if you see out-of-memory errors.",
        ),
        "context_length" => (
            Kind::Int,
            "The model's maximum context length. Defaults to None (will use the value from the \
             model's config.json instead).",
        ),
        "max_running_requests" => (Kind::Int, "The maximum number of running requests."),
        "max_total_tokens" => (
            Kind::Int,
            "The maximum number of tokens in the memory pool.",
        ),
        "chunked_prefill_size" => (Kind::Int, "The maximum number of tokens in a chunk."),
        "schedule_conservativeness" => (
            Kind::Float,
            "How conservative the schedule policy is. A larger value means more conservative \
             scheduling. Use a larger value if you see requests being retracted frequently.",
        ),
        "max_prefill_tokens" => (
            Kind::Int,
            "The maximum number of tokens in a prefill batch.",
        ),
        "max_mamba_cache_size" => (Kind::Int, "The maximum size of the mamba cache."),
        "mamba_full_memory_ratio" => (
            Kind::Float,
            "The ratio of mamba state memory to full kv cache memory.",
        ),
        "mamba_radix_cache_strategy" | "mamba_scheduler_strategy" => (
            Kind::Str,
            "The strategy of the mamba radix cache / scheduler for hybrid models.",
        ),
        "served_model_name" => (
            Kind::Str,
            "Override the model name returned by the v1/models endpoint in OpenAI API server.",
        ),
        "api_key" => (
            Kind::Str,
            "Set API key of the server. It is also used in the OpenAI API compatible server.",
        ),
        "enable_metrics" => (Kind::Str, "Enable log prometheus metrics."),
        "disable_radix_cache" => (Kind::Str, "Disable RadixAttention for prefix caching."),
        "disable_overlap_schedule" => (
            Kind::Str,
            "Disable the overlap scheduler, which overlaps the CPU scheduler with GPU model worker.",
        ),
        "log_level" => (Kind::Str, "The logging level of all loggers."),
        "cuda_graph_max_bs_decode" => (
            Kind::Int,
            "Set the maximum batch size for decode cuda graph.",
        ),
        // The layout (srt/server_args.py's parallelism group; the help texts are SGLang's).
        "tp_size" => (Kind::Int, "The tensor parallelism size."),
        "dp_size" => (Kind::Int, "The data parallelism size."),
        "attn_dp_size" => (Kind::Int, "The attention data parallelism size."),
        "ep_size" => (Kind::Int, "The expert parallelism size."),
        "nnodes" => (Kind::Int, "The number of nodes."),
        "node_rank" => (Kind::Int, "The node rank."),
        "base_gpu_id" => (
            Kind::Int,
            "The base GPU ID to start allocating GPUs from. Useful when running multiple \
             instances on the same machine.",
        ),
        "gpu_id_step" => (
            Kind::Int,
            "The delta between consecutive GPU IDs that are used. For example, setting it to 2 \
             will use GPU 0,2,4,...",
        ),
        "dist_init_addr" => (
            Kind::Str,
            "The host address for initializing distributed backend (e.g., `192.168.0.2:25000`).",
        ),
        "dist_timeout" => (
            Kind::Int,
            "Set timeout for torch.distributed initialization.",
        ),
        "enable_dp_attention" => (
            Kind::Str,
            "Enabling data parallelism for attention and tensor parallelism for FFN.",
        ),
        _ => return None,
    })
}

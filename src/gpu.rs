//! GPU readings: NVML on this machine, `nvidia-smi` CSV over a transport elsewhere.

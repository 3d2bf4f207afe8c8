"""Foundations every stage reads: ModelConfig (presets, tensor specs, parameter counts),
weight formats, records (JSONL with host/git metadata, atomic writes), sampling, the
HostProfile and the queries that only read it, cache sizes as the OS reports them, paths.

Public names are re-exported lazily (tern.core.lazy): ``from tern.core import X`` imports only
the submodule defining X."""

from tern.core.lazy import lazy_exports

_EXPORTS = {
    "BandwidthPoint": "host_profile",
    "CacheLevel": "host_profile",
    "FORMATS": "formats",
    "GIB": "host_caches",
    "HostProfile": "host_profile",
    "KIB": "host_caches",
    "KernelThroughput": "host_profile",
    "MIB": "host_caches",
    "ModelConfig": "config",
    "OpCost": "host_profile",
    "PRESETS": "config",
    "TensorSpec": "config",
    "Topology": "host_caches",
    "append_jsonl": "records",
    "atomic_write_bytes": "records",
    "atomic_write_json": "records",
    "atomic_write_text": "records",
    "bandwidth_gbps": "host_queries",
    "cache_capacity_bytes": "host_queries",
    "cache_levels": "host_queries",
    "calibration": "host_queries",
    "dataclass_from_dict": "config",
    "detect_caches": "host_caches",
    "engine_llc_bytes": "host_queries",
    "get_format": "formats",
    "get_preset": "config",
    "git_commit": "records",
    "host_llc_bytes": "host_caches",
    "kernel_gops_for": "host_queries",
    "llc_capacity_bytes": "host_queries",
    "load_config": "config",
    "memory_roof": "host_queries",
    "op_cost_for": "host_profile",
    "param_counts": "config",
    "read_jsonl": "records",
    "read_topology": "host_caches",
    "repo_root": "paths",
    "results_dir": "paths",
    "run_metadata": "records",
    "sample_next": "sampling",
    "summarize": "records",
    "tensor_specs": "config",
    "with_dram_bandwidth": "host_queries",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

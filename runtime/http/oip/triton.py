"""Triton's shapes for what fnrt knows: model metadata, config and statistics.

Pure functions of a version manifest (and a scheduler's counters), so the
routes stay thin and the shapes are tested directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fnrt.functions.dtypes import OIP_DATATYPES
from fnrt.functions.manifest import TensorSpec
from fnrt.functions.version import VersionManifest
from fnrt.runtime.stats import Stats

PLATFORM = "fnrt"

_CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BF16": "TYPE_BF16",
    "BYTES": "TYPE_STRING",
}


def _tensors(specs: Mapping[str, TensorSpec]) -> list[dict[str, Any]]:
    return [
        {"name": name, "datatype": OIP_DATATYPES[spec.dtype], "shape": list(spec.shape)}
        for name, spec in specs.items()
    ]


def model_metadata(vm: VersionManifest, versions: list[str]) -> dict[str, Any]:
    """``GET /v2/models/{m}``: name, versions, platform, inputs and outputs (-1: any size)."""
    return {
        "name": vm.name,
        "versions": versions,
        "platform": PLATFORM,
        "inputs": _tensors(vm.manifest.inputs),
        "outputs": _tensors(vm.manifest.outputs),
    }


def model_config(vm: VersionManifest, device_kind: str) -> dict[str, Any]:
    """``GET /v2/models/{m}/config`` in Triton's model-configuration shape.

    ``max_batch_size`` is 0 because an fnrt request's shapes already include
    its leading rows dimension; fnrt batches requests on its own
    (``dynamic_batching`` mirrors the manifest's ``[batching]``).
    """
    manifest = vm.manifest

    def entries(specs: Mapping[str, TensorSpec]) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "data_type": _CONFIG_TYPES[OIP_DATATYPES[spec.dtype]],
                "dims": list(spec.shape),
            }
            for name, spec in specs.items()
        ]

    return {
        "name": vm.name,
        "platform": PLATFORM,
        "backend": "python",
        "version_policy": {"specific": {"versions": [vm.version]}},
        "max_batch_size": 0,
        "input": entries(manifest.inputs),
        "output": entries(manifest.outputs),
        "dynamic_batching": {
            "preferred_batch_size": [manifest.batching.max_batch_size],
            "max_queue_delay_microseconds": int(manifest.batching.max_wait_ms * 1000),
        },
        "instance_group": [
            {
                "count": manifest.scaling.max_instances,
                "kind": "KIND_GPU" if device_kind == "cuda" else "KIND_CPU",
            }
        ],
        "parameters": {"fnrt_version": {"string_value": vm.version}},
    }


def model_statistics(name: str, version: str, stats: Stats) -> dict[str, Any]:
    """One entry of ``GET /v2/models/{m}/stats``'s ``model_stats``, as Triton writes it."""
    totals = stats.totals
    return {
        "name": name,
        "version": version,
        "last_inference": int(totals.last_request_unix_s * 1000),
        "inference_count": totals.compute_infer.count + totals.cache_hit.count,
        "execution_count": stats.batches,
        "inference_stats": {
            "success": totals.success.to_triton(),
            "fail": totals.fail.to_triton(),
            "queue": totals.queue.to_triton(),
            "compute_input": totals.compute_input.to_triton(),
            "compute_infer": totals.compute_infer.to_triton(),
            "compute_output": totals.compute_output.to_triton(),
            "cache_hit": totals.cache_hit.to_triton(),
            "cache_miss": totals.cache_miss.to_triton(),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": per.compute_input.to_triton(),
                "compute_infer": per.compute_infer.to_triton(),
                "compute_output": per.compute_output.to_triton(),
            }
            for size, per in sorted(totals.by_batch_size.items())
        ],
    }

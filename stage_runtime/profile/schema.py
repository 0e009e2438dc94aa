"""The layout of ``profile.json``, and its check: a JSON Schema subset, validated without a dependency."""

from __future__ import annotations

from typing import Any

__all__ = ["PROFILE_FORMAT", "PROFILE_SCHEMA", "check_schema"]

PROFILE_FORMAT = "stallfree-profile/1"

# A JSON Schema (draft 2020-12 subset) of profile.json; check_schema validates against it without a dependency.
_NUM = {"type": "number"}
_RUN = {"type": "object", "required": ["batches", "samples", "wall_s", "samples_per_s", "wait_s", "step_s",
                                       "stall_share", "fetch_stall_share", "prep_stall_share", "verdict",
                                       "bottleneck", "stage_time_per_batch_s", "stage_utilization",
                                       "cpu_cores_used"],
        "properties": {"batches": {"type": "integer"}, "stall_share": _NUM, "verdict": {"type": "string"},
                       "wait_s": {"type": "object", "required": ["total", "mean", "p50", "p90", "p99", "max"]}}}
# runs 4, 5 and 6 also carry their input cost (input_cost)
_COSTED = {**_RUN, "required": [*_RUN["required"], "input_cost_share", "input_cost_verdict"]}
PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "data", "model", "device", "batch_size", "image_size", "cores", "phases", "stalls",
                 "what_if", "resources"],
    "properties": {
        "format": {"type": "string", "const": PROFILE_FORMAT},
        "batch_size": {"type": "integer"}, "image_size": {"type": "integer"}, "cores": {"type": "integer"},
        "phases": {"type": "object", "required": ["storage", "preparation", "compute", "real_run", "cached_run"],
                   "properties": {
                       "storage": {"type": "object", "required": ["files", "bytes", "cold_bytes_per_s",
                                                                  "warm_bytes_per_s", "cold_note",
                                                                  "cache_dropped"]},
                       "preparation": {"type": "object", "required": ["points", "in_memory_images"],
                                       "properties": {"points": {"type": "array", "items": {
                                           "type": "object", "required": ["threads", "images_per_s"]}}}},
                       "compute": {"type": "object", "required": ["step_s", "images_per_s"]},
                       "real_run": _COSTED, "cached_run": _COSTED}},
        "stalls": {"type": "object", "required": ["ideal_step_s", "cached_step_s", "real_step_s",
                                                  "fetch_stall_share", "prep_stall_share",
                                                  "measured_stall_share", "fetch_diff_share", "prep_diff_share",
                                                  "verdict", "bottleneck", "notes"]},
        "what_if": {"type": "object", "required": ["cores", "page_cache", "max_side", "echo", "observed", "top"]},
        "resources": {"type": "array", "items": {"type": "object", "required": [
            "t", "phase", "cpu_percent_per_core", "process_cores", "rss_bytes", "disk_read_bytes_per_s"]}},
        "compare": {"type": "object", "properties": {"torch": _COSTED}},
        "step_slowdown": {"type": "number"},
        "accelerator": {"type": "object"},  # with --accelerator only
    },
}
_TYPES: dict[str, type | tuple[type, ...]] = {"object": dict, "array": list, "string": str, "integer": int,
                                              "number": (int, float), "boolean": bool}


def check_schema(value: Any, schema: dict[str, Any] = PROFILE_SCHEMA, where: str = "profile.json") -> None:
    """Raise ``ValueError`` naming the first place ``value`` breaks ``schema`` (type, required, const, items)."""
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, _TYPES[kind]) or (kind in ("integer", "number")
                                                                       and isinstance(value, bool))):
        raise ValueError(f"{where}: expected {kind}, got {type(value).__name__} {value!r:.60}")
    if "const" in schema and value != schema["const"]:
        raise ValueError(f"{where}: expected {schema['const']!r}, got {value!r}")
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            raise ValueError(f"{where}: missing {missing}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                check_schema(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check_schema(item, schema["items"], f"{where}[{i}]")

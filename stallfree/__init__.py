"""stallfree: training input pipelines that never stall the step.

The public names are imported on first use, so that ``import stallfree`` (and every CLI start and worker
process) does not pay for importing torch and DALI until it needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallfree.core.cost import Cost
    from stallfree.core.resume import Resumable
    from stallfree.ingest.image_text_writer import ImageTextDocument, write_image_text_shards
    from stallfree.ingest.ray_ingest import ingest_on_ray
    from stallfree.ingest.remote import RemoteStoreError
    from stallfree.ingest.writer import IngestOptions
    from stallfree.pipeline.hf_reader import HuggingFaceReader
    from stallfree.pipeline.image_text_reader import ImageTextShardReader
    from stallfree.pipeline.loader import Loader
    from stallfree.pipeline.mix import Mix
    from stallfree.pipeline.packing import Packing
    from stallfree.pipeline.ray_workers import RayWorkers
    from stallfree.pipeline.reader_base import BaseReader
    from stallfree.pipeline.readers import DatasetReader
    from stallfree.pipeline.samples import BadSampleError
    from stallfree.pipeline.shards import ShardReader
    from stallfree.pipeline.token_readers import HuggingFaceTokenReader, TokenFileReader, TokenShardReader
    from stallfree.stage_runtime.clock import StageClock
    from stallfree.stage_runtime.config.train_config import TrainConfig
    from stallfree.stage_runtime.jobs import train
    from stallfree.stage_runtime.plan.plan import plan
    from stallfree.stage_runtime.profile.dataset import profile_dataset
    from stallfree.stage_runtime.profile.loop import profile

__all__ = [
    "BadSampleError",
    "BaseReader",
    "Cost",
    "DatasetReader",
    "HuggingFaceReader",
    "HuggingFaceTokenReader",
    "ImageTextDocument",
    "ImageTextShardReader",
    "IngestOptions",
    "Loader",
    "Mix",
    "Packing",
    "RayWorkers",
    "RemoteStoreError",
    "Resumable",
    "ShardReader",
    "StageClock",
    "TokenFileReader",
    "TokenShardReader",
    "TrainConfig",
    "ingest_on_ray",
    "plan",
    "profile",
    "profile_dataset",
    "train",
    "write_image_text_shards",
]

__version__ = "0.1.0"

_HOMES = {
    "BadSampleError": "stallfree.pipeline.samples",
    "BaseReader": "stallfree.pipeline.reader_base",
    "Cost": "stallfree.core.cost",
    "DatasetReader": "stallfree.pipeline.readers",
    "HuggingFaceReader": "stallfree.pipeline.hf_reader",
    "HuggingFaceTokenReader": "stallfree.pipeline.token_readers",
    "ImageTextDocument": "stallfree.ingest.image_text_writer",
    "ImageTextShardReader": "stallfree.pipeline.image_text_reader",
    "IngestOptions": "stallfree.ingest.writer",
    "Loader": "stallfree.pipeline.loader",
    "Mix": "stallfree.pipeline.mix",
    "Packing": "stallfree.pipeline.packing",
    "RayWorkers": "stallfree.pipeline.ray_workers",
    "RemoteStoreError": "stallfree.ingest.remote",
    "Resumable": "stallfree.core.resume",
    "ShardReader": "stallfree.pipeline.shards",
    "StageClock": "stallfree.stage_runtime.clock",
    "TokenFileReader": "stallfree.pipeline.token_readers",
    "TokenShardReader": "stallfree.pipeline.token_readers",
    "TrainConfig": "stallfree.stage_runtime.config.train_config",
    "ingest_on_ray": "stallfree.ingest.ray_ingest",
    "plan": "stallfree.stage_runtime.plan.plan",
    "profile": "stallfree.stage_runtime.profile.loop",
    "profile_dataset": "stallfree.stage_runtime.profile.dataset",
    "train": "stallfree.stage_runtime.jobs",
    "write_image_text_shards": "stallfree.ingest.image_text_writer",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'stallfree' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

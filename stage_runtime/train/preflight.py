"""What a training job's arguments show before any process starts: the device, the data, the model, the split.

Checked in the launching process, a mistake fails in one line instead of in every stage process.
"""

from __future__ import annotations

import os

from stallfree.core.device import check_device
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.zoo import build_model, resolve
from stallfree.stage_runtime.processes import torchrun_env
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.augment import training_transform
from stallfree.stage_runtime.train.token_feed import data_vocab, packing

__all__ = ["check"]


def check(config: TrainConfig) -> None:
    """Check what can be checked before any process starts: the data, the model, the split.

    Raises:
        ValueError: a device this machine lacks, a dataset path that does not exist or holds no images (a token
            source without the Loader's packing, or of unknown vocabulary without ``vocab_size``), more model
            stages than layers, a ``balance`` of the wrong length or sum, or ``resume`` from a checkpoint of another
            model, split, schedule or optimizer; each message names the argument and the fix.
    """
    env = torchrun_env()  # under torchrun, this machine's processes share its GPUs
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    check_device(config.processes.device, processes=local if env else config.pipeline.world_size)
    if env is not None and config.simulation.link_delay is not None:
        config.simulation.link_delay.check_one_machine(local, env[1])
    latest = ckpt.latest(config.ckpt_root) if config.checkpoint.resume else None
    if latest is not None:  # a checkpoint of another model, split or schedule: named here
        ckpt.check_job(config.ckpt_root, latest, config)
    if config.model.kind == "tokens":
        _check_token_data(config)
    else:
        _check_data(config)
    if config.feed.transform is not None:
        _check_transform(config)
    _check_split(config)


def _check_data(config: TrainConfig) -> None:
    """Each dataset given opens and holds an image."""
    from stallfree.pipeline.readers import open_source  # DALI is an extra: --synthetic trains without it

    for name, data in (("training data", config.feed.data), ("--eval", config.feed.eval_data)):
        if data is None:
            continue
        try:
            reader = open_source(data)
        except (OSError, ValueError) as err:
            raise ValueError(f"{name} {data}: {err}; give an ImageFolder, a CSV/Parquet file list or an "
                             "ingested shard folder") from None
        if len(reader) == 0:
            raise ValueError(f"{name} {data}: holds no images; give a dataset with at least one batch")


def _check_token_data(config: TrainConfig) -> None:
    """A token job's sources hold token sequences (packed by the Loader), and their vocabulary is known (or given)."""
    from stallfree.ingest.fields import TOKENS  # the pipeline floor's import of DALI: --synthetic trains without it
    from stallfree.pipeline.readers import open_source  # likewise

    m = config.model
    for name, data in (("training data", config.feed.data), ("--eval", config.feed.eval_data)):
        if data is None:
            continue
        reader = open_source(data)
        if not any(field.kind == TOKENS.kind for field in getattr(reader, "fields", ())):
            raise ValueError(f"{name} {data} gives images, but --model {m.name} trains on token sequences; ingest "
                             "text with `stallfree ingest SRC OUT --tokenizer tokenizer.json` (docs/sequences.md)")
        if m.vocab_size is None:
            data_vocab(data)
    if config.feed.data is not None:
        packing(config)  # a --balance-batches this build's Packing cannot do fails here, in one line


def _check_transform(config: TrainConfig) -> None:
    """Build ``--transform`` and translate it as the Loader will, so that a bad one fails before any process."""
    from stallfree.transforms.translation.translator import to_steps  # DALI is an extra: --synthetic trains without it

    transform = training_transform(config.feed.transform, config.model.image_size)
    try:
        to_steps(transform)
    except TypeError as err:
        raise ValueError(f"--transform {config.feed.transform!r}: {err}") from None


def _check_split(config: TrainConfig) -> None:
    """The model has a layer for every model stage, and ``--balance`` cuts all its layers."""
    m, p = config.model, config.pipeline
    resolve(m.name)
    layers = len(build_model(m.name, m.num_classes or m.vocab_size or 10, m.image_size, **m.factory_kwargs()))
    stages = p.model_stages
    if stages > layers:
        raise ValueError(f"--stages {p.stages} with schedule {p.schedule} makes {stages} model stages but {m.name} "
                         f"has {layers} layers; use at most {layers} stages (each needs a layer)")
    if p.balance is not None:
        text = ",".join(map(str, p.balance))
        if len(p.balance) != stages:
            raise ValueError(f"--balance {text} has {len(p.balance)} entries but the job has {stages} model stages; "
                             f"give {stages} layer counts")
        if sum(p.balance) != layers or min(p.balance) < 1:
            raise ValueError(f"--balance {text} sums to {sum(p.balance)} but {m.name} has {layers} layers; give "
                             f"{stages} counts >= 1 that sum to {layers}, or leave --balance out")

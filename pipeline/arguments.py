"""What the Loader says of DataLoader's keywords, and the small checks and descriptions its options share."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from stallfree.pipeline.reader_base import Reader
from stallfree.transforms.compile import Dtype
from stallfree.transforms.spec import Transform

__all__ = ["BUILTIN_COLUMNS", "check_dataloader_keywords", "describe_spec", "dtype_name", "is_int", "source_identity"]

#: Columns every source has (``Loader(columns=...)``): the sample's row in the source, and where it lives.
BUILTIN_COLUMNS = ("index", "path")

#: ``torch.utils.data.DataLoader`` keywords the Loader does not take, and what it does instead.
_INSTEAD = {
    "num_workers": "decoding runs on DALI's threads, not worker processes: use num_threads=N (DALI's threads, "
    "default: the cores this process may use) and io_threads=N (file reads)",
    "persistent_workers": "the Loader keeps its DALI graph and threads from one epoch to the next already; drop it",
    "prefetch_factor": "use prefetch=N (batches each stage runs ahead of the training loop)",
    "collate_fn": "batches are stacked in the DALI graph (images in dtype/layout, labels int64, columns= for "
    "extra fields); change labels with target_transform=, or the batch in your loop",
    "sampler": "the Loader's sampler owns the order (shuffle=, seed=, rank=/world_size=), which is what makes it "
    "exactly-once and resumable; for a subset, pass a Reader or Dataset of that subset",
    "batch_sampler": "batches are batch_size= consecutive samples of the Loader's own order (shuffle=, seed=)",
    "worker_init_fn": "there are no worker processes; seed= seeds every random augmentation parameter",
    "generator": "use seed= (it seeds the order and every augmentation parameter, keyed by sample)",
    "multiprocessing_context": "there are no worker processes (DALI's threads decode)",
    "timeout": "there are no worker processes to time out",
    "pin_memory_device": "pin_memory=True pins CPU batches; device='cuda' delivers them on the GPU directly",
    "in_order": "batches always come in the sampler's order",
    "transforms": "use transform= (torchvision's objects are translated) and target_transform=",
}

_TORCH_DTYPES: dict[torch.dtype, Dtype] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.uint8: "uint8",
}


def dtype_name(dtype: Any) -> Dtype:
    """``dtype`` as the spec's name: a string as it is, a ``torch.dtype`` the Loader outputs by its name."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {list(_TORCH_DTYPES)} or their names, got {dtype}")
        return _TORCH_DTYPES[dtype]
    return dtype


def check_dataloader_keywords(kwargs: dict[str, Any]) -> None:
    """Refuse every keyword the Loader does not take: DataLoader's with what to do instead, others as Python does."""
    for name in kwargs:
        if name in _INSTEAD:
            raise TypeError(f"Loader does not take DataLoader's {name}=: {_INSTEAD[name]}")
    if kwargs:
        name = next(iter(kwargs))
        raise TypeError(f"Loader() got an unexpected keyword argument {name!r}")


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), and not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def source_identity(reader: Reader) -> str:
    """What the source is, independent of where it lies: the reader's ``fingerprint()``, else its kind and labels."""
    return str(reader.fingerprint())


def describe_spec(steps: Sequence[Transform]) -> str:
    """A stable description of a spec: each step's dataclass repr (its type and every argument)."""
    parts = [repr(s) if dataclasses.is_dataclass(s) else f"{type(s).__module__}.{type(s).__qualname__}" for s in steps]
    return "[" + ", ".join(parts) + "]"

"""The Loader's argument checks and the parts of its fingerprint: each bad argument fails at construction."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from stallfree.pipeline.reader_base import Reader
from stallfree.pipeline.shards import VERIFY_MODES
from stallfree.transforms.compile import Dtype
from stallfree.transforms.spec import Transform

__all__ = [
    "BUILTIN_COLUMNS",
    "check_arguments",
    "check_dataloader_keywords",
    "describe_spec",
    "device_of",
    "dtype_name",
    "is_int",
    "loader_fingerprint",
    "remote_keywords",
    "source_identity",
]

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


def device_of(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` with its index filled in, or a ValueError saying what is accepted."""
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} but torch sees no CUDA device; use device='cpu'")
        return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    if dev.type != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}")
    return dev


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), and not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_arguments(
    *, batch_size: Any, drop_last: Any, shuffle: Any, block_shards: Any, seed: Any, prefetch: Any, io_threads: Any,
    echo: Any, num_threads: Any, echo_mode: Any, on_error: Any, placement: Any, verify: Any, max_pixels: Any,
    columns: Any, pin_memory: Any, target_transform: Any, clock: Any,
) -> None:
    """Every Loader argument that is not checked where it is used, each with the fix in its message."""
    if not is_int(batch_size) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(drop_last, (bool, np.bool_)):
        raise ValueError(f"drop_last must be True or False, got {drop_last!r}")
    if not isinstance(shuffle, (bool, np.bool_)) and shuffle not in ("global", "block"):
        raise ValueError(f"shuffle must be True (or 'global'), 'block' (the shard-block shuffle) or False, got "
                         f"{shuffle!r}")
    if not is_int(block_shards) or block_shards < 1:
        raise ValueError(f"block_shards must be an int >= 1 (shards per shuffle block), got {block_shards!r}")
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    for name, count in (("prefetch", prefetch), ("io_threads", io_threads), ("echo", echo)):
        if not is_int(count) or count < 1:
            raise ValueError(f"{name} must be an int >= 1, got {count!r}")
    if num_threads is not None and (not is_int(num_threads) or num_threads <= 0):
        raise ValueError(f"num_threads must be positive (or None for the cores this process may use), got "
                         f"{num_threads!r}")
    choices = (("echo_mode", echo_mode, ("example", "batch")), ("on_error", on_error, ("raise", "skip")),
               ("placement", placement, ("auto", "cpu", "gpu")), ("verify", verify, VERIFY_MODES))
    for name, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    if not is_int(max_pixels) or max_pixels <= 0:
        raise ValueError(f"max_pixels must be a positive int, got {max_pixels!r}")
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        example = [columns] if isinstance(columns, str) else ["key"]
        raise ValueError(f"columns must be a list of column names, e.g. columns={example!r}; got {columns!r}")
    if not isinstance(pin_memory, (bool, np.bool_)):
        raise ValueError(f"pin_memory must be True or False, got {pin_memory!r}")
    if target_transform is not None and not callable(target_transform):
        raise ValueError(f"target_transform must be a callable applied to each label, got "
                         f"{type(target_transform).__name__}")
    if clock is not None and not callable(getattr(clock, "record", None)):
        raise ValueError(f"clock must have a record(stage, state, start, end, batch) method (a StageClock has), "
                         f"got {type(clock).__name__}")


#: The Loader keywords of a remote source, and their defaults (a local source refuses any other value).
REMOTE_DEFAULTS: dict[str, Any] = {"cache_dir": None, "cache_limit": None, "storage_options": None, "downloads": None,
                                   "read_ahead": None, "retries": 5, "remote_timeout": 60.0, "remote_min_rate": 1024.0,
                                   "remote_rate_window": 30.0}


#: The remote keywords a WebDataset source at a URL takes (its tars are read by range: no shard cache to size).
_WEBDATASET_KEYWORDS = ("cache_dir", "cache_limit", "storage_options", "retries", "remote_timeout", "remote_min_rate",
                        "remote_rate_window", "downloads", "read_ahead")


def remote_keywords(options: dict[str, Any], *, source: Any, on_error: str, remote: bool,
                    webdataset: bool = False) -> dict[str, Any]:
    """The remote reader's keywords from the Loader's, checked; for a local source, a refusal of any set one.

    ``options`` holds the Loader's remote keywords (those of :data:`REMOTE_DEFAULTS`) as the user gave them.

    A WebDataset source (``webdataset``) takes ``cache_dir`` (its index cache), and when ``remote`` its store's
    options, retries and stall rules, ``downloads`` and ``read_ahead`` (for its ranges), ``cache_limit`` (the bound
    on the tars read whole, from a server that ignores Range), and the Loader's ``on_error``.
    """
    if webdataset:
        allowed: tuple[str, ...] = _WEBDATASET_KEYWORDS if remote else ("cache_dir",)
    else:
        allowed = tuple(REMOTE_DEFAULTS) if remote else ()
    refused = [name for name, default in REMOTE_DEFAULTS.items() if options[name] != default and name not in allowed]
    if refused and webdataset:
        where = "at a URL" if remote else "on local disk"
        raise ValueError(f"{', '.join(n + '=' for n in refused)} apply to an ingested dataset at a URL, not to "
                         f"WebDataset tars {where} ({source!r}), which take only "
                         f"{', '.join(n + '=' for n in allowed)}; drop them")
    if refused:
        raise ValueError(f"{', '.join(n + '=' for n in refused)} apply to a dataset at a URL (s3://, gs://, "
                         f"https://, file://), but the source is {source!r}; drop them")
    if not remote and not webdataset:
        return {}
    if options["cache_dir"] is not None and not isinstance(options["cache_dir"], (str, os.PathLike)):
        raise ValueError(f"cache_dir must be a path or None, got {options['cache_dir']!r}")
    if options["storage_options"] is not None and not isinstance(options["storage_options"], dict):
        raise ValueError(f"storage_options must be a dict of the store's options (e.g. {{'endpoint_url': ...}}), got "
                         f"{type(options['storage_options']).__name__}")
    from stallfree.ingest.remote import Retry

    retry = Retry(attempts=int(options["retries"]) if is_int(options["retries"]) else options["retries"],
                  timeout=options["remote_timeout"], min_rate=options["remote_min_rate"],
                  rate_window=options["remote_rate_window"])
    for name in ("cache_limit", "read_ahead"):
        if options[name] is not None and (not is_int(options[name]) or options[name] <= 0):
            raise ValueError(f"{name} must be a positive number of bytes or None, got {options[name]!r}")
    if options["downloads"] is not None and (not is_int(options["downloads"]) or options["downloads"] < 1):
        raise ValueError(f"downloads must be an int >= 1 (concurrent downloads) or None, got {options['downloads']!r}")
    # None: the reader's own default (8 shard downloads; 64 ranged requests for tars, each one sample or a few)
    downloads = {} if options["downloads"] is None else {"downloads": int(options["downloads"])}
    if webdataset:
        return {"cache_dir": options["cache_dir"], "storage_options": options["storage_options"], "retry": retry,
                "on_error": on_error, "read_ahead": options["read_ahead"], "cache_limit": options["cache_limit"],
                **downloads}
    return {"cache_dir": options["cache_dir"], "cache_limit": options["cache_limit"],
            "read_ahead": options["read_ahead"], "storage_options": options["storage_options"], "retry": retry,
            **downloads}


def source_identity(reader: Reader) -> str:
    """What the source is, independent of where it lies: the reader's ``fingerprint()``, else its kind and labels."""
    return str(reader.fingerprint())


def describe_spec(steps: Sequence[Transform]) -> str:
    """A stable description of a spec: each step's dataclass repr (its type and every argument)."""
    parts = [repr(s) if dataclasses.is_dataclass(s) else f"{type(s).__module__}.{type(s).__qualname__}" for s in steps]
    return "[" + ", ".join(parts) + "]"


def loader_fingerprint(loader: Any) -> dict[str, Any]:
    """What decides a Loader's order and pixels; a state whose fingerprint differs from its Loader's is refused.

    The Loader adds the world size it runs on (its rank is not in it: any rank loads any rank's state).
    """
    block = loader.shuffle_mode == "block"
    return {
        "source": source_identity(loader.reader),
        "num_rows": len(loader.reader),
        "shuffle": f"block/{loader.block_shards}" if block else loader.shuffle_mode == "global",
        "drop_last": loader.drop_last,
        "seed": loader.seed,
        "batch_size": loader.batch_size,
        "echo": loader.echo,
        "echo_mode": loader.echo_mode,
        "max_pixels": loader.max_pixels,
        "exif": loader.exif,
        "transform": describe_spec(loader.compiled.steps),
        "dtype": loader.compiled.dtype,
        "layout": loader.compiled.layout,
    }

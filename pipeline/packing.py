"""Packing: an epoch's documents cut into rows of ``seq_len`` tokens with nothing padded that need not be.

The sampler owns the documents' order: one global permutation per ``(seed, epoch)`` (:mod:`.sampler`). Packing is a
pure function of that order and the documents' lengths, computed the same on every rank with no communication
(DESIGN.md, "Sample kinds")::

    the epoch's global order    d7 d2 d9 d4 d1 d8 ...            (windows of ``window`` documents)
    best-fit decreasing         [d9 d2 ....] [d4 d1 d7 .] ...    (each document into the fullest row it fits)
    packs, in the order made    p0 p1 p2 p3 p4 p5 p6 p7 ...
    dealt to ranks (W=2)        r0: p0 p2 p4 p6 ...   r1: p1 p3 p5 p7 ...   (as the sampler deals samples)

so every document is in exactly one pack (or, split, its pieces in consecutive packs) and every pack goes to one
rank. Within a window the documents are packed by size, largest first, each into the row whose room left is the
least that holds it; a row left open may still take documents of the next window, then it is closed: a pack holds
documents from at most two neighbouring windows of the epoch's order, so the order stays random.

A document longer than ``seq_len`` (``long``): ``"split"`` (the default) cuts it into pieces of ``seq_len``, each a
pack of its own, and packs its remainder like a document; its position ids go on from piece to piece. ``"truncate"``
keeps its first ``seq_len`` tokens and counts the rest (:attr:`PackPlan.truncated`; the Loader warns). ``"error"``
refuses it by row at the first epoch's plan.

**Evening the ranks.** Every rank gets the same number of batches: the epoch's packs are dealt as the sampler
deals samples, and the last global step is filled with empty packs (all padding) so that every rank's last batch
has ``batch_size`` rows; with ``drop_last`` that last incomplete step is dropped instead (its documents are not
delivered that epoch). A pack never repeats in an epoch, so no document is delivered twice.

Because the plan does not depend on the world size, an elastic resume deals the packs not yet delivered over the
new ranks, and a mid-epoch resume finds the same packs again: the state is the cursor, nothing else.
"""

from __future__ import annotations

import bisect
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from stallfree.core.cost import Cost
from stallfree.pipeline.arguments import is_int
from stallfree.pipeline.balance import Balance, balanced_packs
from stallfree.pipeline.sampler import Order

__all__ = ["EMPTY", "PackOrder", "PackPlan", "Packing", "balanced_plan", "pack"]

#: The pack id of an empty (all padding) row.
EMPTY = -1

Long = Literal["split", "truncate", "error"]

#: Tokens an image stands for: a count, or a function of its ``(height, width)`` after the transforms.
ImageTokens = int | Callable[[int, int], int] | None


@dataclass(frozen=True)
class Packing:
    """Pack token sequences into rows of ``seq_len`` tokens (``Loader(source, batch_size, packing=Packing(...))``).

    Args:
        seq_len: tokens per row.
        window: documents of the epoch's order packed together, largest first (best-fit decreasing); a larger
            window packs tighter and mixes documents from further apart in the order.
        long: what a document longer than ``seq_len`` becomes: ``"split"``, ``"truncate"`` or ``"error"``.
        pad_id: the token id of padding.
        balance: ``None`` (plain packing), ``"tokens"`` or ``"compute"``: each global step's documents placed so
            that its ranks x micro-batches hold even tokens, or even ``cost`` (:mod:`.balance`).
        cost: what a document costs (:class:`~stallfree.core.cost.Cost`), for ``balance="compute"``.
        microbatches: micro-batches per rank's batch that the balance evens too (a pipeline's ``--microbatches``).
        image_tokens: for image-text samples, the tokens each image stands for in the row: an int, or a function of
            the image's ``(height, width)`` after the transforms (e.g. ``lambda h, w: (h // 14) * (w // 14)``),
            evaluated once on the transforms' fixed output size. Counted in ``seq_len`` (docs/sequences.md).
        image_token_id: the token id at each image's positions in ``input_ids``.
        train_on: ``"all"`` (every text token is a target) or ``"assistant"`` (only the tokens an image-text shard
            marks as the assistant's: prompts and user turns get label -100).
    """

    seq_len: int
    window: int = 1000
    long: Long = "split"
    pad_id: int = 0
    balance: Literal["tokens", "compute"] | None = None
    cost: Cost | None = None
    microbatches: int = 1
    image_tokens: ImageTokens = None
    image_token_id: int | None = None
    train_on: Literal["all", "assistant"] = "all"

    def __post_init__(self) -> None:
        if self.image_tokens is not None and not callable(self.image_tokens) and (
                not is_int(self.image_tokens) or int(self.image_tokens) < 1):
            raise ValueError(f"Packing image_tokens must be an int >= 1 or a function (height, width) -> int, got "
                             f"{self.image_tokens!r}")
        if self.image_token_id is not None and (not is_int(self.image_token_id) or self.image_token_id < 0):
            raise ValueError(f"Packing image_token_id must be a token id >= 0, got {self.image_token_id!r}")
        if (self.image_tokens is None) != (self.image_token_id is None):
            raise ValueError("Packing image_tokens and image_token_id go together: each image stands for "
                             "image_tokens positions of image_token_id; give both (or neither, for text alone)")
        if self.train_on not in ("all", "assistant"):
            raise ValueError(f"Packing train_on must be 'all' or 'assistant', got {self.train_on!r}")
        if self.balance not in (None, "tokens", "compute"):
            raise ValueError(f"Packing balance must be None, 'tokens' or 'compute', got {self.balance!r}")
        if self.cost is not None and not isinstance(self.cost, Cost):
            raise TypeError(f"Packing cost must be a stallfree.Cost(linear=..., quadratic=...), got {self.cost!r}")
        if self.balance == "compute" and self.cost is None:
            raise ValueError("Packing(balance='compute') balances a cost: give cost=stallfree.Cost(linear=..., "
                             "quadratic=...) (e.g. Cost.attention(seq_len): attention as costly as the rest at "
                             "full length), or balance='tokens'")
        if not is_int(self.microbatches) or self.microbatches < 1:
            raise ValueError(f"Packing microbatches must be an int >= 1, got {self.microbatches!r}")
        if not is_int(self.seq_len) or self.seq_len < 2:
            raise ValueError(f"Packing seq_len must be an int >= 2 (tokens per row), got {self.seq_len!r}")
        if not is_int(self.window) or self.window < 1:
            raise ValueError(f"Packing window must be an int >= 1 (documents packed together), got {self.window!r}")
        if self.long not in ("split", "truncate", "error"):
            raise ValueError(f"Packing long must be 'split', 'truncate' or 'error', got {self.long!r}")
        if not is_int(self.pad_id) or self.pad_id < 0:
            raise ValueError(f"Packing pad_id must be a token id >= 0, got {self.pad_id!r}")

    def fingerprint(self) -> dict[str, object]:
        """What decides the packs."""
        cost = None if self.cost is None else [self.cost.linear, self.cost.quadratic, self.cost.image]
        return {"seq_len": int(self.seq_len), "window": int(self.window), "long": self.long,
                "pad_id": int(self.pad_id), "balance": self.balance, "cost": cost,
                "microbatches": int(self.microbatches), **self._vision_fingerprint()}

    def _vision_fingerprint(self) -> dict[str, object]:
        """The image fields, where set (a text packing's fingerprint stays as it was)."""
        if self.image_tokens is None and self.train_on == "all":
            return {}
        tokens = self.image_tokens
        named = tokens if tokens is None or is_int(tokens) else getattr(tokens, "__qualname__", repr(tokens))
        return {"image_tokens": named, "image_token_id": self.image_token_id, "train_on": self.train_on}

    def tokens_per_image(self, size: tuple[int, int]) -> int:
        """What ``image_tokens`` gives for an image of ``size`` (height, width) after the transforms.

        Raises:
            ValueError: no ``image_tokens`` (named), or a function that gives no int >= 1.
        """
        tokens = self.image_tokens
        if tokens is None:
            raise ValueError("an image-text source needs Packing(image_tokens=N, image_token_id=ID): each image stands "
                             "for N tokens of ID in the row (docs/sequences.md, \"Image-text samples\")")
        count: object = tokens(int(size[0]), int(size[1])) if callable(tokens) else tokens
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or int(count) < 1:
            raise ValueError(f"Packing image_tokens({size[0]}, {size[1]}) gave {count!r}: expected an int >= 1")
        return int(count)

    @property
    def unit_cost(self) -> Cost:
        """What the balance evens: the cost (``"compute"``), else tokens."""
        return self.cost if self.balance == "compute" and self.cost is not None else Cost(1.0)


@dataclass(frozen=True)
class PackPlan:
    """An epoch's packs: pack ``p`` holds pieces ``starts[p]:starts[p + 1]``, in the order they lie in its row.

    A piece is ``virtual`` (the document's id in the epoch's order; its row is ``virtual % num_rows``) and its
    tokens ``begin:end``. ``truncated`` tokens of ``cut`` documents were left out by ``long="truncate"``.
    """

    starts: np.ndarray  # int64 [packs + 1]
    virtual: np.ndarray  # int64 [pieces]
    begin: np.ndarray  # int64 [pieces]
    end: np.ndarray  # int64 [pieces]
    truncated: int  # tokens left out by long="truncate"
    cut: int  # documents long="truncate" shortened
    tokens: int  # tokens packed
    balance: Balance | None = None  # what the balance planned, where it did

    def __len__(self) -> int:
        return len(self.starts) - 1


def pack(order: np.ndarray, lengths: np.ndarray, packing: Packing, rows: int) -> PackPlan:
    """The packs of documents ``order`` (virtual ids; their row's length is ``lengths[v % rows]``).

    Raises:
        ValueError: a document of length 0, or one longer than ``seq_len`` with ``long="error"`` (named by row).
    """
    seq, window = int(packing.seq_len), int(packing.window)
    bins: list[list[tuple[int, int, int]]] = []  # every bin's pieces (virtual, begin, end), by bin id
    opened: list[int] = []  # the window each bin was opened in
    room: list[tuple[int, int]] = []  # (room left, bin id) of the open bins, sorted
    closed: list[int] = []  # bins closed (full) in this window
    out: list[list[tuple[int, int, int]]] = []
    truncated = total = cut = 0
    for k, lo in enumerate(range(0, len(order), window)):
        items: list[tuple[int, int, int]] = []
        for v in order[lo : lo + window].tolist():
            n = int(lengths[v % rows])
            if n <= 0:
                raise ValueError(f"row {v % rows} is an empty document (0 tokens): it cannot be packed")
            if n > seq and packing.long == "error":
                raise ValueError(f"row {v % rows} has {n} tokens, more than seq_len={seq} (long='error'); pass "
                                 "Packing(long='split') to continue it in the next rows, or long='truncate'")
            if n > seq and packing.long == "truncate":
                truncated, cut, n = truncated + n - seq, cut + 1, seq
            whole = n // seq if n > seq else 0
            out.extend([(v, j * seq, (j + 1) * seq)] for j in range(whole))  # a long document's full pieces
            if n - whole * seq:
                items.append((v, whole * seq, n))
            total += n
        items.sort(key=lambda item: item[1] - item[2])  # largest first; sort is stable: the order breaks ties
        for v, begin, end in items:
            size = end - begin
            at = bisect.bisect_left(room, (size, -1))  # the bin with the least room that holds it
            if at < len(room):
                left, b = room.pop(at)
            else:
                left, b = seq, len(bins)
                bins.append([])
                opened.append(k)
            bins[b].append((v, begin, end))
            if left > size:
                bisect.insort(room, (left - size, b))
            else:
                closed.append(b)
        # a bin opened in an earlier window closes now; one opened in this window may take the next window's
        closed += [b for _, b in room if opened[b] < k]
        room = [(left, b) for left, b in room if opened[b] == k]
        out.extend(bins[b] for b in sorted(closed))
        closed = []
    out.extend(bins[b] for b in sorted(b for _, b in room))
    return _plan(out, truncated, cut, total)


def balanced_plan(order: np.ndarray, lengths: np.ndarray, packing: Packing, rows: int, batch_size: int,
                  world_size: int, images: np.ndarray | None = None) -> PackPlan:
    """The packs of documents ``order`` with ``packing.balance`` over ``world_size`` ranks (:mod:`.balance`).

    ``images``: each row's image count, charged ``Cost.image`` each (``None``: no images).
    """
    seq = int(packing.seq_len)
    effective = np.asarray(lengths, np.int64)
    long = effective > seq
    if long.any() and packing.long == "error":
        row = int(np.flatnonzero(long)[0])
        raise ValueError(f"row {row} has {int(effective[row])} tokens, more than seq_len={seq} (long='error'); pass "
                         "Packing(long='split') to continue it in the next rows, or long='truncate'")
    if (effective <= 0).any():
        raise ValueError(f"row {int(np.flatnonzero(effective <= 0)[0])} is an empty document (0 tokens): it cannot "
                         "be packed")
    virtual_long = long[order % rows]
    truncated = cut = 0
    if packing.long == "truncate":
        truncated, cut = int((effective[order % rows] - seq)[virtual_long].sum()), int(virtual_long.sum())
        effective = np.minimum(effective, seq)
    packs, balance = balanced_packs(order, effective, rows, seq_len=seq, batch_size=batch_size,
                                    microbatches=packing.microbatches, world_size=world_size, cost=packing.unit_cost,
                                    window=int(packing.window), group=packing.balance == "compute", images=images)
    while packs and not packs[-1]:  # the last step's empty rows: filled (or dropped) as a plain plan's are
        packs.pop()
    total = int(effective[order % rows].sum())
    return dataclasses.replace(_plan(packs, truncated, cut, total), balance=balance)


def _plan(packs: list[list[tuple[int, int, int]]], truncated: int, cut: int, total: int) -> PackPlan:
    sizes = np.fromiter((len(p) for p in packs), np.int64, len(packs))
    starts = np.zeros(len(packs) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    flat = [piece for p in packs for piece in p]
    table = np.asarray(flat, np.int64).reshape(-1, 3)
    return PackPlan(starts, table[:, 0].copy(), table[:, 1].copy(), table[:, 2].copy(), truncated, cut, total)


@dataclass(frozen=True)
class PackOrder:
    """The packs of each epoch, dealt to ranks as the sampler deals samples (see the module docstring).

    Args:
        documents: the documents' order over the whole job (rank 0 of 1: shuffle, seed, example echo), a
            :class:`~stallfree.pipeline.sampler.Sampler` or a Mix's (:class:`~stallfree.pipeline.mix.MixOrder`).
        lengths: every row's length in tokens.
        packing: how rows are packed.
        batch_size: packs per batch: the last global step is filled with empty packs to whole batches.
        rank, world_size: this process's share.
        drop_last: drop the last incomplete global step instead of filling it.
        images: every row's image count (image-text documents; ``None``: none), for a balance's ``Cost.image``.
    """

    documents: Order
    lengths: np.ndarray = field(compare=False, repr=False)
    packing: Packing
    batch_size: int
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    planned_world: int | None = None  # the world size the balance plans for (None: world_size)
    images: np.ndarray | None = field(default=None, compare=False, repr=False)
    _plans: dict[int, PackPlan] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size): rank={self.rank}, world_size={self.world_size}")
        if self.packing.balance is not None and self.batch_size % self.packing.microbatches:
            raise ValueError(f"batch_size={self.batch_size} rows do not split into Packing(microbatches="
                             f"{self.packing.microbatches}) micro-batches of equal rows; give a batch size that "
                             f"{self.packing.microbatches} divides")

    def planned_for(self, world_size: int | None) -> PackOrder:
        """This order with the packs a balance planned for ``world_size`` ranks (an elastic resume's epoch)."""
        if world_size is None or self.packing.balance is None or world_size == (self.planned_world or
                                                                                self.world_size):
            return self
        return dataclasses.replace(self, planned_world=world_size, _plans={})

    @property
    def num_rows(self) -> int:
        """Documents in the dataset."""
        return self.documents.num_rows

    def plan(self, epoch: int) -> PackPlan:
        """``epoch``'s packs (made once per epoch and kept for the latest two epochs)."""
        plan = self._plans.get(epoch)
        if plan is None:
            order = self.documents.virtual_order(epoch)
            if self.packing.balance is None:
                plan = pack(order, self.lengths, self.packing, self.num_rows)
            else:
                plan = balanced_plan(order, self.lengths, self.packing, self.num_rows, self.batch_size,
                                     self.planned_world or self.world_size, self.images)
            if plan.truncated:  # counted and said, never silent
                warnings.warn(f"Packing(long='truncate') left out {plan.truncated} tokens of {plan.cut} document(s) "
                              f"longer than seq_len={self.packing.seq_len} in epoch {epoch} (loader.sampler."
                              f"plan({epoch}).truncated); long='split' keeps them", UserWarning, stacklevel=2)
            for old in sorted(self._plans)[:-1]:
                del self._plans[old]
            self._plans[epoch] = plan
        return plan

    def total(self, epoch: int = 0) -> int:
        """``epoch``'s packs over all ranks (before the last step is filled or dropped)."""
        return len(self.plan(epoch))

    def length(self, start: int, world_size: int | None = None, epoch: int = 0) -> int:
        """Packs this rank gets of ``epoch`` split from global pack ``start`` on: whole batches on every rank."""
        ranks = self.world_size if world_size is None else world_size
        step = ranks * self.batch_size
        left = max(0, self.total(epoch) - start)
        steps = left // step if self.drop_last else -(-left // step)
        return steps * self.batch_size

    def virtual_order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's pack ids of ``epoch`` from global pack ``start`` on; :data:`EMPTY` for a filling pack."""
        positions = np.arange(self.length(start, epoch=epoch), dtype=np.int64)
        positions *= self.world_size
        positions += start + self.rank
        return np.where(positions < self.total(epoch), positions, EMPTY)

    def rows(self, virtual: np.ndarray) -> np.ndarray:
        """The dataset rows of document ids (the pieces' ``virtual``)."""
        return virtual % self.num_rows

    def fingerprint(self) -> dict[str, object]:
        """What decides the packs: the packing's settings (the documents' order is the Loader's)."""
        return {"packing": self.packing.fingerprint()}

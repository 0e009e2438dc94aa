"""``stallfree train --transform``: the training augmentation, as a torchvision-style spec or a user's factory.

Two forms::

    --transform "RandomResizedCrop(32, scale=(0.5, 1.0)), RandomHorizontalFlip(), ColorJitter(0.4), Normalize()"
    --transform mypackage.augment:train_transform      # called with no arguments

The spec is read with :mod:`ast`, never evaluated: each item is a call of a step of :mod:`stallfree.transforms`
(torchvision's names and semantics) with literal arguments; ``T.``/``transforms.`` prefixes and a
``Compose([...])`` around the list are accepted as torchvision users write them. A factory returns whatever
``Loader(transform=)`` takes: stallfree's steps, a list or ``Compose`` of them, or torchvision's own transforms
(translated with their parameters). The transform must end at the model's ``--image-size`` square. A factory
is imported as ``python -m`` would: the current folder is on the path (:mod:`.factories`).

A spec is at most :data:`MAX_SPEC` characters (a longer transform is a factory), and reading it costs time in
proportion to its length: each item's text is cut from the spec by offsets computed once. A spec nested deeper than
Python's parser goes (``- - - ... 1``) is refused as such, not with the parser's ``RecursionError``/``MemoryError``.

Without ``--transform`` the training feed uses the torch DataLoader baseline's augmentation (so that ``--feed
torch`` does the same work per image): ``RandomResizedCrop(image_size), RandomHorizontalFlip(), Normalize(ImageNet
mean and std)``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from stallfree.stage_runtime.baseline import MEAN, STD
from stallfree.stage_runtime.factories import import_factory, is_factory

__all__ = ["DEFAULT", "MAX_SPEC", "parse_spec", "training_transform"]

DEFAULT = "RandomResizedCrop(image_size), RandomHorizontalFlip(), Normalize(ImageNet mean and std)"
_EXAMPLE = "'RandomResizedCrop(32), RandomHorizontalFlip(), Normalize()'"
MAX_SPEC = 4096  # characters: ten times the longest torchvision pipeline written out; longer is a factory's job


def training_transform(spec: str | None, image_size: int) -> Any:
    """The training feed's transform for ``--transform`` (``None``: :data:`DEFAULT` at ``image_size``).

    Raises:
        ValueError: a spec that does not parse or names an unknown step, or a factory that does not import; the
            message names ``--transform`` and the item.
    """
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop  # DALI is an extra

    if spec is None:
        return [RandomResizedCrop(image_size), RandomHorizontalFlip(), Normalize(MEAN, STD)]
    if is_factory(spec):
        factory = import_factory(spec, "--transform")
        try:
            transform = factory()
        except TypeError as err:  # os:system and its kind: not a factory of no arguments
            raise ValueError(f"--transform {spec!r}: calling it with no arguments failed ({err}); give a function "
                             "that takes none and returns a transform") from None
        if transform is None:
            raise ValueError(f"--transform {spec!r} returned None; the factory must return a transform (steps, a "
                             "list or a Compose of them)")
        return transform
    return parse_spec(spec)


def _name(func: ast.expr) -> str | None:
    """``X`` of a call ``X(...)``, ``T.X(...)`` or ``transforms.v2.X(...)``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def parse_spec(text: str) -> list[Any]:
    """The steps a torchvision-style spec names, built with their arguments (see the module's text).

    Raises:
        ValueError: the text is not a list of calls, a name is not a step of :mod:`stallfree.transforms`, an
            argument is not a literal, or a step refuses its arguments; the message quotes the item.
    """
    import stallfree.transforms as steps  # DALI is an extra: --synthetic trains without it

    if len(text) > MAX_SPEC:
        raise ValueError(f"--transform is {len(text)} characters long, over the {MAX_SPEC} a spec may have; write a "
                         "longer transform as a function and give it as package.module:factory")
    text = text.strip().replace("\r\n", "\n").replace("\r", "\n")  # the parser's line breaks, for _segments
    try:
        body = ast.parse(text, mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"--transform {_shown(text)} does not parse ({err.msg}); write steps like {_EXAMPLE}, or "
                         "give package.module:factory") from None
    except (RecursionError, MemoryError):  # the parser's own limits: "- - - ... 1" thousands deep
        raise ValueError(f"--transform {_shown(text)} nests too deeply for Python's parser; write steps like "
                         f"{_EXAMPLE}") from None
    if isinstance(body, ast.Call) and _name(body.func) == "Compose" and len(body.args) == 1 and not body.keywords:
        body = body.args[0]
    items = body.elts if isinstance(body, (ast.Tuple, ast.List)) else [body]
    if not items:
        raise ValueError(f"--transform {_shown(text)} names no step; write steps like {_EXAMPLE}")
    known = sorted(n for n in steps.__all__ if isinstance(getattr(steps, n), type)
                   and issubclass(getattr(steps, n), steps.Transform) and n not in ("Transform", "KernelTransform"))
    built = []
    segment = _segments(text)
    for item in items:
        where = _shown(segment(item))
        call = item if isinstance(item, ast.Call) else ast.Call(func=item, args=[], keywords=[])  # a bare name
        name = _name(call.func)
        if name is None or name not in known:
            raise ValueError(f"--transform: {where} is not a step stallfree knows; use one of {', '.join(known)}")
        if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
            raise ValueError(f"--transform: {where}: give the arguments themselves, not *args or **kwargs")
        try:
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise ValueError(f"--transform: {where}: arguments must be literals (numbers, strings, tuples, "
                             "lists)") from None
        try:
            built.append(getattr(steps, name)(*args, **kwargs))
        except (TypeError, ValueError) as err:
            raise ValueError(f"--transform: {where}: {err}") from None
    return built


def _shown(text: str, most: int = 200) -> str:
    """``text`` quoted for a message, its middle cut out past ``most`` characters."""
    return repr(text if len(text) <= most else f"{text[:most // 2]} ... {text[-most // 2:]}")


def _segments(text: str) -> Callable[[ast.expr], str]:
    """What ``ast.get_source_segment(text, node)`` gives, at a cost in proportion to the node's text.

    ``get_source_segment`` splits the whole source into lines on every call, which over a spec's items is quadratic
    (a 48 KB spec took 20 s). The lines' offsets are found here once; the nodes' columns count UTF-8 bytes.
    """
    data = text.encode()
    starts = [0]
    starts.extend(i + 1 for i, byte in enumerate(data) if byte == 0x0A)

    def segment(node: ast.expr) -> str:
        first = starts[node.lineno - 1] + node.col_offset
        end_line, end_col = node.end_lineno or node.lineno, node.end_col_offset
        end = len(data) if end_col is None else starts[end_line - 1] + end_col
        return data[first:end].decode(errors="replace")

    return segment

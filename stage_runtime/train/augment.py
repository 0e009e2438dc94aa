"""``stallfree train --transform``: the training augmentation, as a torchvision-style spec or a user's factory.

Two forms::

    --transform "RandomResizedCrop(32, scale=(0.5, 1.0)), RandomHorizontalFlip(), ColorJitter(0.4), Normalize()"
    --transform mypackage.augment:train_transform      # called with no arguments

The spec is read with :mod:`ast`, never evaluated: each item is a call of a step of :mod:`stallfree.transforms`
(torchvision's names and semantics) with literal arguments; ``T.``/``transforms.`` prefixes and a
``Compose([...])`` around the list are accepted as torchvision users write them. A factory returns whatever
``Loader(transform=)`` takes: stallfree's steps, a list or ``Compose`` of them, or torchvision's own transforms
(translated with their parameters). The transform must end at the model's ``--image-size`` square.

Without ``--transform`` the training feed uses the torch DataLoader baseline's augmentation (so that ``--feed
torch`` does the same work per image): ``RandomResizedCrop(image_size), RandomHorizontalFlip(), Normalize(ImageNet
mean and std)``.
"""

from __future__ import annotations

import ast
from typing import Any

from stallfree.stage_runtime.train.factories import import_factory, is_factory

__all__ = ["DEFAULT", "parse_spec", "training_transform"]

DEFAULT = "RandomResizedCrop(image_size), RandomHorizontalFlip(), Normalize(ImageNet mean and std)"
_EXAMPLE = "'RandomResizedCrop(32), RandomHorizontalFlip(), Normalize()'"


def training_transform(spec: str | None, image_size: int) -> Any:
    """The training feed's transform for ``--transform`` (``None``: :data:`DEFAULT` at ``image_size``).

    Raises:
        ValueError: a spec that does not parse or names an unknown step, or a factory that does not import; the
            message names ``--transform`` and the item.
    """
    from stallfree.stage_runtime.baseline import MEAN, STD
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    if spec is None:
        return [RandomResizedCrop(image_size), RandomHorizontalFlip(), Normalize(MEAN, STD)]
    if is_factory(spec):
        return import_factory(spec, "--transform")()
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
    import stallfree.transforms as steps

    try:
        body = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"--transform {text!r} does not parse ({err.msg}); write steps like {_EXAMPLE}, or give "
                         "package.module:factory") from None
    if isinstance(body, ast.Call) and _name(body.func) == "Compose" and len(body.args) == 1 and not body.keywords:
        body = body.args[0]
    items = body.elts if isinstance(body, (ast.Tuple, ast.List)) else [body]
    if not items:
        raise ValueError(f"--transform {text!r} names no step; write steps like {_EXAMPLE}")
    known = sorted(n for n in steps.__all__ if isinstance(getattr(steps, n), type)
                   and issubclass(getattr(steps, n), steps.Transform) and n not in ("Transform", "KernelTransform"))
    built = []
    for item in items:
        where = ast.get_source_segment(text.strip(), item) or ast.unparse(item)
        call = item if isinstance(item, ast.Call) else ast.Call(func=item, args=[], keywords=[])  # a bare name
        name = _name(call.func)
        if name is None or name not in known:
            raise ValueError(f"--transform: {where!r} is not a step stallfree knows; use one of {', '.join(known)}")
        if any(k.arg is None for k in call.keywords) or any(isinstance(a, ast.Starred) for a in call.args):
            raise ValueError(f"--transform: {where!r}: give the arguments themselves, not *args or **kwargs")
        try:
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}
        except ValueError:
            raise ValueError(f"--transform: {where!r}: arguments must be literals (numbers, strings, tuples, "
                             "lists)") from None
        try:
            built.append(getattr(steps, name)(*args, **kwargs))
        except (TypeError, ValueError) as err:
            raise ValueError(f"--transform: {where!r}: {err}") from None
    return built

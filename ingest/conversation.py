r"""An image-text row as text pieces and image marks: a caption pair, or a conversation in LLaVA v1's template.

The two layouts of ``stallfree ingest --layout``:

- ``caption``: the row's images, then its text; every text token is a target.
- ``conversations``: LLaVA's ``conversations`` list (``[{"from": "human", "value": "<image>\nWhat is it?"},
  {"from": "gpt", "value": "A cat."}]``; ``role``/``content`` keys too, a content being text or a list of
  ``{"type": "text", "text": ...}`` and ``{"type": "image"}`` parts), rendered in LLaVA v1's template (Vicuna v1.1,
  LLaVA-1.5's ``conv_vicuna_v1``)::

      {system} USER: {user text} ASSISTANT: {assistant text}</s>USER: {...} ASSISTANT: {...}</s>

  ``{system}`` is a leading ``system`` turn's text, else LLaVA's ("A chat between a curious human and an artificial
  intelligence assistant. ..."). Roles: ``human``/``user``, ``gpt``/``assistant``, and ``system`` as the first turn
  only. The targets are each assistant reply and the end token (``</s>``, or a ``transformers`` tokenizer's own EOS)
  that closes it; the system text, ``USER: ...`` and ``ASSISTANT: `` are not. A tokenizer's own chat template is not
  used: one template, the one LLaVA's data and scripts use, whatever the tokenizer.

  Each placeholder (``<image>``) is cut out of the text and one image goes there, in order; a conversation with
  images and no placeholder gets them before its first turn (after the system text), as LLaVA prepends them. Any other
  count of placeholders is a bad row. A row with no image field (or a null one) is a text-only conversation, as
  LLaVA's instruction mix holds: no images, and so no placeholder.

:func:`caption_pieces` and :func:`conversation_pieces` return :class:`Piece` lists (text with its target flag, or an
image mark); a row that is neither raises :class:`RowProblem`, whose message is the bad row's reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stallfree.ingest.token_check import text_problem

__all__ = ["LLAVA_SYSTEM", "Piece", "RowProblem", "caption_pieces", "conversation_pieces"]

#: LLaVA v1's default system text (``conv_vicuna_v1``).
LLAVA_SYSTEM = ("A chat between a curious human and an artificial intelligence assistant. The assistant gives "
                "helpful, detailed, and polite answers to the human's questions.")

_USERS = ("human", "user")
_ASSISTANTS = ("gpt", "assistant")


class RowProblem(ValueError):
    """A row that is no sample of its layout, and why (the message is the bad row's reason)."""


@dataclass(frozen=True)
class Piece:
    """A piece of a rendered sample: ``text`` (a target when ``target``), or an image mark (``image``)."""

    text: str = ""
    target: bool = False
    image: bool = False


IMAGE_MARK = Piece(image=True)


def caption_pieces(text: Any, images: int, field: str) -> list[Piece]:
    """A caption pair: its ``images`` marks, then its text (``field`` names it for a message), all target."""
    problem = text_problem(text)
    if problem is not None:
        raise RowProblem(f"{field}: {problem}")
    if images == 0:
        raise RowProblem("no image: a caption pair needs one or more")
    return [IMAGE_MARK] * images + [Piece(text, target=True)]


def _turn(turn: Any, i: int, field: str, placeholder: str) -> tuple[str, str]:
    """A turn's role (``user``, ``assistant``, ``system``) and text (image parts as placeholders)."""
    if not isinstance(turn, dict):
        raise RowProblem(f"{field}[{i}] is not an object (a {type(turn).__name__})")
    role = turn.get("from", turn.get("role"))
    value = turn.get("value", turn.get("content"))
    if role in _USERS:
        role = "user"
    elif role in _ASSISTANTS:
        role = "assistant"
    elif role != "system":
        raise RowProblem(f"{field}[{i}] has role {role!r}: expected 'human'/'user', 'gpt'/'assistant' or 'system' "
                         "(under 'from' or 'role')")
    if isinstance(value, list):  # content parts: [{"type": "text", "text": ...}, {"type": "image"}]
        parts = []
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image":
                parts.append(placeholder)
            elif kind == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise RowProblem(f"{field}[{i}]'s content holds {part!r}: expected {{'type': 'text', 'text': ...}} "
                                 "or {'type': 'image'}")
        value = "".join(parts)
    problem = text_problem(value)
    if problem is not None:
        raise RowProblem(f"{field}[{i}]'s text: {problem}")
    return str(role), str(value)


def conversation_pieces(turns: Any, images: int, field: str, placeholder: str, end: str) -> list[Piece]:
    """A conversation in LLaVA v1's template (see the module), with ``images`` image marks at its placeholders.

    ``end`` is the token text closing each assistant reply (``</s>``).
    """
    if not isinstance(turns, list) or not turns:
        raise RowProblem(f"{field}: expected a non-empty list of turns, got {_shown(turns)}")
    parsed = [_turn(turn, i, field, placeholder) for i, turn in enumerate(turns)]
    system = LLAVA_SYSTEM
    if parsed[0][0] == "system":
        system = parsed.pop(0)[1]
    if any(role == "system" for role, _ in parsed):
        raise RowProblem(f"{field}: a 'system' turn after the first; only a leading one sets the system text")
    if not parsed:
        raise RowProblem(f"{field}: only a system turn, nothing said")
    if not any(role == "assistant" for role, _ in parsed):
        raise RowProblem(f"{field}: no assistant ('gpt'/'assistant') turn, nothing to learn")
    marks = sum(text.count(placeholder) for _, text in parsed) + system.count(placeholder)
    if marks != images and not (marks == 0 and images > 0):
        raise RowProblem(f"{marks} {placeholder} placeholder(s) for {images} image(s): each placeholder stands for "
                         "one image, in order")
    pieces: list[Piece] = []
    _split(pieces, system + " ", False, placeholder)
    if marks == 0:
        pieces += [IMAGE_MARK] * images  # before the first turn, as LLaVA prepends its image
    for role, text in parsed:
        if role == "user":
            _split(pieces, f"USER: {text} ", False, placeholder)
        else:
            pieces.append(Piece("ASSISTANT: "))
            _split(pieces, text + end, True, placeholder)
    return pieces


def _split(pieces: list[Piece], text: str, target: bool, placeholder: str) -> None:
    """Append ``text``'s pieces: its text around each placeholder, an image mark at each."""
    for k, part in enumerate(text.split(placeholder)):
        if k:
            pieces.append(IMAGE_MARK)
        if part:
            pieces.append(Piece(part, target))


def _shown(value: Any) -> str:
    text = f"{type(value).__name__} {value!r}"
    return text if len(text) <= 60 else text[:57] + "..."

"""Listing a WebDataset tar's members without trusting its headers: a damaged one ends the listing with a record.

Members are read by offset later, so a header is checked here against the file it is in: its data must lie inside
the file, and the listing must end at the file's end or at tar's end-of-archive block.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

__all__: list[str] = []


def members(tar: tarfile.TarFile, tar_path: Path, rejected: list[dict[str, str]]) -> Iterator[tarfile.TarInfo]:
    """``tar``'s members in order, up to the first damaged header, which is recorded and rejects the rest of the tar.

    tarfile raises ``ReadError`` after a member whose header claims more bytes than the file holds, and silently
    ends the listing at a header that does not parse. The first would abort the whole ingest, the second lose the
    rest of the tar without a word; here both end this tar's listing with a record in ``rejected``, keeping the
    members before it.
    """
    size = os.path.getsize(tar_path)
    previous, problem, where = "the start", None, tar_path.name
    while True:
        try:
            member = tar.next()
        except tarfile.ReadError as err:
            problem = f"unreadable tar header after {previous} ({err})"
            break
        if member is None:
            problem = _end_problem(tar_path, tar.offset, previous)
            break
        if not member.issparse() and member.offset_data + member.size > size:
            where = f"{tar_path.name}:{member.name}"
            problem = (f"the tar member's header claims {member.size} bytes but the tar holds "
                       f"{max(size - member.offset_data, 0)} after it (truncated or damaged tar)")
            break
        yield member
        previous = f"member {member.name!r}"
    if problem is not None:
        rejected.append({"path": where, "reason": f"{problem}; the rest of {tar_path.name} is rejected"})


def _end_problem(tar_path: Path, offset: int, previous: str) -> str | None:
    """Why the listing ended at ``offset``, or None at a true end (end of file, or tar's end-of-archive block)."""
    with open(tar_path, "rb") as f:
        f.seek(offset)
        block = f.read(tarfile.BLOCKSIZE)
    if not block.strip(tarfile.NUL):  # end of file, or end-of-archive zeros (perhaps cut short)
        return None
    return f"invalid tar header at byte {offset}, after {previous}"

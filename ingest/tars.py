"""WebDataset tars: their members listed without trusting the headers, and grouped into samples.

Members are read by offset later, so a header is checked here against the size of the tar it is in: its data must
lie inside the tar, and the listing must end at the tar's end or at tar's end-of-archive block. The same listing
and the same grouping (:func:`samples`) serve ``stallfree ingest`` and the Loader's in-place reader
(:class:`stallfree.pipeline.webdataset.WebDatasetReader`), so the two accept and refuse the same members.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

from stallfree.ingest.labels import parse_label

__all__: list[str] = []

#: The members that are a sample's image, in the order of preference when a sample has several.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
#: Compressed tars, by their first bytes: members cannot be read by offset in them.
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7z")


@dataclass(frozen=True)
class TarSample:
    """One sample of a tar: its key (``dir/stem``), its image member's data offset and size, and its label."""

    key: str
    offset: int
    size: int
    label: int


def compressed(head: bytes) -> bool:
    """Whether a tar's first bytes are gzip, bzip2 or xz magic."""
    return any(head.startswith(magic) for magic in _COMPRESSED)


def members(tar: tarfile.TarFile, tar_name: str, size: int,
            rejected: list[dict[str, str]]) -> Iterator[tarfile.TarInfo]:
    """``tar``'s members in order, up to the first damaged header, which is recorded and rejects the rest of the tar.

    ``tar`` is open in ``"r:"`` mode over a seekable file of ``size`` bytes (a local file, or an fsspec file that
    reads by range); ``tar_name`` names it in the records. tarfile raises ``ReadError`` after a member whose header
    claims more bytes than the file holds, and silently ends the listing at a header that does not parse. The first
    would abort the whole ingest, the second lose the rest of the tar without a word; here both end this tar's
    listing with a record in ``rejected``, keeping the members before it.
    """
    previous, problem, where = "the start", None, tar_name
    while True:
        try:
            member = tar.next()
        except tarfile.ReadError as err:
            problem = f"unreadable tar header after {previous} ({err})"
            break
        if member is None:
            problem = _end_problem(tar, previous)
            break
        if not member.issparse() and member.offset_data + member.size > size:
            where = f"{tar_name}:{member.name}"
            problem = (f"the tar member's header claims {member.size} bytes but the tar holds "
                       f"{max(size - member.offset_data, 0)} after it (truncated or damaged tar)")
            break
        yield member
        previous = f"member {member.name!r}"
    if problem is not None:
        rejected.append({"path": where, "reason": f"{problem}; the rest of {tar_name} is rejected"})


def _end_problem(tar: tarfile.TarFile, previous: str) -> str | None:
    """Why the listing ended at ``tar.offset``, or None at a true end (end of file, or the end-of-archive block)."""
    fileobj = tar.fileobj
    if fileobj is None:
        raise ValueError("the tar was closed while its members were listed")
    fileobj.seek(tar.offset)
    block = fileobj.read(tarfile.BLOCKSIZE)
    if not block.strip(tarfile.NUL):  # end of file, or end-of-archive zeros (perhaps cut short)
        return None
    return f"invalid tar header at byte {tar.offset}, after {previous}"


def samples(tar_name: str, listed: Iterable[tarfile.TarInfo], read_label: Callable[[tarfile.TarInfo], bytes],
            rejected: list[dict[str, str]], max_sample_bytes: int | None = None) -> list[TarSample]:
    """The samples of one tar's members ``listed`` (in order), each refusal recorded in ``rejected``.

    Members group by ``dir/stem`` (the name up to its first dot); a sample is its image (.jpg/.jpeg/.png/.webp)
    and its ``.cls`` (a class number by :func:`~stallfree.ingest.labels.parse_label`, read by ``read_label`` from the
    ``.cls`` member: its first bytes are enough). A member name found twice (``a.jpg`` ... ``a.jpg``) refuses its
    whole sample: either copy may be the one meant. Absolute names, ``..``, links and GNU sparse members are refused
    by name; other non-files are passed over. ``max_sample_bytes`` refuses an image whose header claims more, before
    any of it is read.
    """
    parts: dict[str, dict[str, tarfile.TarInfo]] = {}  # key -> extension -> member, keys in first-seen order
    repeated: dict[str, str] = {}  # key -> the first member name found twice: the whole sample is refused
    for member in listed:
        name = member.name
        where = f"{tar_name}:{name}"
        if name.startswith("/") or os.path.isabs(name):
            rejected.append({"path": where, "reason": "absolute path in tar"})
        elif ".." in PurePosixPath(name).parts:
            rejected.append({"path": where, "reason": "tar member escapes the root ('..')"})
        elif member.issym() or member.islnk():
            rejected.append({"path": where, "reason": "link in tar (links are not followed)"})
        elif member.issparse():  # its bytes in the tar are not the file's: they need the sparse map
            rejected.append({"path": where, "reason": "sparse tar member (GNU sparse is not read)"})
        elif member.isfile():
            directory, base = os.path.split(name)
            stem, _, ext = base.partition(".")
            sample = parts.setdefault(os.path.join(directory, stem), {})
            if ext.lower() in sample:  # a second image or label: keeping either would be a silent choice
                repeated.setdefault(os.path.join(directory, stem), name)
            sample[ext.lower()] = member
    found: list[TarSample] = []
    for key, sample in parts.items():
        image = next((sample[e] for e in IMAGE_EXTENSIONS if e in sample), None)
        where = f"{tar_name}:{key}"
        if key in repeated:
            rejected.append({"path": where, "reason": f"duplicate member {repeated[key]!r} in the tar: which one is "
                             "the sample is ambiguous, so the whole sample is rejected"})
            continue
        if image is None or "cls" not in sample:
            rejected.append({"path": where, "reason": "sample lacks an image (.jpg/.png) or a .cls"})
            continue
        if max_sample_bytes is not None and image.size > max_sample_bytes:  # named by member, not sample
            rejected.append({"path": f"{tar_name}:{image.name}", "reason": too_large(image.size, max_sample_bytes)})
            continue
        try:
            label = parse_label(read_label(sample["cls"]))
        except ValueError as bad:
            rejected.append({"path": where, "reason": str(bad)})
            continue
        found.append(TarSample(key, image.offset_data, image.size, label))
    return found


def label_bytes(tar: tarfile.TarFile) -> Callable[[tarfile.TarInfo], bytes]:
    """:func:`samples`' ``read_label`` for a tar open in ``"r:"`` mode: a ``.cls`` member's first 64 bytes."""
    def read(member: tarfile.TarInfo) -> bytes:
        handle = tar.extractfile(member)
        return handle.read(64) if handle is not None else b""
    return read


def too_large(size: int, limit: int) -> str:
    """Why a sample of ``size`` bytes is refused under ``--max-sample-bytes limit``."""
    return f"{size} bytes, over the {limit}-byte limit (--max-sample-bytes); not read"

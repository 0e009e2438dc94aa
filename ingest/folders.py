"""The one image-folder scanner and the one path-containment rule, for ingest and the Loader alike.

An image folder is torchvision's ``ImageFolder`` layout, ``root/<class>/.../<file>``: the classes are the sorted
sub-folder names, and the files come in torchvision's order (``sorted(os.walk(...))``, then sorted names). Links
are followed as torchvision follows them (two links to one folder list its files twice), but only inside the
root, and never into a folder that contains the link (which would loop forever); what is refused is reported
with its reason, never silently dropped.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["IMAGE_EXTENSIONS", "FolderScan", "image_folder_classes", "inside_root", "outside_root",
           "scan_image_folder"]

#: File name endings an image folder's files are taken by (case-insensitive), as torchvision's IMG_EXTENSIONS.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def inside_root(root: Path, candidates: Sequence[str]) -> list[tuple[Path | None, str | None]]:
    """Each candidate as ``(root/candidate, None)`` if it stays inside ``root``, else ``(None, reason)``.

    The one path-containment rule, for ingest's sources and the Loader's folders and file lists alike: a path must
    be relative, have no ``..`` part, and not lead out of ``root`` through a link (to a file or to a folder). A
    whole list is checked in one call so that each distinct folder is resolved once and each file costs one
    ``lstat``; ``os.path.realpath`` on every path costs about 25 us each (half a minute for 1.28M files).
    """
    return [(None, problem) if problem is not None else (root / candidate, None)
            for candidate, problem in zip(candidates, outside_root(root, candidates), strict=True)]


def outside_root(root: Path, candidates: Sequence[str]) -> list[str | None]:
    """:func:`inside_root`'s verdicts alone: the reason each candidate may not be read, ``None`` where it may.

    In strings, not paths: the folder scan checks every file of a dataset, and building a ``Path`` per file (and
    parsing it for ``..``) was most of the scan's 20 us a file; a file list's rows are checked with it too.
    """
    root_text = os.fspath(root)
    real_root = os.path.realpath(root_text)
    prefix = real_root.rstrip(os.sep) + os.sep
    real_dirs: dict[str, str] = {}
    out: list[str | None] = []
    for candidate in candidates:
        if not candidate:
            out.append("empty path")
            continue
        if "\0" in candidate:  # no file system takes one; os.stat would raise "embedded null byte", naming no row
            out.append("the path holds a NUL byte")
            continue
        if os.path.isabs(candidate) or candidate.startswith(("/", "\\")):
            out.append("absolute path (paths must be relative to the source root)")
            continue
        parts = candidate.replace(os.altsep, os.sep).split(os.sep) if os.altsep else candidate.split(os.sep)
        if ".." in parts:  # as Path(candidate).parts has it
            out.append("path escapes the source root ('..')")
            continue
        # normpath of a relative path without '..' is what Path(root) / candidate gives after the root
        head, tail = os.path.split(os.path.join(root_text, os.path.normpath(candidate)))
        if head not in real_dirs:
            real_dirs[head] = os.path.realpath(head)
        real = os.path.join(real_dirs[head], tail)
        if os.path.islink(real):
            real = os.path.realpath(real)
        if real != real_root and not real.startswith(prefix):
            out.append("path escapes the source root through a link")
            continue
        out.append(None)
    return out


@dataclass
class FolderScan:
    """An image folder's scan.

    ``classes`` index = label; ``files`` are ``(path relative to root, label)`` in order; ``refused`` are
    ``{"path", "reason"}`` records of what may not be read.
    """

    classes: list[str]
    files: list[tuple[str, int]] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)


def _walk_class(root: Path, name: str, scan: FolderScan) -> list[tuple[str, list[str]]]:
    """``(folder, sorted image names)`` for every folder under ``root/name`` that may be read."""
    walked = []
    for dirpath, dirs, files in os.walk(root / name, followlinks=True):
        # Checked before the walk descends, so that a link to / is refused, not walked.
        here = os.path.realpath(dirpath)
        keys = [os.path.relpath(os.path.join(dirpath, d), root) for d in dirs]
        for d, key, (_, problem) in zip(list(dirs), keys, inside_root(root, keys), strict=True):
            real = os.path.realpath(os.path.join(dirpath, d))
            if problem is None and (here == real or here.startswith(real.rstrip(os.sep) + os.sep)):
                problem = "folder link loops (it leads to a folder that contains it)"
            if problem is not None:
                dirs.remove(d)
                scan.refused.append({"path": key, "reason": problem})
        walked.append((dirpath, sorted(f for f in files if f.lower().endswith(IMAGE_EXTENSIONS))))
    return sorted(walked)  # torchvision's ImageFolder order


def image_folder_classes(root: str | os.PathLike[str]) -> list[str]:
    """The class names of the image folder ``root``: its sub-folders' names, sorted (a label is an index here).

    Raises:
        NotADirectoryError: ``root`` is not a folder.
        ValueError: it has no sub-folders.
    """
    if not os.path.isdir(root):
        raise NotADirectoryError(f"image folder {root} does not exist or is not a directory")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise ValueError(f"image folder {root} has no class sub-folders (expected root/<class>/<image>)")
    return classes


def scan_image_folder(root: str | os.PathLike[str], labels: range | None = None) -> FolderScan:
    """Scan ``root`` as an ImageFolder (see the module docstring).

    ``labels`` scans the folders of those classes only (``classes`` still names them all): an ingest split into
    parts lists only its own classes' files.

    Raises:
        NotADirectoryError: ``root`` is not a folder.
        ValueError: it has no class sub-folders, or they hold no image files (and nothing was refused; not raised
            when ``labels`` scans only some of them).
    """
    root = Path(root)
    classes = image_folder_classes(root)
    scan = FolderScan(classes)
    for label in range(len(classes)) if labels is None else labels:
        name = classes[label]
        for dirpath, images in _walk_class(root, name, scan):
            folder = os.path.relpath(dirpath, root)  # once a folder: relpath costs more than the rest of a file's check
            keys = [os.path.join(folder, file) for file in images]
            for key, problem in zip(keys, outside_root(root, keys), strict=True):
                if problem is not None:
                    scan.refused.append({"path": key, "reason": problem})
                else:
                    scan.files.append((key, label))
    if labels is None and not scan.files and not scan.refused:
        raise ValueError(f"image folder {root} has class folders {classes[:5]} but no images {IMAGE_EXTENSIONS}")
    return scan

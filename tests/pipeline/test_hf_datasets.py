"""Hugging Face ``datasets`` as a Loader source: ``Loader(ds)`` reads the encoded images from Arrow, with the labels
and class names of its ClassLabel, and delivers what the same images as files deliver."""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from stallfree import HuggingFaceReader, Loader
from stallfree.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(8, scale=(0.4, 1.0)), RandomHorizontalFlip()]
CLASSES = ["cat", "dog", "eel"]


def _pngs(count: int) -> list[bytes]:
    rng = np.random.default_rng(3)
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (12, 14, 3), dtype=np.uint8)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], list[int]]:
    """Ten PNGs written as files, with their labels, and the same as a CSV file list."""
    root = tmp_path_factory.mktemp("hf")
    paths, labels = [], [i % 3 for i in range(10)]
    for i, data in enumerate(_pngs(10)):
        paths.append(root / f"{i}.png")
        paths[-1].write_bytes(data)
    listing = root / "list.csv"
    listing.write_text("path,label\n" + "".join(f"{p.name},{CLASSES[y]}\n" for p, y in zip(paths, labels, strict=True)))
    return listing, paths, labels


def _features() -> datasets.Features:
    return datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})


def _batches(loader: Loader) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(images.numpy(), labels.numpy()) for images, labels in loader]


def test_a_dataset_of_image_bytes_delivers_what_the_files_deliver(pictures: tuple[Path, list[Path], list[int]]) -> None:
    listing, paths, labels = pictures
    ds = datasets.Dataset.from_dict({"img": [{"bytes": p.read_bytes(), "path": None} for p in paths],
                                     "label": labels}, features=_features())
    from_hf = Loader(ds, batch_size=4, transform=SPEC, seed=3, dtype="uint8", num_threads=1)
    from_files = Loader(listing, batch_size=4, transform=SPEC, seed=3, dtype="uint8", num_threads=1)
    assert from_hf.classes == CLASSES and from_hf.labels.tolist() == labels
    for (a, la), (b, lb) in zip(_batches(from_hf), _batches(from_files), strict=True):
        assert np.array_equal(a, b) and np.array_equal(la, lb)


def test_rows_without_bytes_are_read_from_their_path(pictures: tuple[Path, list[Path], list[int]]) -> None:
    _, paths, labels = pictures
    ds = datasets.Dataset.from_dict({"img": [str(p) for p in paths], "label": labels}, features=_features())
    reader = HuggingFaceReader(ds)
    assert bytes(reader.read_image(4)) == paths[4].read_bytes()
    loader = Loader(ds, batch_size=5, transform=[CenterCrop(8)], shuffle=False, num_threads=1)
    assert [labels.tolist() for _, labels in loader] == [labels[:5], labels[5:]]


def test_a_shuffled_or_selected_dataset_keeps_its_own_row_order(pictures: tuple[Path, list[Path], list[int]]) -> None:
    _, paths, labels = pictures
    ds = datasets.Dataset.from_dict({"img": [p.read_bytes() for p in paths], "label": labels}, features=_features())
    picked = ds.shuffle(seed=4).select(range(6))
    reader = HuggingFaceReader(picked)
    assert reader.labels().tolist() == picked["label"]
    assert [bytes(reader.read_image(i)) for i in range(6)] == [row["bytes"] for row in picked.cast_column(
        "img", datasets.Image(decode=False))["img"]]


def test_columns_by_name_and_the_errors_that_name_them(pictures: tuple[Path, list[Path], list[int]]) -> None:
    _, paths, labels = pictures
    data = [p.read_bytes() for p in paths]
    two = datasets.Dataset.from_dict(
        {"a": data, "b": data, "y": labels},
        features=datasets.Features({"a": datasets.Image(), "b": datasets.Image(), "y": datasets.Value("int64")}))
    with pytest.raises(ValueError, match=r"several Image columns \['a', 'b'\]: name the one to use.*image="):
        Loader(two, batch_size=2, transform=[CenterCrop(8)])
    with pytest.raises(ValueError, match=r"no ClassLabel column"):
        HuggingFaceReader(two, image="b")
    reader = HuggingFaceReader(two, image="b", label="y")
    assert reader.classes == ["0", "1", "2"] and bytes(reader.read_image(2)) == data[2]
    with pytest.raises(ValueError, match=r"label='z' is not a column"):
        HuggingFaceReader(two, image="b", label="z")
    with pytest.raises(TypeError, match="has no random access"):
        Loader(two.to_iterable_dataset(), batch_size=2, transform=[CenterCrop(8)])


def test_a_loader_over_a_dataset_resumes_bit_exact(pictures: tuple[Path, list[Path], list[int]]) -> None:
    _, paths, labels = pictures
    ds = datasets.Dataset.from_dict({"img": [p.read_bytes() for p in paths], "label": labels}, features=_features())
    loader = Loader(ds, batch_size=3, transform=SPEC, seed=9, dtype="uint8", num_threads=1)
    whole = _batches(loader)
    again = Loader(ds, batch_size=3, transform=SPEC, seed=9, dtype="uint8", num_threads=1)
    it = iter(again)
    next(it)
    state = again.state_dict()
    resumed = Loader(ds, batch_size=3, transform=SPEC, seed=9, dtype="uint8", num_threads=1)
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    assert len(rest) == len(whole) - 1
    for (a, la), (b, lb) in zip(rest, whole[1:], strict=True):
        assert np.array_equal(a, b) and np.array_equal(la, lb)


def test_a_string_label_column_holds_class_names_numbered_in_sorted_order(
        pictures: tuple[Path, list[Path], list[int]]) -> None:
    listing, paths, labels = pictures
    data = [p.read_bytes() for p in paths]
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("string")})
    ds = datasets.Dataset.from_dict({"img": data, "label": [CLASSES[y] for y in labels]}, features=features)
    # was: "labels must be class names or whole numbers, got object"
    from_hf = Loader(ds, batch_size=4, transform=SPEC, seed=3, dtype="uint8", num_threads=1)
    from_files = Loader(listing, batch_size=4, transform=SPEC, seed=3, dtype="uint8", num_threads=1)
    assert from_hf.classes == CLASSES and from_hf.labels.tolist() == labels
    for (a, la), (b, lb) in zip(_batches(from_hf), _batches(from_files), strict=True):
        assert np.array_equal(a, b) and np.array_equal(la, lb)
    unsorted = datasets.Dataset.from_dict({"img": data[:3], "label": ["cow", "ant", "bee"]}, features=features)
    reader = HuggingFaceReader(unsorted)
    assert reader.classes == ["ant", "bee", "cow"] and reader.labels().tolist() == [2, 0, 1]  # as ImageFolder sorts


def test_an_unlabeled_split_loads_with_label_minus_one_and_a_warning(
        pictures: tuple[Path, list[Path], list[int]]) -> None:
    _, paths, labels = pictures
    data = [{"bytes": p.read_bytes(), "path": None} for p in paths]
    labelled = datasets.Dataset.from_dict({"img": data, "label": labels}, features=_features())
    test_split = datasets.Dataset.from_dict({"img": data, "label": [-1] * 10}, features=_features())
    # was: "row 0: negative label -1"
    with pytest.warns(UserWarning, match=r"ClassLabel column 'label' is -1, datasets' 'no label', in every row .*"
                                         r"their label in each batch is -1"):
        loader = Loader(test_split, batch_size=4, transform=SPEC, seed=3, dtype="uint8", num_threads=1)
    assert loader.classes == CLASSES
    reference = Loader(labelled, batch_size=4, transform=SPEC, seed=3, dtype="uint8", num_threads=1)
    for (a, la), (b, _) in zip(_batches(loader), _batches(reference), strict=True):
        assert np.array_equal(a, b) and la.tolist() == [-1] * len(la)
    some = datasets.Dataset.from_dict({"img": data, "label": [-1, *labels[1:]]}, features=_features())
    with pytest.warns(UserWarning, match=r"is -1, datasets' 'no label', in 1 of 10 rows"):
        assert HuggingFaceReader(some).labels().tolist() == [-1, *labels[1:]]
    with pytest.raises(ValueError, match=r"column 'n' row 2: negative label -1"):  # only a ClassLabel's -1 is "none"
        HuggingFaceReader(labelled.add_column("n", [0, 1, -1, *labels[3:]]), label="n")


def test_a_dataset_dict_is_refused_naming_its_splits(pictures: tuple[Path, list[Path], list[int]]) -> None:
    _, paths, labels = pictures
    ds = datasets.Dataset.from_dict({"img": [p.read_bytes() for p in paths], "label": labels}, features=_features())
    splits = datasets.DatasetDict({"train": ds, "test": ds})
    # was: "dataset DatasetDict has no `targets`"
    with pytest.raises(TypeError, match=r"a datasets.DatasetDict holds the splits \['train', 'test'\], not one "
                                        r"dataset: pass the split to load, as in Loader\(ds\['train'\], \.\.\.\)"):
        Loader(splits, batch_size=2, transform=[CenterCrop(8)])
    assert Loader(splits["test"], batch_size=2, transform=[CenterCrop(8)]).labels.tolist() == labels


@pytest.mark.parametrize("how", ["with_transform", "set_transform"])
def test_a_python_transform_on_the_dataset_is_refused_by_name(pictures: tuple[Path, list[Path], list[int]],
                                                             how: str) -> None:
    _, paths, labels = pictures
    ds = datasets.Dataset.from_dict({"img": [p.read_bytes() for p in paths], "label": labels}, features=_features())

    def augment(batch: dict[str, list[object]]) -> dict[str, list[object]]:
        return batch

    if how == "with_transform":
        transformed = ds.with_transform(augment)
    else:
        transformed = ds.with_format(None)  # a copy, then changed in place
        transformed.set_transform(augment)
    # was: the transform silently dropped, the images read as stored
    with pytest.raises(TypeError, match=r"has a transform .*augment \(ds.with_transform / ds.set_transform\), which "
                                        r"the Loader would not run.*Loader\(ds, transform=\.\.\.\).*ds.reset_format"):
        Loader(transformed, batch_size=2, transform=[CenterCrop(8)])
    transformed.reset_format()
    assert len(Loader(transformed, batch_size=2, transform=[CenterCrop(8)])) == 5


def test_a_subset_of_a_dataset_reads_its_rows(pictures: tuple[Path, list[Path], list[int]]) -> None:
    from torch.utils.data import Subset

    _, paths, labels = pictures
    ds = datasets.Dataset.from_dict({"img": [p.read_bytes() for p in paths], "label": labels}, features=_features())
    loader = Loader(Subset(ds, [7, 2, 4]), batch_size=3, transform=[CenterCrop(8)], columns=["path"], shuffle=False)
    (_, got, extra), = list(loader)
    assert got.tolist() == [labels[7], labels[2], labels[4]] and extra["path"][0].endswith("[7]")

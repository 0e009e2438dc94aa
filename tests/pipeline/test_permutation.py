"""The keyed permutation the sampler evaluates per rank: a bijection, keyed by seed and epoch, pointwise."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.pipeline.permutation import Permutation


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**64 - 1), st.integers(0, 1000))
def test_a_bijection_of_range_n(n: int, seed: int, epoch: int) -> None:
    values = Permutation(n, seed, epoch)(np.arange(n))
    assert values.dtype == np.int64
    assert np.array_equal(np.sort(values), np.arange(n))


@pytest.mark.parametrize("n", [2, 3, 64, 65, 1 << 17, (1 << 17) + 1])
def test_each_position_alone_gives_what_the_whole_gives(n: int) -> None:
    perm = Permutation(n, 7, 3)
    whole = perm(np.arange(n))
    picked = np.array([0, n - 1, n // 2, n // 3])
    assert np.array_equal(perm(picked), whole[picked])
    assert np.array_equal(perm(np.arange(1, n, 5)), whole[1::5])


def test_keyed_by_seed_and_epoch() -> None:
    base = Permutation(1000, 1, 0)(np.arange(1000))
    assert np.array_equal(base, Permutation(1000, 1, 0)(np.arange(1000)))
    assert not np.array_equal(base, Permutation(1000, 1, 1)(np.arange(1000)))
    assert not np.array_equal(base, Permutation(1000, 2, 0)(np.arange(1000)))
    assert not np.array_equal(base, np.arange(1000)), "it shuffles"


@pytest.mark.parametrize(("n", "positions", "match"), [(0, [0], "n >= 1"), (5, [5], r"range\(5\)"), (5, [-1], "range")])
def test_out_of_range_is_refused(n: int, positions: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Permutation(n, 0, 0)(np.array(positions))

import numpy as np
import pytest

from stallfree import Cost


def test_a_document_costs_its_tokens_their_square_and_its_images() -> None:
    cost = Cost(linear=2.0, quadratic=0.5, image=10.0)
    assert cost.document(4, images=1) == 2 * 4 + 0.5 * 16 + 10
    assert cost.lengths([4, 2]) == 2 * 6 + 0.5 * 20
    assert Cost.attention(100).document(100) == 200.0  # attention as costly as the linear part at its span


def test_a_fit_finds_the_coefficients_of_measured_times_and_never_a_negative_one() -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(10, 800, 6).tolist() for _ in range(30)]
    truth = Cost(linear=3e-6, quadratic=2e-9)
    fitted = Cost.fit(docs, [truth.lengths(d) for d in docs])
    assert fitted.linear == pytest.approx(3e-6, rel=1e-6) and fitted.quadratic == pytest.approx(2e-9, rel=1e-6)
    linear_only = Cost.fit(docs, [1e-6 * sum(d) - 1e-12 * sum(x * x for x in d) for d in docs])
    assert linear_only.quadratic == 0.0 and linear_only.linear > 0, "a negative term is fitted as 0"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"linear": -1.0}, "Cost linear must be a finite number >= 0"),
    ({"quadratic": float("inf")}, "Cost quadratic must be a finite number >= 0"),
    ({"linear": 0.0}, "Cost needs a coefficient above 0"),
])
def test_bad_coefficients_are_refused_by_name(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Cost(**kwargs)


def test_a_fit_without_enough_measurements_says_so() -> None:
    with pytest.raises(ValueError, match="Cost.fit needs at least 2 measurements"):
        Cost.fit([[3, 4]], [1.0])

"""PFSP weights against values worked out by hand from the formulas."""

from __future__ import annotations

import numpy as np
import pytest

from zrl.league.pfsp import pfsp_weights

WIN_RATES = np.array([0.0, 0.25, 0.5, 1.0])


@pytest.mark.parametrize(
    ("weighting", "expected"),
    [
        # (1-p)^2 = 1, 9/16, 4/16, 0; sum 29/16
        ("squared", [16 / 29, 9 / 29, 4 / 29, 0.0]),
        # p(1-p) = 0, 3/16, 4/16, 0; sum 7/16
        ("variance", [0.0, 3 / 7, 4 / 7, 0.0]),
        # 1-p = 1, 3/4, 1/2, 0; sum 9/4
        ("linear", [4 / 9, 3 / 9, 2 / 9, 0.0]),
        ("uniform", [0.25, 0.25, 0.25, 0.25]),
    ],
)
def test_weightings_match_the_formulas(weighting: str, expected: list[float]) -> None:
    probs = pfsp_weights(WIN_RATES, weighting)
    np.testing.assert_allclose(probs, expected, rtol=1e-12, atol=0)
    assert probs.sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("weighting", "win_rates"),
    [("squared", [1.0, 1.0, 1.0]), ("variance", [0.0, 1.0]), ("linear", [1.0, 1.0])],
)
def test_all_zero_weights_give_uniform(weighting: str, win_rates: list[float]) -> None:
    probs = pfsp_weights(np.array(win_rates), weighting)
    np.testing.assert_allclose(probs, np.full(len(win_rates), 1 / len(win_rates)))


def test_unknown_weighting_is_named() -> None:
    with pytest.raises(ValueError, match="cubic"):
        pfsp_weights(np.array([0.5]), "cubic")


@pytest.mark.parametrize("win_rates", [[], [0.5, 1.5], [-0.1], [np.nan]])
def test_bad_win_rates_are_refused(win_rates: list[float]) -> None:
    with pytest.raises(ValueError):
        pfsp_weights(np.array(win_rates), "squared")

"""tern.core.sampling.sample_next: greedy, seeds, top-k, top-p, repetition penalty, validation."""

import warnings

import numpy as np
import pytest

from tern.core.sampling import sample_next

LOGITS = np.log(np.array([0.05, 0.5, 0.3, 0.1, 0.05], dtype=np.float32))


def draws(n=400, seed=0, **kw):
    rng = np.random.default_rng(seed)
    return [sample_next(LOGITS, rng, **kw) for _ in range(n)]


def test_greedy_is_argmax_with_lowest_index_on_ties():
    rng = np.random.default_rng(0)
    assert sample_next(LOGITS, rng, temperature=0) == 1
    assert sample_next(np.array([1.0, 3.0, 3.0], np.float32), rng, temperature=0) == 1


def test_same_seed_same_tokens_and_distribution_follows_probs():
    a, b = draws(seed=3), draws(seed=3)
    assert a == b
    assert draws(seed=4) != a
    freq = np.bincount(draws(n=4000, seed=1), minlength=5) / 4000
    np.testing.assert_allclose(freq, [0.05, 0.5, 0.3, 0.1, 0.05], atol=0.03)


def test_top_k_and_top_p_restrict_the_support():
    assert set(draws(top_k=2)) == {1, 2}
    assert set(draws(top_k=1)) == {1}
    assert set(draws(top_p=0.5)) == {1}  # the top token alone reaches 0.5
    assert set(draws(top_p=0.75)) == {1, 2}  # 0.5 + 0.3 >= 0.75
    assert set(draws(top_p=0.85)) == {1, 2, 3}


def test_repetition_penalty_lowers_recent_tokens():
    base = np.bincount(draws(n=2000), minlength=5)[1]
    pen = np.bincount(draws(n=2000, repetition_penalty=3.0, recent_tokens=[1]), minlength=5)[1]
    assert pen < base * 0.8
    rng = np.random.default_rng(0)
    assert sample_next(np.array([2.0, 1.5], np.float32), rng, temperature=0,
                       repetition_penalty=2.0, recent_tokens=[0]) == 1


@pytest.mark.parametrize("kw, match", [
    ({"temperature": -1}, "temperature"), ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 1.2, "recent_tokens": [9]}, "recent_tokens"),
    ({"temperature": float("inf")}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"temperature": 5e-324}, "past float64"),  # the logits / temperature overflow
])
def test_bad_arguments_are_value_errors(kw, match):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused cleanly: no numpy overflow / invalid-value warning on the way
        with pytest.raises(ValueError, match=match):
            sample_next(LOGITS, np.random.default_rng(0), **kw)


@pytest.mark.parametrize("logits", [np.zeros((2, 3), np.float32), np.array([1, 2]),
                                    np.array([1.0, np.nan], np.float32), np.array([], np.float32)])
def test_bad_logits_are_value_errors(logits):
    with pytest.raises(ValueError, match="logits"):
        sample_next(logits, np.random.default_rng(0))


def test_a_penalty_that_overflows_a_recent_logit_is_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="past float64"):  # 2.0 / 5e-324 is inf
            sample_next(np.array([2.0, 1.0], np.float32), np.random.default_rng(0), repetition_penalty=5e-324,
                        recent_tokens=[0])

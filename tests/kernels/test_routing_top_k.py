"""The engine's top-k expert selection (tern.kernels.routing.top_k_experts, one pass): the k
largest probabilities, ties to the lower expert index, in descending order — the set and
order that k rounds of selection with strict ``>`` gave (the engine's earlier form, and
tern.train.model.moe.route's tie rule)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tern.kernels.routing import top_k_experts


def _reference(pr: np.ndarray, k: int) -> list[int]:
    """Sort by (probability descending, index ascending); NaN rows: the first k."""
    if np.isnan(pr).all():
        return list(range(k))
    return sorted(range(len(pr)), key=lambda e: (-float(pr[e]), e))[:k]


def _top_k(pr: np.ndarray, k: int) -> list[int]:
    chosen = np.full(k, -1, np.int64)
    top_k_experts(pr, pr.shape[0], k, chosen)
    return chosen.tolist()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_top_k_is_the_sorted_prefix_with_ties_to_the_lower_index(data):
    E = data.draw(st.integers(1, 70))
    k = data.draw(st.integers(1, E))
    # few distinct values: ties are common
    vals = data.draw(st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 3.0]), min_size=E, max_size=E))
    pr = np.array(vals, np.float32)
    assert _top_k(pr, k) == _reference(pr, k)


def test_top_k_on_distinct_values_all_nan_and_k_equal_to_e():
    rng = np.random.default_rng(0)
    pr = rng.random(512).astype(np.float32)
    assert _top_k(pr, 8) == list(np.argsort(-pr, kind="stable")[:8])
    assert _top_k(np.full(16, np.nan, np.float32), 4) == [0, 1, 2, 3]
    pr = np.array([0.1, 0.4, 0.4, 0.1], np.float32)
    assert _top_k(pr, 4) == [1, 2, 0, 3]
    assert _top_k(pr, 1) == [1]

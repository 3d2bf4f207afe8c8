"""Engine(b3=...): base-3 matrices read as stored (tern.kernels.kernels_b3) give logits
bit-identical to expanding them to ternary2 at load, on every path (threads, expert-parallel,
activation skip on / off, unfused, a file mixing ternary2 and b3); the option's rule."""

import numpy as np
import pytest
from conftest import SMALL, engine_logits

from tern.kernels import ops
from tern.kernels.policy import b3_direct, b3_mode, b3_row_cols
from tern.packed.writer import random_model
from tern.run.engine import Engine

B3 = SMALL.replace(mixer_format="ternary_b3", mlp_format="ternary_b3", expert_format="ternary_b3")



@pytest.fixture(scope="module")
def b3_file(tmp_path_factory):
    return random_model(B3, tmp_path_factory.mktemp("b3") / "b3.tern", seed=3, progress=False)


def test_direct_equals_expand(b3_file):
    tokens = np.arange(14) * 7 % B3.vocab_size
    ref = engine_logits(Engine(b3_file, b3="expand"), tokens)
    for kw in (dict(), dict(threads=2, region=False, par_min_weights=0), dict(threads=2), dict(act_skip=False),
               dict(act_skip=False, threads=2, region=False, par_min_weights=0), dict(fused=False), dict(moe_skip=False)):
        eng = Engine(b3_file, b3="direct", **kw)
        assert eng.G[ops.G_B3] == 1 and eng.describe()["b3_direct"], kw
        assert np.array_equal(engine_logits(eng, tokens), ref), kw
    # the direct engine reads the file's b3 bytes: no ternary2 copies in aux beyond the
    # transposed down projections of the skip kernel
    assert Engine(b3_file, b3="direct", act_skip=False).aux.size < Engine(b3_file, b3="expand", act_skip=False).aux.size


def test_mixed_file_and_ternary2_file(tmp_path):
    """A file with ternary2 mixers and b3 experts: the direct engine re-packs the ternary2
    matrices to b3; a ternary2-only file ignores the option."""
    mixed = random_model(SMALL.replace(expert_format="ternary_b3"), tmp_path / "m.tern", seed=5, progress=False)
    tokens = np.arange(10) * 5 % SMALL.vocab_size
    ref = engine_logits(Engine(mixed, b3="expand"), tokens)
    eng = Engine(mixed, b3="direct", act_skip=False)
    assert eng.G[ops.G_B3] == 1
    assert np.array_equal(engine_logits(eng, tokens), ref)
    plain = random_model(SMALL, tmp_path / "p.tern", seed=5, progress=False)
    eng = Engine(plain, b3="direct")
    assert eng.G[ops.G_B3] == 0 and not eng.describe()["b3_direct"]
    assert np.array_equal(engine_logits(eng, tokens), engine_logits(Engine(plain), tokens))


def test_option_and_rule(b3_file):
    with pytest.raises(ValueError, match="b3 must be one of"):
        Engine(b3_file, b3="fast")
    assert Engine(b3_file, kernel="fp32", act_skip="auto", b3="direct").G[ops.G_B3] == 0  # fp32 rung: dequantized
    wide = B3.replace(d_model=2048, n_heads=4, mlp_hidden=2048, expert_hidden=2048, shared_hidden=2048,
                      activation="silu")
    assert b3_row_cols(wide) == 2048 and b3_row_cols(B3) == 48  # dReLU: down read transposed, d_model 48
    silu = B3.replace(activation="silu")  # the down projections' inputs count: shared 20, routed 24
    assert b3_row_cols(silu) == 20 and b3_row_cols(silu.replace(n_shared=0, shared_hidden=0)) == 24
    assert not b3_direct(wide, None) and not b3_direct(wide, 1 << 40)  # unknown LLC / fits in it: expand
    assert b3_direct(wide, 1024)  # weights beyond the LLC, long rows: direct
    assert not b3_direct(B3, 1024)  # short rows: expand
    assert not b3_direct(wide.replace(d_model=1024), 1024)
    assert b3_mode("auto", "ternary", wide, 1024, {"a": {"format": "ternary_b3"}}) == ("direct", True)
    assert b3_mode("direct", "ternary", B3, None, {"a": {"format": "ternary2"}}) == ("direct", False)
    assert b3_mode("expand", "ternary", wide, 1024, {"a": {"format": "ternary_b3"}}) == ("expand", False)
    auto = Engine(b3_file)  # a few KB of weights: fits any LLC, so "auto" expands
    assert auto.b3 == "expand" and auto.G[ops.G_B3] == 0

"""Engine(layout="blocked16"): row-oriented ternary matrices re-packed at load into 16-row blocks
(tern.kernels.kernels_blocked) give logits bit-identical to the stored rows on every path (threads,
one region and per-matrix, expert-parallel, activation skip on / off, unfused, all experts, b3 and
transposed files, odd shapes); the option's errors; the re-packed matrices' buffer."""

import numba
import numpy as np
import pytest
from conftest import SMALL, engine_logits

from tern.kernels import ops
from tern.kernels.kernels_blocked import blocked16_bytes
from tern.packed.writer import random_model
from tern.run.engine import Engine
from tern.run.weights import HUGE_PAGE, AuxBuffer, mapping_stats

TWO = numba.config.NUMBA_NUM_THREADS >= 2




VARIANTS = [dict(), dict(act_skip=False), dict(fused=False), dict(moe_skip=False), dict(act_skip=False, fused=False)]
if TWO:
    VARIANTS += [dict(threads=2), dict(threads=2, region=False, par_min_weights=0), dict(threads=2, region=False),
                 dict(threads=2, act_skip=False, region=False, par_min_weights=0), dict(threads=2, act_skip=False)]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_blocked_layout_gives_the_stored_rows_logits(small_file, kw):
    """SMALL has d_model 48 and 24 / 20 / 40 hidden units: rows and columns that are not multiples of 16."""
    tokens = np.arange(16) * 7 % SMALL.vocab_size
    ref = engine_logits(Engine(small_file, layout="rows", **kw), tokens)
    eng = Engine(small_file, layout="blocked16", **kw)
    assert eng.G[ops.G_BLOCKED] == 1 and eng.G[ops.N_GLOBALS + ops.G_BLOCKED] == 1
    assert eng.describe()["layout"] == "blocked16"
    assert np.array_equal(engine_logits(eng, tokens), ref)


def test_wider_model_and_b3_file(tmp_path):
    """Full 64-byte groups and 256-column segments (d_model 384, 4-row passes in the reference), and a file
    of base-3 matrices (expanded, then blocked: b3 'auto' resolves to 'expand')."""
    cfg = SMALL.replace(d_model=384, n_heads=4, expert_hidden=128, shared_hidden=64, mlp_hidden=256)
    path = random_model(cfg, tmp_path / "wide.tern", seed=2, progress=False)
    tokens = np.arange(10) * 5 % cfg.vocab_size
    for kw in ([dict(), dict(threads=2)] if TWO else [dict()]):
        assert np.array_equal(engine_logits(Engine(path, layout="blocked16", **kw), tokens), engine_logits(Engine(path, layout="rows", **kw), tokens))
    b3 = SMALL.replace(mixer_format="ternary_b3", mlp_format="ternary_b3", expert_format="ternary_b3")
    bpath = random_model(b3, tmp_path / "b3.tern", seed=3, progress=False)
    eng = Engine(bpath, layout="blocked16")
    assert eng.b3 == "expand" and not eng.describe()["b3_direct"]
    assert np.array_equal(engine_logits(eng, tokens % b3.vocab_size), engine_logits(Engine(bpath, b3="expand", layout="rows"), tokens % b3.vocab_size))


def test_every_row_matrix_is_re_packed_once(small_file):
    """aux grows by the blocked bytes of every row-oriented ternary matrix (experts one by one), no more."""
    rows = Engine(small_file, act_skip=True, layout="rows", experts="apart")  # together: experts copied to aux
    blk = Engine(small_file, act_skip=True, layout="blocked16", experts="apart")
    c = SMALL
    want = 0
    for i in range(c.n_layers):
        if c.mixer(i) == "ssm":
            mats = [(2 * c.d_inner, c.d_model), (c.dt_rank_eff + 2 * c.d_state, c.d_inner), (c.d_model, c.d_inner)]
        else:
            mats = [(3 * c.d_model, c.d_model), (c.d_model, c.d_model)]
        if c.is_moe(i):
            mats += [(c.shared_hidden, c.d_model)] * 2 * c.n_shared + [(c.expert_hidden, c.d_model)] * 2 * c.n_experts
        elif c.mlp_hidden:
            mats += [(c.mlp_hidden, c.d_model)] * 2
        want += sum(blocked16_bytes(r, k) for r, k in mats)
    grown = blk.aux.size - rows.aux.size
    assert want <= grown < want + 64 * 40  # each tensor padded to 64 bytes in aux


def test_layout_errors(small_file):
    with pytest.raises(ValueError, match="layout must be one of"):
        Engine(small_file, layout="cols")
    with pytest.raises(ValueError, match="needs the ternary kernel"):
        Engine(small_file, layout="blocked16", kernel="fp32")
    with pytest.raises(ValueError, match="b3='expand'"):
        Engine(small_file, layout="blocked16", b3="direct")


def test_layout_auto_is_the_default_and_blocked_where_simd(small_file):
    from tern.kernels.kernels_blocked import BLOCKED_BY_DEFAULT

    eng = Engine(small_file)
    assert eng.layout == ("blocked16" if BLOCKED_BY_DEFAULT else "rows") == eng.describe()["layout"]
    assert Engine(small_file, kernel="fp32").layout == "rows"


def test_weights_copy_leaves_the_re_packed_matrices_unwritten(small_file):
    """weights="copy" skips the file's packed bytes of every matrix the engine re-packed into aux (zero,
    never resident), copies the rest; the logits stay those of the mapped file."""
    tokens = np.arange(8) * 5 % SMALL.vocab_size
    blk = Engine(small_file, layout="blocked16", weights="copy", experts="apart")  # together: tests/run/test_engine_experts.py
    rows = Engine(small_file, layout="rows", weights="copy", experts="apart")
    src = blk.model.buffer
    dt = [k for k in blk.model.tensors if k.endswith("dt_proj.weight")]  # column blocks in either layout
    unread = [k for k in blk.model.tensors if k.endswith(".packed") and "down" not in k]  # rows: re-packed
    assert unread and dt
    for eng, skipped in ((blk, unread + dt), (rows, dt)):
        for k in eng.model.tensors:
            lo, hi = eng.model.offsets[k], eng.model.offsets[k] + eng.model.tensors[k].nbytes
            if k in skipped:
                assert not eng.buf[lo:hi].any(), k
            elif not k.endswith(".packed") or eng is rows:
                assert np.array_equal(eng.buf[lo:hi], src[lo:hi]), k
    mapped = Engine(small_file, layout="blocked16", weights="map")
    assert np.array_equal(engine_logits(blk, tokens), engine_logits(mapped, tokens))


def test_huge_page_copy_skip_ranges_are_checked():
    from tern.run.weights import huge_page_copy

    src = np.arange(100, dtype=np.uint8)
    out = huge_page_copy(src, [(50, 60), (10, 20)])
    assert not out[10:20].any() and not out[50:60].any()
    keep = np.r_[0:10, 20:50, 60:100]
    assert np.array_equal(out[keep], src[keep])
    with pytest.raises(ValueError, match="not inside"):
        huge_page_copy(src, [(90, 120)])


def test_aux_buffer_is_on_huge_pages_when_large():
    aux = AuxBuffer()
    a = np.arange(3 * HUGE_PAGE // 4, dtype=np.int32)  # 3 x HUGE_PAGE bytes
    addr_a = aux.add(a)
    addr_b = aux.add(np.arange(10, dtype=np.uint8))
    out = aux.build()
    assert not out.flags.writeable and out.ctypes.data % HUGE_PAGE == 0
    assert np.array_equal(out[addr_a // 2:addr_a // 2 + a.nbytes].view(np.int32), a)
    assert np.array_equal(out[addr_b // 2:addr_b // 2 + 10], np.arange(10, dtype=np.uint8))
    assert aux.parts == []  # released as copied
    assert "rss_bytes" in mapping_stats(out) or not mapping_stats(out)
    small = AuxBuffer()
    small.add(np.ones(5, np.float32))
    assert small.build().size == 64

"""Engine(experts="together"): each routed expert's gate, up and down back to back in the engine's buffer
(tern.run.weights.experts_together, tern.kernels.ops.routed_steps) give logits bit-identical to the three
tensors apart on every path (layouts, kernels, threads, one region and per-matrix, activation skip,
all experts, b3 files, one chosen expert); where each matrix lies; the "auto" rule; the option's errors."""

import numba
import numpy as np
import pytest
from conftest import SMALL, engine_logits

from tern.kernels import ops
from tern.kernels.policy import experts_layout
from tern.packed.writer import random_model
from tern.run.engine import Engine
from tern.run.weights import experts_together

TWO = numba.config.NUMBA_NUM_THREADS >= 2




VARIANTS = [dict(), dict(layout="rows"), dict(layout="rows", weights="map"), dict(kernel="fp32"),
            dict(act_skip=False), dict(act_skip=False, layout="rows"), dict(moe_skip=False), dict(fused=False)]
if TWO:
    VARIANTS += [dict(threads=2), dict(threads=2, layout="rows"), dict(threads=2, region=False, par_min_weights=0),
                 dict(threads=2, act_skip=False, region=False, par_min_weights=0)]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_experts_together_give_the_apart_logits(small_file, kw):
    tokens = np.arange(16) * 7 % SMALL.vocab_size
    apart = Engine(small_file, experts="apart", **kw)
    together = Engine(small_file, experts="together", **kw)
    moe = [i for i in range(SMALL.n_layers) if SMALL.is_moe(i)]
    assert (apart.T[:, ops.F_E_STEP] == -1).all()
    assert (together.T[moe, ops.F_E_STEP] > 0).all() and together.describe()["experts"] == "together"
    assert np.array_equal(engine_logits(together, tokens), engine_logits(apart, tokens))


def test_b3_file_and_one_chosen_expert(tmp_path):
    """A file of base-3 matrices read as stored (b3 direct: the b3 rows layout in aux), and top_k 1 (the
    one-region step splits the one chosen expert's matrices in row ranges)."""
    b3 = SMALL.replace(mixer_format="ternary_b3", mlp_format="ternary_b3", expert_format="ternary_b3")
    path = random_model(b3, tmp_path / "b3.tern", seed=3, progress=False)
    tokens = np.arange(10) * 5 % b3.vocab_size
    for kw in [dict(b3="direct", layout="rows"), dict(b3="expand")]:
        assert np.array_equal(engine_logits(Engine(path, experts="together", **kw), tokens),
                              engine_logits(Engine(path, experts="apart", **kw), tokens))
    k1 = SMALL.replace(top_k=1)
    path = random_model(k1, tmp_path / "k1.tern", seed=4, progress=False)
    for kw in [dict()] + ([dict(threads=2), dict(threads=2, par_min_weights=0)] if TWO else []):
        assert np.array_equal(engine_logits(Engine(path, experts="together", **kw), tokens % k1.vocab_size),
                              engine_logits(Engine(path, experts="apart", **kw), tokens % k1.vocab_size))


def test_each_expert_is_one_run_in_aux(small_file):
    """Expert e's gate, up and down lie at the layer's first address + e * step, one after another, and hold
    the bytes of the apart engine's matrices (rows layout as stored, activation skip off)."""
    apart = Engine(small_file, experts="apart", layout="rows", act_skip=False, weights="map")
    tog = Engine(small_file, experts="together", layout="rows", act_skip=False, weights="map")
    H, D, E = SMALL.expert_hidden, SMALL.d_model, SMALL.n_experts
    mb = ops.mat_bytes(apart.G, H, D)
    db = ops.down_bytes(apart.G, D, H)

    def at(eng, addr, n):
        src = eng.aux if addr & 1 else eng.buf
        return src[addr // 2: addr // 2 + n]

    for l in (i for i in range(SMALL.n_layers) if SMALL.is_moe(i)):
        step = tog.T[l, ops.F_E_STEP]
        assert step == 2 * (2 * mb + db) and tog.T[l, ops.F_EG] & 1 == 1  # in aux
        assert ops.routed_steps(tog.G, tog.T, l, H) == (step, step)
        assert ops.routed_steps(apart.G, apart.T, l, H) == (2 * mb, 2 * db)
        for e in range(E):
            base = tog.T[l, ops.F_EG] + e * step
            assert tog.T[l, ops.F_EU] == tog.T[l, ops.F_EG] + 2 * mb and tog.T[l, ops.F_ED] == tog.T[l, ops.F_EU] + 2 * mb
            for f, n, s in ((ops.F_EG, mb, 2 * mb), (ops.F_EU, mb, 2 * mb), (ops.F_ED, db, 2 * db)):
                want = at(apart, apart.T[l, f] + e * s, n)
                got = at(tog, base + (tog.T[l, f] - tog.T[l, ops.F_EG]), n)
                assert np.array_equal(got, want)
        for f in (ops.F_EG_S, ops.F_EU_S, ops.F_ED_S):  # the scales stay in the file
            assert tog.T[l, f] == apart.T[l, f]


def test_experts_together_array():
    a = np.arange(12, dtype=np.uint8).reshape(3, 4)  # 3 experts of 4 bytes
    b = np.arange(100, 106, dtype=np.uint8)  # 3 experts of 2 bytes
    c = np.ones((3, 1), np.float32)  # 3 experts of 4 bytes (viewed as bytes)
    out = experts_together([a, b, c], 3)
    assert out.dtype == np.uint8 and out.size == 30
    one = np.ones(1, np.float32).view(np.uint8)
    for e in range(3):
        assert np.array_equal(out[10 * e: 10 * e + 10], np.concatenate([a[e], b[2 * e: 2 * e + 2], one]))
    with pytest.raises(ValueError, match="equal matrices"):
        experts_together([a, np.zeros(7, np.uint8)], 3)
    with pytest.raises(ValueError, match="equal matrices"):
        experts_together([a], 0)


def test_auto_rule_and_bad_option(small_file):
    """auto: together where the experts stream from DRAM (over EXPERTS_TOGETHER_MIN_LLCS last-level caches)
    and the engine holds its own copy anyway; apart in cache and for rows read from the file mapping."""
    from tern.kernels.policy import EXPERTS_TOGETHER_MIN_LLCS as N

    llc, big = 32 << 20, N * (32 << 20) + 1
    assert experts_layout("auto", "blocked16", "map", "ternary", big, llc) == "together"
    assert experts_layout("auto", "rows", "copy", "ternary", big, llc) == "together"
    assert experts_layout("auto", "rows", "map", "fp32", big, llc) == "together"
    assert experts_layout("auto", "rows", "map", "ternary", big, llc) == "apart"  # would copy what "map" spares
    assert experts_layout("auto", "blocked16", "copy", "ternary", N * llc, llc) == "apart"  # in cache
    assert experts_layout("apart", "blocked16", "copy", "ternary", big, llc) == "apart"
    assert experts_layout("together", "rows", "map", "ternary", 0, llc) == "together"
    assert Engine(small_file).experts == "apart"  # a few KB of experts
    with pytest.raises(ValueError, match="experts must be one of"):
        Engine(small_file, experts="interleaved")


def test_auto_puts_dram_resident_experts_together(small_file, monkeypatch):
    """The engine's auto choice reads the last-level cache its rules assume: a cache smaller than the
    experts over EXPERTS_TOGETHER_MIN_LLCS puts them together."""
    import tern.run.engine as engine_mod

    monkeypatch.setattr(engine_mod, "llc_bytes_here", lambda tuned=None: 64)
    assert Engine(small_file).experts == "together"
    assert Engine(small_file, layout="rows", weights="map").experts == "apart"


def test_a_dense_model_takes_the_option(tmp_path):
    """No routed experts: nothing to put together, the option is accepted and changes nothing."""
    cfg = SMALL.replace(moe_layers=(), n_experts=0, top_k=0, expert_hidden=0, n_shared=0, shared_hidden=0)
    path = random_model(cfg, tmp_path / "dense.tern", seed=1, progress=False)
    tokens = np.arange(8) * 3 % cfg.vocab_size
    a, b = Engine(path, experts="together"), Engine(path, experts="apart")
    assert (a.T[:, ops.F_E_STEP] == -1).all()
    assert np.array_equal(engine_logits(a, tokens), engine_logits(b, tokens))


def test_weights_copy_skips_the_experts_put_together(small_file):
    """The routed experts' packed bytes, all in aux when together, are not copied from the file (zero in the
    engine's huge-page copy); the shared experts' are, in the rows layout."""
    eng = Engine(small_file, layout="rows", weights="copy", experts="together")
    routed = [k for k in eng.model.tensors if ".ffn.experts." in k and k.endswith(".packed")]
    shared = [k for k in eng.model.tensors if ".ffn.shared." in k and k.endswith(".packed")]
    assert routed and shared
    for k in routed + shared:
        lo, hi = eng.model.offsets[k], eng.model.offsets[k] + eng.model.tensors[k].nbytes
        assert eng.buf[lo:hi].any() == (k in shared), k


def test_generate_command_takes_the_option(tmp_path):
    """`tern generate --experts together|apart` writes the same text and names the layout it used; a bad
    value is a one-line argparse error."""
    import contextlib
    import io
    import json

    from tern import cli

    path = random_model(SMALL.replace(vocab_size=1024), tmp_path / "g.tern", seed=4, tokenizer="bpe1024",
                        progress=False)
    got = {}
    for mode in ("together", "apart"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(["generate", "--model", str(path), "-n", "6", "--temperature", "0", "--experts", mode,
                             "--json"]) == 0
        got[mode] = json.loads(out.getvalue())
        assert got[mode]["experts"] == mode
    assert got["together"]["token_ids"] == got["apart"]["token_ids"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        cli.main(["generate", "--model", str(path), "--experts", "mixed"])
    assert "--experts" in err.getvalue() and "Traceback" not in err.getvalue()

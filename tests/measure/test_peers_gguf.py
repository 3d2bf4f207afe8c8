"""GGUF writing for `tern bench peers`: the tensor list, shapes, types and byte sizes read
back with gguf-py's reader; the random ternary blocks are what gguf-py's quantizer writes."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")  # the `peers` / `test` extra

from tern.core.config import ModelConfig, param_counts  # noqa: E402
from tern.measure.peers_gguf import (  # noqa: E402
    ensure_gguf,
    gguf_byte_counts,
    gguf_key,
    gguf_tensors,
    random_ternary_blocks,
    write_gguf,
)

DENSE = ModelConfig(name="tiny-dense", vocab_size=300, d_model=256, n_layers=2, attn_layers=(0, 1),
                    n_heads=4, attn_window=64, mlp_hidden=512, activation="silu", embed_format="fp16",
                    head_format="fp16", tie_embeddings=False)
MOE = DENSE.replace(name="tiny-moe", mlp_hidden=0, moe_layers=(0, 1), n_experts=4, top_k=2, expert_hidden=256,
                    router_format="fp16", embed_format="int8", head_format="int8")


def _fields(reader):
    out = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        v = f.contents()
        out[name] = v
    return out


@pytest.mark.parametrize("body,bpw", [("TQ2_0", 2.0625), ("TQ1_0", 1.6875)])
def test_dense_gguf_reads_back(tmp_path, body, bpw):
    path = write_gguf(DENSE, tmp_path / "m.gguf", body=body)
    r = gguf.GGUFReader(str(path))
    plan = gguf_tensors(DENSE, body)
    assert [t.name for t in r.tensors] == [t.name for t in plan]
    assert len(plan) == 1 + DENSE.n_layers * 9 + 2
    for got, want in zip(r.tensors, plan, strict=True):
        assert tuple(int(x) for x in got.shape) == tuple(reversed(want.shape))  # ggml ne order
        assert got.tensor_type.name == want.qtype
        assert int(got.n_bytes) == want.nbytes
        if want.qtype == body:
            assert got.n_bytes * 8 / got.n_elements == pytest.approx(bpw)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["token_embd.weight"] == types["output.weight"] == "F16"
    assert types["blk.0.attn_norm.weight"] == "F32"
    f = _fields(r)
    assert f["general.architecture"] == "llama"
    assert f["llama.block_count"] == 2 and f["llama.embedding_length"] == 256
    assert f["llama.feed_forward_length"] == 512 and f["llama.attention.head_count"] == 4
    assert f["llama.attention.head_count_kv"] == 4 and f["llama.rope.dimension_count"] == 64
    assert f["llama.context_length"] == 64
    assert f["tokenizer.ggml.model"] == "llama"
    assert len(f["tokenizer.ggml.tokens"]) == 300 == f["llama.vocab_size"]
    assert f["tokenizer.ggml.tokens"][:3] == ["<unk>", "<s>", "</s>"]
    assert f["tokenizer.ggml.tokens"][3 + 0x41] == "<0x41>"
    # the ternary matrices dequantize to {-d, 0, +d} with d = 1/sqrt(cols)
    q = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
    w = gguf.quants.dequantize(np.asarray(q.data), q.tensor_type)
    assert w.shape == (256, 512)
    d = np.float32(np.float16(1 / np.sqrt(512)))
    assert set(np.unique(w)) == {-d, np.float32(0), d}


def test_moe_gguf_mixtral_layout(tmp_path):
    path = write_gguf(MOE, tmp_path / "moe.gguf")
    r = gguf.GGUFReader(str(path))
    types = {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in r.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == ("F16", (256, 4))
    assert types["blk.1.ffn_gate_exps.weight"] == ("TQ2_0", (256, 256, 4))
    assert types["blk.1.ffn_down_exps.weight"] == ("TQ2_0", (256, 256, 4))
    assert types["token_embd.weight"][0] == types["output.weight"][0] == "Q8_0"
    assert "blk.0.ffn_gate.weight" not in types
    f = _fields(r)
    assert f["llama.expert_count"] == 4 and f["llama.expert_used_count"] == 2
    assert f["llama.feed_forward_length"] == 256
    c = gguf_byte_counts(MOE, gguf_tensors(MOE))
    expert = 256 * 256 // 256 * 66  # one expert's matrix in TQ2_0
    assert c["total_bytes"] == sum(int(t.n_bytes) for t in r.tensors)
    assert c["total_bytes"] - c["active_bytes"] == 2 * 3 * 2 * expert + 299 * (256 // 32 * 34)
    assert c["active_params"] == param_counts(MOE).active.params  # same model, other formats


def test_gqa_narrows_k_and_v():
    ts = {t.name: t for t in gguf_tensors(DENSE, n_kv_heads=2)}
    assert ts["blk.0.attn_k.weight"].shape == (128, 256) == ts["blk.0.attn_v.weight"].shape
    assert ts["blk.0.attn_q.weight"].shape == (256, 256)
    with pytest.raises(ValueError, match="n_kv_heads"):
        gguf_tensors(DENSE, n_kv_heads=3)


@pytest.mark.parametrize("qtype", ["TQ2_0", "TQ1_0"])
def test_random_blocks_are_what_gguf_quantizes(qtype):
    rng = np.random.default_rng(1)
    blocks = random_ternary_blocks(qtype, 6, 768, rng, scale=0.25)
    w = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])  # (6, 768)
    assert w.shape == (6, 768)
    vals, counts = np.unique(w, return_counts=True)
    assert list(vals) == [-0.25, 0.0, 0.25]
    assert counts.min() > 0.28 * w.size  # every code about a third
    assert np.array_equal(gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype]), blocks)


def test_bad_configs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="every layer must be attention"):
        gguf_tensors(DENSE.replace(attn_layers=(0,)))
    with pytest.raises(ValueError, match="activation must be silu"):
        gguf_tensors(DENSE.replace(activation="relu2"))
    with pytest.raises(ValueError, match="shared experts"):
        gguf_tensors(MOE.replace(n_shared=1, shared_hidden=256))
    with pytest.raises(ValueError, match="multiple of"):
        gguf_tensors(DENSE.replace(mlp_hidden=320))
    with pytest.raises(ValueError, match="body type"):
        gguf_tensors(DENSE, body="Q4_0")


def test_ensure_gguf_caches_and_cleans_stale_temp(tmp_path):
    p = ensure_gguf(DENSE, tmp_path)
    stamp = p.stat().st_mtime_ns
    assert ensure_gguf(DENSE, tmp_path) == p and p.stat().st_mtime_ns == stamp
    q = ensure_gguf(DENSE, tmp_path, body="TQ1_0")
    assert q != p
    other = DENSE.replace(name="x")
    stale = tmp_path / f"x-{gguf_key(other)}.gguf.tmp"  # an interrupted earlier write
    stale.write_bytes(b"partial")
    path = ensure_gguf(other, tmp_path)
    assert path.exists() and not stale.exists() and not list(tmp_path.glob("*.tmp"))
    assert gguf.GGUFReader(str(path)).tensors[0].name == "token_embd.weight"

"""Packed model file: layout, round trips, safetensors compatibility and every bad-file case."""

import json
import struct
import zlib

import numpy as np
import pytest
from conftest import SMALL

from tern.core.config import SANDBOX, ModelConfig, tensor_specs
from tern.kernels.packing import quantize_weights
from tern.packed.format import FORMAT_NAME, FORMAT_VERSION, _header_digest, file_layout, tokenizer_identity
from tern.packed.reader import codes_valid, load_packed, read_header, validate_packed
from tern.packed.writer import random_model
from tern.train.export import export

# ssm + attention + ssm, a dense-MLP layer and two MoE layers with a shared expert


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    return random_model(SMALL, tmp_path_factory.mktemp("pk") / "small.tern", seed=3, tokenizer="bpe1024",
                        progress=False)


def test_layout_follows_tensor_specs():
    stored, packing = file_layout(SANDBOX)
    assert list(packing) == [s.name for s in tensor_specs(SANDBOX)]
    names = {t.name for t in stored}
    assert "layers.0.ffn.experts.down.packed" in names and "layers.0.ffn.experts.down.scale" in names
    down = packing["layers.0.ffn.experts.down"]
    assert down["orientation"] == "transposed" and down["rows"] == 256 and down["cols"] == 64
    by = {t.name: t for t in stored}
    # transposed: one packed row per hidden unit, 256 outputs -> 64 bytes; scale per output row
    assert by["layers.0.ffn.experts.down.packed"].shape == (16, 64, 64)
    assert by["layers.0.ffn.experts.down.scale"].shape == (16, 256)
    assert by["layers.0.mixer.in_proj.weight.packed"].shape == (1024, 64)
    with pytest.raises(ValueError, match="q4"):
        file_layout(SANDBOX.replace(expert_format="q4"))


def test_random_model_is_valid_safetensors(small_file):
    safetensors = pytest.importorskip("safetensors.numpy")
    m = load_packed(small_file)
    st = safetensors.load_file(str(small_file))
    assert set(st) == set(m.tensors) | {k for k in st if k.startswith("__pad__.")}
    for k, v in m.tensors.items():
        assert st[k].dtype == v.dtype and np.array_equal(st[k], v), k
    header, _ = read_header(small_file)
    meta = header["__metadata__"]
    assert meta["format"] == FORMAT_NAME and meta["version"] == str(FORMAT_VERSION)
    assert ModelConfig.from_json(meta["config"]) == SMALL == m.cfg
    from tern.data.tokenizer import get_tokenizer

    assert m.tokenizer == {"name": "bpe1024", "sha256": get_tokenizer("bpe1024").hash}
    assert m.creator["function"] == "random_model" and m.creator["seed"] == 3
    for k in m.tensors:  # every tensor 64-byte aligned in the file
        assert m.offsets[k] % 64 == 0
    m.close()


def test_random_model_values_are_plausible(small_file):
    with load_packed(small_file) as m:
        A = -np.exp(m.tensors["layers.0.mixer.A_log"])
        assert np.all(A < 0)
        dt = np.log1p(np.exp(m.tensors["layers.0.mixer.dt_proj.bias"]))  # softplus
        assert 5e-4 < dt.min() and dt.max() < 0.2
        wt, s = m.ternary("layers.2.ffn.experts.gate")
        assert wt.shape == (5, 24, 48) and s.shape == (5, 24) and np.all(s > 0)
        assert set(np.unique(wt)) == {-1, 0, 1}
        assert np.all(m.tensors["norm_f.weight"] == 1)


def test_random_model_is_deterministic(tmp_path, small_file):
    again = random_model(SMALL, tmp_path / "again.tern", seed=3, tokenizer="bpe1024", progress=False)
    with load_packed(small_file) as a, load_packed(again) as b:
        for k in a.tensors:
            assert np.array_equal(a.tensors[k], b.tensors[k]), k


def _state_dict(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.shape).astype(np.float32) * 0.05 for s in tensor_specs(cfg)}


@pytest.mark.parametrize("fmt", ["ternary2", "ternary_b3"])
def test_export_round_trip(tmp_path, fmt):
    cfg = SMALL.replace(expert_format=fmt, mlp_format=fmt, embed_format="int8", head_format="int8",
                        router_format="bf16")
    sd = _state_dict(cfg)
    path = export((sd, cfg), tmp_path / "x.tern", tokenizer={"name": "bpe1024", "sha256": "ab"},
                  progress=False)
    with load_packed(path) as m:
        assert m.cfg == cfg and m.creator["function"] == "export"
        for s in tensor_specs(cfg):
            p = m.packing[s.name]
            if p["format"] in ("ternary2", "ternary_b3"):
                wt, sc = m.ternary(s.name)
                flat = sd[s.name].reshape(-1, s.shape[-1])
                want_wt, want_s = quantize_weights(flat)
                assert np.array_equal(wt.reshape(flat.shape), want_wt), s.name
                assert np.array_equal(sc.reshape(-1), want_s), s.name
            elif p["format"] == "int8":
                w = m.weight(s.name)
                tol = np.abs(sd[s.name]).max(axis=-1, keepdims=True) / 127 * 0.5 + 1e-7
                assert np.all(np.abs(w - sd[s.name]) <= tol), s.name
            elif p["format"] == "bf16":
                assert np.allclose(m.weight(s.name), sd[s.name], rtol=2**-8, atol=0)
            else:
                assert np.array_equal(m.weight(s.name), sd[s.name]), s.name


def test_export_rejects_mismatched_state(tmp_path):
    sd = _state_dict(SMALL)
    del sd["norm_f.weight"]
    with pytest.raises(ValueError, match="norm_f.weight"):
        export((sd, SMALL), tmp_path / "x.tern", progress=False)
    sd = _state_dict(SMALL)
    sd["embed.weight"] = sd["embed.weight"][:, :10]
    with pytest.raises(ValueError, match="embed.weight"):
        export((sd, SMALL), tmp_path / "x.tern", progress=False)
    assert not list(tmp_path.iterdir())  # no half-written file left behind


def test_tokenizer_identity():
    assert tokenizer_identity(None) is None
    assert tokenizer_identity("no-such-tokenizer") == {"name": "no-such-tokenizer", "sha256": ""}

    class Tok:
        name, hash = "t", "abc"

    assert tokenizer_identity(Tok()) == {"name": "t", "sha256": "abc"}
    assert tokenizer_identity({"name": "u", "sha256": "d"}) == {"name": "u", "sha256": "d"}
    with pytest.raises(ValueError):
        tokenizer_identity(3)


def test_codes_valid():
    assert codes_valid(np.array([0b10_01_00_10], np.uint8), "ternary2")
    assert not codes_valid(np.array([0, 0b0011_0000], np.uint8), "ternary2")
    assert codes_valid(np.array([242], np.uint8), "ternary_b3")
    assert not codes_valid(np.array([243], np.uint8), "ternary_b3")


# ---- bad files ------------------------------------------------------------------------------


def _copy(src, dst):
    dst.write_bytes(src.read_bytes())
    return dst


def _rewrite_header(path, fn, fix_digest=True):
    """Apply fn to the parsed header and write it back at the same length."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    fn(h)
    if fix_digest:
        h["__metadata__"]["header_sha256"] = _header_digest(h)
    new = json.dumps(h).encode()
    assert len(new) <= n
    path.write_bytes(raw[:8] + new + b" " * (n - len(new)) + raw[8 + n:])


def _poke(path, tensor, value_bytes, fix_crc=True):
    """Overwrite the first bytes of ``tensor``'s data (and fix its crc32 in the header)."""
    header, n = read_header(path)
    b, e = header[tensor]["data_offsets"]
    raw = bytearray(path.read_bytes())
    raw[8 + n + b:8 + n + b + len(value_bytes)] = value_bytes
    path.write_bytes(bytes(raw))
    if fix_crc:
        crc = zlib.crc32(bytes(raw[8 + n + b:8 + n + e]))

        def fix(h):
            c = json.loads(h["__metadata__"]["crc32"])
            c[tensor] = f"{crc:08x}"
            h["__metadata__"]["crc32"] = json.dumps(c, sort_keys=True)

        _rewrite_header(path, fix)


def test_bad_truncated(small_file, tmp_path):
    p = _copy(small_file, tmp_path / "t.tern")
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated"):
        load_packed(p)
    p.write_bytes(b"\x05\x00")
    with pytest.raises(ValueError, match="too short"):
        load_packed(p)


def test_bad_flipped_header_byte(small_file, tmp_path):
    raw = small_file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    # flip a byte inside the config digits, inside a shape, and the length prefix
    for needle in (b'd_model\\": 48', b'"shape": [48]', b'attn_window\\": 8'):
        i = raw.index(needle) + len(needle) - 1
        p = tmp_path / "f.tern"
        p.write_bytes(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:])
        with pytest.raises(ValueError):
            load_packed(p)
    p.write_bytes(raw[:3] + bytes([raw[3] ^ 0x10]) + raw[4:])
    with pytest.raises(ValueError):
        load_packed(p)
    for i in range(9, 8 + n, max(1, n // 40)):  # any flipped header byte is caught
        p.write_bytes(raw[:i] + bytes([raw[i] ^ 0x04]) + raw[i + 1:])
        with pytest.raises(ValueError):
            load_packed(p)


def test_bad_version_and_format(small_file, tmp_path):
    p = _copy(small_file, tmp_path / "v.tern")
    _rewrite_header(p, lambda h: h["__metadata__"].update(version="2"))
    with pytest.raises(ValueError, match="version '2' is not supported"):
        load_packed(p)
    p = _copy(small_file, tmp_path / "v.tern")
    _rewrite_header(p, lambda h: h["__metadata__"].update(format="other"))
    with pytest.raises(ValueError, match="format is 'other'"):
        load_packed(p)


def test_bad_config(small_file, tmp_path):
    p = _copy(small_file, tmp_path / "c.tern")

    def cfg(h):
        c = json.loads(h["__metadata__"]["config"])
        c["top_k"] = 9
        h["__metadata__"]["config"] = json.dumps(c)

    _rewrite_header(p, cfg)
    with pytest.raises(ValueError, match="invalid config.*top_k"):
        load_packed(p)


def test_bad_missing_tensor(small_file, tmp_path):
    p = _copy(small_file, tmp_path / "m.tern")
    _rewrite_header(p, lambda h: h.pop("layers.2.ffn.experts.up.scale"))
    with pytest.raises(ValueError, match="missing tensor.*layers.2.ffn.experts.up.scale"):
        load_packed(p)


def test_bad_shape(small_file, tmp_path):
    p = _copy(small_file, tmp_path / "s.tern")

    def shape(h):
        e = h["layers.0.mixer.D"]
        e["shape"] = [48, 2]  # same byte count, wrong shape

    _rewrite_header(p, shape)
    with pytest.raises(ValueError, match=r"layers.0.mixer.D is F32 \[48, 2\], the config needs F32 \[96\]"):
        load_packed(p)


def test_bad_nan_scale(small_file, tmp_path):
    nan = np.array([np.nan], np.float32).tobytes()
    p = _copy(small_file, tmp_path / "n.tern")
    _poke(p, "layers.1.mixer.qkv.weight.scale", nan)
    for check in ("header", "full"):
        with pytest.raises(ValueError, match="layers.1.mixer.qkv.weight has non-finite scales"):
            load_packed(p, check=check)
    p = _copy(small_file, tmp_path / "n.tern")
    _poke(p, "layers.0.norm1.weight", nan)
    with pytest.raises(ValueError, match="layers.0.norm1.weight has non-finite values"):
        load_packed(p)


def test_bad_codes_and_corrupted_data(small_file, tmp_path):
    p = _copy(small_file, tmp_path / "b.tern")
    _poke(p, "layers.2.ffn.experts.down.packed", b"\xff")
    with pytest.raises(ValueError, match="layers.2.ffn.experts.down holds invalid ternary2 codes"):
        load_packed(p)
    p = _copy(small_file, tmp_path / "b.tern")
    _poke(p, "layers.2.ffn.experts.down.packed", b"\x00", fix_crc=False)
    with pytest.raises(ValueError, match="layers.2.ffn.experts.down.packed is corrupted"):
        load_packed(p)
    assert load_packed(p, check="header").cfg == SMALL  # the header-only check does not read data


def test_bad_not_a_model(tmp_path):
    p = tmp_path / "x.tern"
    p.write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(ValueError, match="__metadata__"):
        load_packed(p)
    p.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_packed(p)
    with pytest.raises(FileNotFoundError):
        load_packed(tmp_path / "missing.tern")
    with pytest.raises(ValueError, match="check"):
        load_packed(p, check="some")


def test_validate_packed_summary(small_file):
    s = validate_packed(small_file)
    assert s["config"]["name"] == "small" and s["file_bytes"] == small_file.stat().st_size


@pytest.mark.slow
def test_load_memory_maps(tmp_path):
    psutil = pytest.importorskip("psutil")
    cfg = ModelConfig(name="wide", vocab_size=256, d_model=512, n_layers=2, mlp_hidden=0,
                      moe_layers=(0, 1), n_experts=64, top_k=2, expert_hidden=1024)
    path = random_model(cfg, tmp_path / "w.tern", progress=False)
    size = path.stat().st_size
    assert size > 50e6
    proc = psutil.Process()
    before = proc.memory_info().rss
    m = load_packed(path, check="header")
    grown = proc.memory_info().rss - before
    assert grown < size / 8, (grown, size)  # nothing but the header and scales was read
    wt, _ = m.ternary("layers.1.ffn.experts.gate")  # touching data works
    assert wt.shape == (64, 1024, 512)
    m.close()


def test_a_file_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
    """The writer compares the file's size with the free space first (a 10B model is 2.5 GB):
    a clear ENOSPC naming both, no temp file left, the old file untouched."""
    import errno
    import shutil
    from collections import namedtuple

    from tern.packed import writer

    path = random_model(SMALL, tmp_path / "m.tern", seed=1)
    before = path.read_bytes()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(writer.shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OSError, match=r"m\.tern needs \d+\.\d MB and .* has 0\.0 MB free: free some space") as e:
        random_model(SMALL, path, seed=2)
    assert e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tern"] and path.read_bytes() == before
    monkeypatch.undo()
    assert shutil.disk_usage(tmp_path).free > 10**6
    assert random_model(SMALL, path, seed=2).read_bytes() != before  # room again: written

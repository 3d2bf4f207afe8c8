"""Property-based tests of the packed reader (hypothesis): truncated, bit-flipped, overwritten
and re-signed files give a clean ValueError (one line, naming the file) or a valid model."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from conftest import SMALL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tern.packed.format import _header_digest
from tern.packed.reader import load_packed
from tern.packed.writer import random_model

SETTINGS = settings(max_examples=80, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """(bytes of a valid packed file, its tensors as arrays, work path for mutated copies)."""
    d = tmp_path_factory.mktemp("prop")
    path = random_model(SMALL, d / "small.tern", seed=5, progress=False)
    with load_packed(path) as m:
        tensors = {k: np.array(v) for k, v in m.tensors.items()}
    return path.read_bytes(), tensors, d / "mutated.tern"


def _load(path, check):
    """None when the file is valid (and equal in content, checked by the caller), else the
    error message; anything but a ValueError fails the test."""
    try:
        m = load_packed(path, check=check)
    except ValueError as e:
        msg = str(e)
        assert "\n" not in msg and str(path) in msg, msg
        return msg
    return m


def _same_content(m, tensors) -> bool:
    with m:
        return m.cfg == SMALL and all(np.array_equal(m.tensors[k], v) for k, v in tensors.items())


@SETTINGS
@given(data=st.data())
def test_any_truncation_is_a_clean_error(original, data):
    raw, _, path = original
    cut = data.draw(st.integers(0, len(raw) - 1), label="length")
    path.write_bytes(raw[:cut])
    for check in ("header", "full"):
        assert isinstance(_load(path, check), str)


@SETTINGS
@given(data=st.data())
def test_any_single_bit_flip_fails_the_full_check(original, data):
    raw, tensors, path = original
    i = data.draw(st.integers(0, len(raw) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    path.write_bytes(raw[:i] + bytes([raw[i] ^ (1 << bit)]) + raw[i + 1:])
    assert isinstance(_load(path, "full"), str)
    got = _load(path, "header")  # header only: the data bytes are not read
    (n,) = struct.unpack("<Q", raw[:8])
    if i < 8 + n:
        assert isinstance(got, str)
    elif not isinstance(got, str):
        got.close()


@SETTINGS
@given(data=st.data())
def test_overwritten_bytes_are_caught_or_change_nothing(original, data):
    raw, tensors, path = original
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), min_size=1,
                               max_size=8), label="edits")
    buf = bytearray(raw)
    for i, v in edits:
        buf[i] = v
    path.write_bytes(bytes(buf))
    got = _load(path, "full")
    if not isinstance(got, str):  # e.g. JSON whitespace exchanged for other whitespace
        assert _same_content(got, tensors)


def _resigned(raw: bytes, fn) -> bytes | None:
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    fn(h)
    h["__metadata__"]["header_sha256"] = _header_digest(h)
    new = json.dumps(h).encode()
    return None if len(new) > n else raw[:8] + new + b" " * (n - len(new)) + raw[8 + n:]


@SETTINGS
@given(data=st.data())
def test_resigned_headers_with_random_values_are_clean_errors(original, data):
    """Correctly signed headers whose entries or metadata hold arbitrary JSON values."""
    raw, tensors, path = original
    (n,) = struct.unpack("<Q", raw[:8])
    names = sorted(k for k in json.loads(raw[8:8 + n]) if k != "__metadata__")
    target = data.draw(st.sampled_from(names + ["__metadata__"]), label="entry")
    if target == "__metadata__":
        key = data.draw(st.sampled_from(["format", "version", "config", "packing", "tokenizer", "creator",
                                         "crc32"]), label="key")
        value = data.draw(st.one_of(JSON.map(json.dumps), JSON), label="value")
    else:
        key = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]), label="key")
        value = data.draw(JSON, label="value")
    new = _resigned(raw, lambda h: h[target].update({key: value}))
    if new is None:
        return
    path.write_bytes(new)
    for check in ("header", "full"):
        got = _load(path, check)
        if not isinstance(got, str):
            got.close()


@settings(max_examples=30, deadline=None, database=None)
@given(value=JSON)
def test_a_header_entry_of_any_json_value_is_a_clean_error(original, value):
    raw, _, path = original
    new = _resigned(raw, lambda h: h.update({"layers.0.mixer.D": value}))
    if new is not None:
        path.write_bytes(new)
        assert isinstance(_load(path, "header"), str)

"""Robustness of the packed reader: malformed header values are clean errors, and the
header-only check says plainly what it does not verify (and `tern generate` does not use it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SMALL, assert_one_line_error
from test_export import _poke, _rewrite_header  # the header / data surgery of the format tests

from tern import cli
from tern.packed.reader import HEADER_CHECK_SKIPS, load_packed, validate_packed
from tern.packed.writer import random_model


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    return random_model(SMALL.replace(vocab_size=1024), tmp_path_factory.mktemp("rr") / "small.tern", seed=2,
                        tokenizer="bpe1024", progress=False)


ENTRY = "layers.0.mixer.D"


@pytest.mark.parametrize("field, value, match", [
    ("dtype", ["F32"], "bad dtype/shape"), ("dtype", {"a": 1}, "bad dtype/shape"), ("dtype", None, "bad dtype"),
    ("shape", [True, 48], "bad dtype/shape"), ("shape", 48, "malformed"), ("shape", "48", "bad dtype/shape"),
    ("shape", [-1], "bad dtype/shape"), ("data_offsets", [0, True], "bad data offsets"),
    ("data_offsets", [1.5, 4], "bad data offsets"), ("data_offsets", 3, "malformed"),
    ("data_offsets", [0, 1, 2], "malformed"),
])
def test_malformed_header_values_are_clean_errors(small_file, tmp_path, field, value, match):
    p = tmp_path / "h.tern"
    p.write_bytes(small_file.read_bytes())
    _rewrite_header(p, lambda h: h[ENTRY].update({field: value}))
    with pytest.raises(ValueError, match=match):
        load_packed(p, check="header")


@pytest.mark.parametrize("key, value, match", [
    ("tokenizer", [1, 2], "'tokenizer' must be null"), ("tokenizer", {"name": 3}, "'tokenizer' must be null"),
    ("tokenizer", "bpe1024", "'tokenizer' must be null"), ("creator", [], "'creator' is not a dict"),
    ("config", "[1]", "invalid config"),
])
def test_malformed_metadata_is_a_clean_error(small_file, tmp_path, key, value, match):
    p = tmp_path / "m.tern"
    p.write_bytes(small_file.read_bytes())
    _rewrite_header(p, lambda h: h["__metadata__"].update({key: json.dumps(value) if key != "config" else value}))
    with pytest.raises(ValueError, match=match):
        load_packed(p, check="header")


def test_an_entry_that_is_not_a_dict_is_a_clean_error(small_file, tmp_path):
    p = tmp_path / "e.tern"
    p.write_bytes(small_file.read_bytes())
    _rewrite_header(p, lambda h: h.update({ENTRY: ["F32"]}))
    with pytest.raises(ValueError, match=f"malformed header entry for {ENTRY}"):
        load_packed(p, check="header")


CORRUPTIONS = {  # what a header-only check lets through
    "flipped data": ("layers.0.mixer.D", np.array([1.5], np.float32).tobytes(), "is corrupted"),
    "NaN weight": ("norm_f.weight", np.array([np.nan], np.float32).tobytes(), "is corrupted"),
    "invalid ternary code": ("layers.0.mixer.in_proj.weight.packed", b"\xff", "is corrupted"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_header_check_passes_corrupted_data_and_says_so(small_file, tmp_path, capsys, kind):
    from tern.run.engine import Engine

    tensor, data, match = CORRUPTIONS[kind]
    p = tmp_path / "c.tern"
    p.write_bytes(small_file.read_bytes())
    _poke(p, tensor, data, fix_crc=False)
    s = validate_packed(p, check="header")  # structure only: passes
    assert s["not_verified"] == list(HEADER_CHECK_SKIPS)
    assert validate_packed(small_file)["not_verified"] == []
    with pytest.raises(ValueError, match=f"tensor {tensor} {match}"):
        load_packed(p)  # the full check (the default) catches it
    Engine(p, check="header").close()  # ... and an Engine opened with the header check does not
    with pytest.raises(ValueError, match=match):
        Engine(p)
    assert cli.main(["export", "--validate", str(p), "--check", "header"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("header valid: ") and "not verified by the header check: tensor data crc32" in out
    assert "NaN" in out and "invalid ternary codes" in out
    # `tern generate` keeps the full check: exit 2 naming the tensor
    assert cli.main(["generate", "--model", str(p), "-n", "2"]) == 2
    assert_one_line_error(capsys.readouterr().err, "tern generate: error:", f"tensor {tensor} is corrupted")


def test_export_help_says_what_the_header_check_skips(capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "flipped weight bits, NaN weights and invalid ternary codes pass it" in text

"""Robustness of the Engine and `tern generate`: bad prompts, flags named in errors, model
paths that are not files, and decoding past max_seq_len (one warning per Engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from conftest import SMALL, assert_one_line_error

from tern import cli
from tern.packed.writer import random_model
from tern.run.engine import Engine, PastMaxSeqLenWarning


@pytest.fixture(scope="module")
def model_1024(tmp_path_factory):
    """A random SMALL-shaped model with the corpus tokenizer's vocabulary (for `tern generate`)."""
    return random_model(SMALL.replace(vocab_size=1024, max_seq_len=16), tmp_path_factory.mktemp("g") / "m.tern",
                        seed=1, tokenizer="bpe1024", progress=False)


@pytest.fixture(scope="module")
def engine(model_1024):
    return Engine(model_1024)


@pytest.mark.parametrize("prompt, what", [(None, "NoneType"), (3, "int"), ("abc", "str"), (b"ab", "bytes"),
                                          (np.array(5), "ndarray")])
def test_generate_rejects_a_prompt_that_is_not_token_ids(engine, prompt, what):
    with pytest.raises(ValueError, match=f"prompt_ids must be a sequence of token ids, got {what}"):
        list(engine.generate(prompt, 3))
    assert len(list(engine.generate(np.array([1, 2]), 2))) == 2  # arrays of ids are fine


def test_decoding_past_max_seq_len_warns_once_per_engine(model_1024):
    eng = Engine(model_1024)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for t in range(16):  # positions 0..15: inside max_seq_len 16
            eng.step(t)
        assert not [x for x in w if issubclass(x.category, PastMaxSeqLenWarning)]
        for t in range(20):
            eng.step(t)
        eng.reset()
        list(eng.generate([1, 2, 3], 20))
    past = [x for x in w if issubclass(x.category, PastMaxSeqLenWarning)]
    assert len(past) == 1
    msg = str(past[0].message)
    assert "max_seq_len=16" in msg and "SSM" in msg and "ring buffers of 8 positions" in msg
    assert "attention (window" not in msg  # window 8 <= 16: attention sees what it saw in training
    with pytest.warns(PastMaxSeqLenWarning):  # a new Engine warns again
        list(Engine(model_1024).generate([1], 17))


def test_attention_only_models_within_their_window_do_not_warn(tmp_path):
    cfg = SMALL.replace(attn_layers=(0, 1, 2), max_seq_len=8)  # window 8: every position sees <= 8 keys
    eng = Engine(random_model(cfg, tmp_path / "a.tern", seed=0, progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PastMaxSeqLenWarning)
        list(eng.generate([1], 20))
    cfg = cfg.replace(max_seq_len=4)  # window 8 > 4: attention sees more than in training
    eng = Engine(random_model(cfg, tmp_path / "b.tern", seed=0, progress=False))
    with pytest.warns(PastMaxSeqLenWarning, match=r"attention \(window 8 > max_seq_len\)"):
        list(eng.generate([1], 6))


def test_generate_says_in_one_line_when_it_passes_max_seq_len(model_1024, capsys):
    assert cli.main(["generate", "--model", str(model_1024), "-n", "20", "--json"]) == 0
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "max_seq_len" in ln]
    assert len(notes) == 1 and notes[0].startswith("[tern generate] note: 1 prompt + 20 generated")
    assert "Warning" not in err
    assert cli.main(["generate", "--model", str(model_1024), "-n", "5", "--json"]) == 0
    assert "max_seq_len" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [(["--seed", "-1"], "--seed"), (["-n", "-2"], "-n"),
                                        (["--threads", "0"], "--threads")])
def test_generate_names_the_flag_of_a_bad_value(model_1024, capsys, argv, flag):
    assert cli.main(["generate", "--model", str(model_1024), *argv]) == 2
    assert_one_line_error(capsys.readouterr().err, "tern generate: error:", f"{flag} must be")


def test_export_random_names_the_seed_flag(tmp_path, capsys):
    assert cli.main(["export", "--random", "sandbox", str(tmp_path / "x.tern"), "--seed", "-1"]) == 2
    assert_one_line_error(capsys.readouterr().err, "tern export: error:", "--seed must be")


def test_a_prompt_that_is_not_utf8_is_a_clean_error(model_1024, capsys):
    bad = b"Once \xff\xfe upon".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
    assert cli.main(["generate", "--model", str(model_1024), "--prompt", bad, "-n", "2"]) == 2
    assert_one_line_error(capsys.readouterr().err, "--prompt is not valid UTF-8", "0xff")
    assert cli.main(["generate", "--model", str(model_1024), "--prompt", "naïve ✓", "-n", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["generated_tokens"] == 2


@pytest.mark.skipif(os.name != "posix", reason="raw argv bytes")
def test_a_prompt_that_is_not_utf8_from_a_real_command_line(model_1024):
    r = subprocess.run([sys.executable, "-m", "tern.cli", "generate", "--model", os.fsencode(str(model_1024)),
                        "--prompt", b"caf\xe9", "-n", "2"], capture_output=True, timeout=300,
                       env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert r.returncode == 2, r.stderr
    err = r.stderr.decode("utf-8", "replace")
    assert_one_line_error(err, "tern generate: error: --prompt is not valid UTF-8", "0xe9")


@pytest.mark.parametrize("where, what", [("dir", "is a directory, not a file"),
                                          ("/dev/null", "is not a regular file"),
                                          ("missing", "does not exist")])
def test_a_model_that_is_not_a_file_says_what_it_is(tmp_path, capsys, where, what):
    p = {"dir": tmp_path, "missing": tmp_path / "nope.tern"}.get(where, where)
    if where == "/dev/null" and not os.path.exists(where):
        pytest.skip("no /dev/null")
    for argv in (["generate", "--model", str(p), "-n", "1"], ["export", "--validate", str(p)]):
        assert cli.main(argv) == 2
        assert_one_line_error(capsys.readouterr().err, f"packed model {p} {what}")

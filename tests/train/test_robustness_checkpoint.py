"""Robustness of `tern train` / checkpoints: zero budgets are errors, every tensor of a
checkpoint is checksummed and verified on load, stale temp files of killed writes go."""

from __future__ import annotations

import argparse
import os
import struct
import time
import warnings

import pytest
import torch
from conftest import TRAIN_TINY, assert_one_line_error

from tern import cli
from tern.core.records import STALE_TEMP_S
from tern.train.checkpoint import (
    READABLE_VERSIONS,
    VERSION,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from tern.train.cli import DEFAULT_MINUTES, cli_configure, configs_from_args
from tern.train.config import TrainConfig
from tern.train.launch import preset_configs
from tern.train.model.lm import build_model

# the corpus tokenizer's vocabulary, so `tern train --resume` can build its data source
TINY_1024 = TRAIN_TINY.replace(name="tiny1024", vocab_size=1024)


def _parse(argv):
    p = argparse.ArgumentParser()
    cli_configure(p)
    return p.parse_args(argv)



# ---- 1: zero budgets --------------------------------------------------------------------------


@pytest.mark.parametrize("argv, flag", [
    (["--steps", "0"], "--steps"), (["--minutes", "0"], "--minutes"), (["--minutes", "-1"], "--minutes"),
    (["--minutes", "nan"], "--minutes"), (["--steps", "-3"], "--steps"), (["--seed", "-1"], "--seed"),
    (["--batch-size", "0"], "--batch-size"), (["--seq-len", "0"], "--seq-len"), (["--lr", "0"], "--lr"),
    (["--threads", "-1"], "--threads"), (["--eval-every", "-1"], "--eval-every"),
])
def test_zero_or_negative_flags_are_errors_naming_the_flag(argv, flag, capsys):
    with pytest.raises(ValueError, match=f"^{flag} must be"):
        configs_from_args(_parse(argv))
    assert cli.main(["train", *argv, "--no-progress"]) == 2
    assert_one_line_error(capsys.readouterr().err, "tern train: error:", flag)


def test_budgets_given_or_defaulted():
    assert configs_from_args(_parse(["--steps", "1"]))[1].steps == 1
    assert configs_from_args(_parse(["--minutes", "0.5"]))[1].minutes == 0.5
    t = configs_from_args(_parse([]))[1]
    assert t.minutes == DEFAULT_MINUTES and t.steps == 0
    # a budget given through --train-set replaces the default instead of clashing with it
    t = configs_from_args(_parse(["--train-set", "steps=4"]))[1]
    assert t.steps == 4 and t.minutes == 0
    with pytest.raises(ValueError, match="exactly one budget"):  # zero there is no budget either
        configs_from_args(_parse(["--train-set", "steps=0"]))


def test_preset_configs_zero_is_never_the_default():
    with pytest.raises(ValueError, match="budget"):
        preset_configs("sandbox", minutes=0)
    with pytest.raises(ValueError, match="budget"):
        preset_configs("sandbox", steps=0)
    _, t = preset_configs("sandbox", steps=5)
    assert t.steps == 5 and t.minutes == 0
    _, t = preset_configs("sandbox", smoke=True, steps=2)
    assert t.steps == 2 and t.minutes == 0


# ---- 2: checksums -----------------------------------------------------------------------------


def _save(path, cfg=TRAIN_TINY, with_optimizer=True):
    model = build_model(cfg, seed=0)
    opt = None
    if with_optimizer:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
        opt.step()
    st = {"step": 3, "train_tokens": 96, "train_s": 0.5, "wall_s": 0.6, "loss_window": [4.1, 4.0],
          "evals": [], "rng_cpu": torch.get_rng_state(), "rng_cuda": None}
    return save_checkpoint(path, model, cfg, TrainConfig(steps=3, batch_size=4, seq_len=32), st, opt)


def _flip_bit(path, tensor, element=0, bit=30):
    """Flip ``bit`` of element ``element`` of float32 ``tensor`` in a checkpoint file (bit 30:
    the top exponent bit). torch stores tensor data uncompressed: find its bytes in the file."""
    t = torch.load(path, weights_only=True)
    for part in tensor.split("/"):
        t = t[int(part)] if isinstance(t, (list, tuple)) or part.isdigit() and int(part) in t else t[part]
    data = t.contiguous().numpy().tobytes()
    raw = bytearray(path.read_bytes())
    at = raw.find(data)
    assert at > 0 and raw.find(data, at + 1) < 0, "tensor bytes not found once in the file"
    (word,) = struct.unpack_from("<I", raw, at + 4 * element)
    struct.pack_into("<I", raw, at + 4 * element, word ^ (1 << bit))
    path.write_bytes(bytes(raw))


def test_checkpoints_store_and_verify_a_checksum_per_tensor(tmp_path):
    path = _save(tmp_path / "checkpoint.pt")
    blob = read_checkpoint(path)
    assert blob["version"] == VERSION == 2 and READABLE_VERSIONS == (1, 2)
    sums = blob["checksums"]["tensors"]
    assert {f"model/{k}" for k in blob["model"]} <= set(sums)
    assert "state/rng_cpu" in sums and any(k.startswith("optimizer/state/") for k in sums)
    assert all(len(v) == 8 for v in sums.values()) and len(blob["checksums"]["values"]) == 8


@pytest.mark.parametrize("tensor", ["model/embed.weight", "optimizer/state/0/exp_avg_sq"])
def test_a_flipped_bit_is_caught_on_every_load(tmp_path, tensor):
    path = _save(tmp_path / "checkpoint.pt")
    _flip_bit(path, tensor)
    msg = f"checkpoint {path}: tensor {tensor} is corrupted"
    with pytest.raises(ValueError, match=msg.replace(".", r"\.")):
        read_checkpoint(path)
    with pytest.raises(ValueError, match="is corrupted"):
        load_checkpoint(path)


def test_tern_export_and_train_resume_exit_2_on_a_corrupted_checkpoint(tmp_path, capsys):
    path = _save(tmp_path / "run" / "checkpoint.pt", cfg=TINY_1024)
    _flip_bit(path, "model/embed.weight")
    assert cli.main(["export", str(path), str(tmp_path / "out.tern")]) == 2
    assert_one_line_error(capsys.readouterr().err, "tern export: error:", str(path), "embed.weight", "corrupted")
    assert not (tmp_path / "out.tern").exists()
    cfg_json = tmp_path / "tiny.json"
    cfg_json.write_text(TINY_1024.to_json(), encoding="utf-8")
    stale = tmp_path / "run2" / ".checkpoint.pt.k2j4x9_a.tmp"  # left by a killed earlier run
    stale.parent.mkdir()
    stale.write_bytes(b"\0" * 100)
    os.utime(stale, (time.time() - STALE_TEMP_S - 1,) * 2)
    assert cli.main(["train", "--preset", str(cfg_json), "--steps", "3", "--batch-size", "4", "--seq-len",
                     "32", "--resume", str(path), "--out", str(tmp_path / "run2"), "--no-progress"]) == 2
    assert_one_line_error(capsys.readouterr().err, "tern train: error:", str(path), "embed.weight", "corrupted")
    assert not stale.exists()  # `tern train` removes stale temps in --out when it starts


def test_corrupted_values_and_checksums_are_caught(tmp_path):
    path = _save(tmp_path / "c.pt")
    blob = torch.load(path, weights_only=True)
    for change, match in (
        ({"state": {**blob["state"], "step": 4}}, "configs / counters"),  # a counter changed
        ({"checksums": None}, "checksums missing"),
        ({"checksums": {**blob["checksums"], "tensors": {}}}, "has no stored checksum"),
        ({"state": {k: v for k, v in blob["state"].items() if k != "rng_cpu"}}, "state/rng_cpu is missing"),
    ):
        p = tmp_path / "x.pt"
        torch.save({**blob, **change}, p)
        with pytest.raises(ValueError, match=match):
            read_checkpoint(p)


def test_version_1_checkpoints_load_with_a_warning(tmp_path):
    path = _save(tmp_path / "c.pt", with_optimizer=False)
    blob = torch.load(path, weights_only=True)
    old = {k: v for k, v in blob.items() if k != "checksums"} | {"version": 1}
    torch.save(old, tmp_path / "v1.pt")
    with pytest.warns(UserWarning, match=r"v1\.pt was written by an older tern .*no checksums"):
        model, cfg, _, state = load_checkpoint(tmp_path / "v1.pt")
    assert cfg == TRAIN_TINY and state["step"] == 3
    torch.save({**old, "version": True}, tmp_path / "vb.pt")
    with pytest.raises(ValueError, match="version True"):
        read_checkpoint(tmp_path / "vb.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_checkpoint(path)  # a version-2 checkpoint loads without a warning


@pytest.mark.parametrize("where, what", [("dir", "is a directory"), ("/dev/null", "not a regular file"),
                                          ("missing", "does not exist")])
def test_a_checkpoint_that_is_not_a_file_says_what_it_is(tmp_path, where, what):
    p = {"dir": tmp_path, "missing": tmp_path / "nope.pt"}.get(where, where)
    if where == "/dev/null" and not os.path.exists(where):
        pytest.skip("no /dev/null")
    with pytest.raises(ValueError, match=what):
        read_checkpoint(p)


# ---- 3: stale temps of a killed checkpoint write ----------------------------------------------


def test_the_next_checkpoint_save_removes_stale_temps(tmp_path):
    old_style = tmp_path / ".checkpoint.pt.k2j4x9_a.tmp"  # an interrupted write by an older tern
    dead = tmp_path / ".checkpoint.pt.tern-00000000-1.abcdefgh.tmp"  # another host's, long untouched
    recent = tmp_path / ".checkpoint.pt.zz99zz99.tmp"  # maybe a live writer of an older tern: kept
    for f in (old_style, dead, recent):
        f.write_bytes(b"\0" * 1000)
    stale = time.time() - STALE_TEMP_S - 1
    for f in (old_style, dead):
        os.utime(f, (stale, stale))
    _save(tmp_path / "checkpoint.pt", with_optimizer=False)
    assert not old_style.exists() and not dead.exists() and recent.exists()
    assert (tmp_path / "checkpoint.pt").is_file()

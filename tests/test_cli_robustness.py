"""Property-based tests of the command line (hypothesis): random argument values and damaged
files give exit 0 with a valid result, or exit 1/2 with a one-line error and no traceback.
Commands run in-process (tern.cli.main) for speed; one runs in a subprocess."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import SMALL
from hypothesis import given, settings
from hypothesis import strategies as st

from tern import cli
from tern.packed.writer import random_model

SETTINGS = settings(max_examples=50, deadline=None, database=None)
FLOATS = st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0, 1e-3, 1e6, math.nan, math.inf, -math.inf])
PROMPTS = st.one_of(st.text(max_size=12),
                    st.binary(max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape")))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tern ARGV` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse: usage + one error line, exit 2
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def assert_clean(rc: int, err: str, command: str) -> None:
    """A failure is exit 1 or 2 with exactly one `tern <command>: error:` line, no traceback."""
    assert "Traceback" not in err, err
    if rc != 0:
        assert rc in (1, 2), (rc, err)
        errors = [ln for ln in err.splitlines() if "error:" in ln]
        assert len(errors) == 1 and errors[0].startswith(f"tern {command}: error:"), err


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return random_model(SMALL.replace(vocab_size=1024, max_seq_len=8), tmp_path_factory.mktemp("cli") / "m.tern",
                        seed=4, tokenizer="bpe1024", progress=False)


@SETTINGS
@given(n=st.integers(-3, 4), seed=st.integers(-3, 3), threads=st.integers(-1, 3), temperature=FLOATS,
       top_k=st.integers(-2, 50), top_p=FLOATS, penalty=FLOATS, prompt=PROMPTS)
def test_generate_with_random_arguments(model, n, seed, threads, temperature, top_k, top_p, penalty, prompt):
    argv = ["generate", "--model", str(model), f"-n={n}", f"--seed={seed}", f"--threads={threads}",
            f"--temperature={temperature}", f"--top-k={top_k}", f"--top-p={top_p}",
            f"--repetition-penalty={penalty}", f"--prompt={prompt}", "--json"]
    rc, out, err = run_cli(argv)
    assert_clean(rc, err, "generate")
    if rc == 0:
        assert json.loads(out)["generated_tokens"] == n
    elif n < 0 or seed < 0 or threads < 1:
        assert rc == 2 and any(f in err for f in ("-n must", "--seed must", "--threads must"))


@SETTINGS
@given(steps=st.one_of(st.none(), st.integers(-2, 3)), minutes=st.one_of(st.none(), FLOATS),
       seed=st.integers(-2, 2), batch=st.one_of(st.none(), st.integers(-1, 2)),
       lr=st.one_of(st.none(), FLOATS))
def test_train_arguments_are_used_or_refused_naming_the_flag(steps, minutes, seed, batch, lr):
    """Zero is never 'not given': a given budget is the budget, or an error naming its flag."""
    import argparse

    from tern.train.cli import DEFAULT_MINUTES, cli_configure, configs_from_args

    given = {"--steps": steps, "--minutes": minutes, "--seed": seed, "--batch-size": batch, "--lr": lr}
    argv = [f"{flag}={v}" for flag, v in given.items() if v is not None]  # = form: "-inf" is a value
    p = argparse.ArgumentParser(exit_on_error=False)
    cli_configure(p)
    try:
        args = p.parse_args(argv)
    except (argparse.ArgumentError, SystemExit):
        assert steps is not None and minutes is not None  # --steps and --minutes exclude each other
        return
    try:
        _, tc = configs_from_args(args)
    except ValueError as e:
        assert str(e).startswith(("--steps", "--minutes", "--seed", "--batch-size", "--lr")), e
        return
    assert tc.seed == seed
    if steps is not None:
        assert steps >= 1 and tc.steps == steps and tc.minutes == 0
    elif minutes is not None:
        assert minutes > 0 and tc.minutes == minutes and tc.steps == 0
    else:
        assert tc.minutes == DEFAULT_MINUTES


@SETTINGS
@given(data=st.data())
def test_validate_damaged_files(model, tmp_path_factory, data):
    raw = model.read_bytes()
    cut = data.draw(st.integers(0, len(raw)), label="length")
    flip = data.draw(st.one_of(st.none(), st.integers(0, max(cut - 1, 0))), label="flip")
    buf = bytearray(raw[:cut])
    if flip is not None and buf:
        buf[flip] ^= 0x10
    path = tmp_path_factory.getbasetemp() / "damaged.tern"
    path.write_bytes(bytes(buf))
    check = data.draw(st.sampled_from(["full", "header"]), label="check")
    rc, out, err = run_cli(["export", "--validate", str(path), "--check", check, "--json"])
    assert_clean(rc, err, "export")
    changed = cut < len(raw) or flip is not None
    if check == "full":
        assert (rc == 2) == changed and (rc == 2 or json.loads(out)["not_verified"] == [])
    if rc == 2:
        assert str(path) in err


@SETTINGS
@given(content=st.one_of(st.binary(max_size=64), st.text(max_size=30).map(str.encode),
                         st.sampled_from([b"{}", b"[]", b"null", b'{"format": "tern.host_profile"}'])),
       threads=st.integers(-1, 2))
def test_predict_with_a_random_host_file(tmp_path_factory, content, threads):
    path = tmp_path_factory.getbasetemp() / "host.json"
    path.write_bytes(content)
    rc, _, err = run_cli(["predict", "--host", str(path), "--threads", str(threads), "--json"])
    assert_clean(rc, err, "predict")
    assert rc == 2 and (str(path) in err or "--threads" in err)


def test_predict_host_that_is_a_directory_or_binary(tmp_path):
    rc, _, err = run_cli(["predict", "--host", str(tmp_path)])
    assert rc == 2 and f"host profile {tmp_path} is a directory" in err
    (tmp_path / "b.bin").write_bytes(bytes(range(128, 256)))
    rc, _, err = run_cli(["predict", "--host", str(tmp_path / "b.bin")])
    assert rc == 2 and f"host profile {tmp_path / 'b.bin'} is not a text file" in err
    assert_clean(rc, err, "predict")


def test_a_truncated_model_in_a_real_process(model, tmp_path):
    bad = tmp_path / "cut.tern"
    bad.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    r = subprocess.run([sys.executable, "-m", "tern.cli", "generate", "--model", str(bad), "-n", "2"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"tern generate: error: {bad}: truncated file: " + r.stderr.split("truncated file: ", 1)[1].strip()]


def test_bench_hosts_save_with_a_missing_or_damaged_repeat_sweep(tmp_path):
    """--repeat-rows that is missing, not JSONL or holds no sweep point: a one-line error and
    nothing committed under --root."""
    from tern.measure.hosts import hosts_root

    src = hosts_root() / "amd-epyc-zen4-s20"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "sweep_point"\n')
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"kind": "calibration"}\n')
    for rows, needle in ((tmp_path / "missing.jsonl", "no such file"), (bad, "bad.jsonl"),
                         (empty, "no sweep_point rows")):
        rc, _, err = run_cli(["bench", "hosts", "--root", str(tmp_path / "hosts"), "--save", "h",
                              "--profile", str(src / "host_profile.json"), "--rows", str(src / "sweep.jsonl"),
                              "--repeat-rows", str(rows)])
        assert rc in (1, 2) and needle in err, err
        assert_clean(rc, err, "bench")
        assert not (tmp_path / "hosts" / "h").exists()


def test_a_refusal_of_the_system_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """An OSError a command meets (no space left, permission denied, a read-only folder) is
    reported as one error line with exit 2, as bad input is."""
    import errno

    from tern.train import cli as train_cli

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "x.tern needs 3.8 MB and the disk has 0.0 MB free")

    monkeypatch.setattr(train_cli, "random_model", full)
    rc, out, err = run_cli(["export", "--random", "sandbox", str(tmp_path / "x.tern")])
    assert rc == 2 and out == ""
    assert err.strip() == "tern export: error: [Errno 28] x.tern needs 3.8 MB and the disk has 0.0 MB free"

"""benchmarks/skip_prefetch.py: each TERN_SKIP_PREFETCH setting runs the real skip kernel in its
own process (its own numba cache), one JSONL row per setting; bad settings / shapes are a clear
error."""

import json

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def sp():
    load_benchmark("curve_stability")  # its shape parser, imported by the script
    return load_benchmark("skip_prefetch")


def test_bad_arguments_exit_with_a_message(sp, capsys):
    assert sp.main(["--settings", "4,l3"]) == 2
    assert "TERN_SKIP_PREFETCH must be" in capsys.readouterr().err
    assert sp.main(["--rounds", "0"]) == 2
    with pytest.raises(SystemExit) as e:
        sp.main(["--shape", "12x5"])
    assert e.value.code == 2


def test_one_row_per_setting_from_its_own_process(sp, tmp_path, capsys):
    assert sp.main(["--settings", "2,l1", "--shape", "256x512", "--ws-mib", "4", "--rounds", "2",
                    "--results", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "bench" / "skip_prefetch.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["setting"] == "2,l1" and rows[0]["shape"] == [256, 512]
    assert len(rows[0]["seconds_per_call"]) == 2 and rows[0]["gbps_rows_read"]["median"] > 0
    assert rows[0]["speedup_vs_first"] == 1.0 and rows[0]["threads"] == 1 and "git_commit" in rows[0]
    assert (tmp_path / "numba-cache-skip-2-l1").is_dir()  # the setting's own compiled kernels
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["setting"] == "2,l1"

"""The tern command line: help, --json contract, clean errors."""

import json
import subprocess
import sys

from tern import cli


def run(*args):
    return subprocess.run([sys.executable, "-m", "tern.cli", *args], capture_output=True, text=True)


def test_help_lists_commands():
    r = run("--help")
    assert r.returncode == 0
    for name in cli.COMMANDS:
        assert name in r.stdout


def test_every_command_has_help():
    for name in cli.COMMANDS:
        r = run(name, "--help")
        assert r.returncode == 0, (name, r.stderr)
        assert "--json" in r.stdout


def test_presets_json_is_one_object():
    r = run("presets", "--json", "sandbox")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["presets"]["sandbox"]["counts"]["total_params"] > 8e6


def test_bad_input_is_a_clean_error(capsys):
    assert cli.main(["presets", "no-such-preset"]) == 2
    err = capsys.readouterr().err
    assert "error" in err and "no-such-preset" in err and "Traceback" not in err

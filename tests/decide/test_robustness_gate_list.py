"""`tern gate list` / `show` on a fresh clone read the shipped registry and say so."""

from __future__ import annotations

import json

import pytest

from tern import cli
from tern.decide import cli as gate_cli
from tern.decide.registry import list_gates, shipped_registry


@pytest.fixture
def local_registry(tmp_path, monkeypatch):
    """The results folder's registry, redirected to a temp path (missing at first)."""
    reg = tmp_path / "results" / "gates" / "registry.jsonl"
    monkeypatch.setattr(gate_cli, "default_registry", lambda: reg)
    return reg


@pytest.mark.skipif(not shipped_registry().exists(), reason="no shipped gates/registry.jsonl")
@pytest.mark.parametrize("state", ["missing", "empty"])
def test_list_falls_back_to_the_shipped_registry(local_registry, capsys, state):
    if state == "empty":
        local_registry.parent.mkdir(parents=True)
        local_registry.write_text("", encoding="utf-8")
    assert cli.main(["gate", "list", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["registry"] == str(shipped_registry()) and obj["registry_source"] == "shipped"
    assert obj["gates"] and len(obj["gates"]) == len(list_gates(shipped_registry()))
    assert cli.main(["gate", "list"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith(f"registry: {shipped_registry()}") and "shipped" in first
    assert obj["gates"][0]["gate"] in out
    name = obj["gates"][0]["gate"]
    assert cli.main(["gate", "show", name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["registry_source"] == "shipped"


def test_list_reads_the_local_registry_when_it_has_records(local_registry, capsys):
    if not shipped_registry().exists():
        pytest.skip("no shipped gates/registry.jsonl")
    local_registry.parent.mkdir(parents=True)
    # one gate's rows copied from the shipped registry stand in for a local run
    rows = [json.loads(x) for x in shipped_registry().read_text(encoding="utf-8").splitlines() if x.strip()]
    name = next(r["gate"] for r in rows if r.get("record") == "gate_verdict")
    local_registry.write_text("".join(json.dumps(r) + "\n" for r in rows if r.get("gate") == name),
                              encoding="utf-8")
    assert cli.main(["gate", "list", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["registry"] == str(local_registry) and obj["registry_source"] == "local"
    assert [g["gate"] for g in obj["gates"]] == [name]
    assert cli.main(["gate", "list", "--registry", str(local_registry), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["registry_source"] == "given"

"""The gate registry: append-only JSONL of runs and verdicts, and reading it back.

Appends are safe with many writers (worker processes on one machine or on a shared POSIX
file system that honours flock): :func:`append_row` takes an exclusive ``fcntl.flock`` on
``<registry>.lock`` beside the file, drops a torn tail left by a writer killed mid-line (it
held the lock, so it is gone), writes the whole line with one ``write()`` on an
``O_APPEND`` descriptor and fsyncs before releasing the lock. A killed run leaves no row,
so resume (runs keyed by gate hash, arm, seed and config hash) simply trains it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from tern.core.config import ModelConfig
from tern.core.records import read_jsonl
from tern.decide.power import DEFAULT_POWER, mde
from tern.decide.spec import content_hash

REGISTRY_SCHEMA = 1


def default_registry() -> Path:
    from tern.core.paths import results_dir

    return results_dir("results") / "gates" / "registry.jsonl"


def _jsonable(x: Any) -> Any:
    """Plain JSON types from numpy scalars/arrays, tuples and dataclasses."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _jsonable(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy arrays and scalars, torch tensors
        return _jsonable(x.tolist())
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def config_hash(model_cfg: ModelConfig, train_cfg: Any, distill: dict | None = None) -> str:
    """SHA-256 of a run's resolved configs (what resume compares besides the gate hash)."""
    return content_hash({"model": model_cfg.to_dict(), "train": _jsonable(train_cfg),
                         "distill": distill})


def lock_path(registry: str | Path) -> Path:
    p = Path(registry)
    return p.with_name(p.name + ".lock")


@contextlib.contextmanager
def registry_lock(registry: str | Path):
    """Exclusive flock on the registry's lock file for the block (no-op where fcntl is
    missing, e.g. Windows: one writer at a time there)."""
    lp = lock_path(registry)
    lp.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(lp, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def append_row(registry: str | Path, row: dict[str, Any]) -> None:
    """Append one record as one full line, under the registry lock (module docstring)."""
    data = (json.dumps(row, sort_keys=True, allow_nan=True) + "\n").encode("utf-8")
    path = Path(registry)
    with registry_lock(path):
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _drop_torn_tail(fd)
            view = memoryview(data)
            while view:  # one write() for a regular file; the loop only guards a short write
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)


def _drop_torn_tail(fd: int) -> None:
    """Truncate a last line without its newline (a writer killed mid-line)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    pos, chunk = size, 65536
    while pos > 0:
        start = max(0, pos - chunk)
        nl = os.pread(fd, pos - start, start).rfind(b"\n")
        if nl >= 0:
            os.ftruncate(fd, start + nl + 1)
            return
        pos = start
    os.ftruncate(fd, 0)


def read_registry(path: str | Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(path) if r.get("record") in ("gate_run", "gate_verdict")]


def finished_runs(rows: list[dict[str, Any]], gate_hash: str) -> dict[tuple[str, int, str], dict]:
    """(arm, seed, config_hash) -> the latest gate_run row of this gate hash."""
    out = {}
    for r in rows:
        if r.get("record") == "gate_run" and r.get("gate_hash") == gate_hash:
            out[(r["arm"], r["seed"], r["config_hash"])] = r
    return out


def latest_verdicts(rows: list[dict[str, Any]]) -> dict[str, dict]:
    """The latest verdict record of each gate name (file order: later rows win)."""
    out: dict[str, dict] = {}
    for r in rows:
        if r.get("record") == "gate_verdict":
            out[r["gate"]] = r
    return out


def gate_runs(rows: list[dict[str, Any]], gate_hash: str) -> list[dict[str, Any]]:
    """The run rows of one gate hash, latest per (arm, seed, config_hash)."""
    return list(finished_runs(rows, gate_hash).values())


def list_gates(registry: str | Path) -> list[dict[str, Any]]:
    """One summary row per gate name: its latest verdict, or the run progress of a gate
    that has runs but no verdict yet (interrupted)."""
    rows = read_registry(registry)
    verdicts = latest_verdicts(rows)
    out = []
    for name, v in verdicts.items():
        out.append({"gate": name, "gate_hash": v["gate_hash"], "verdict": v["verdict"],
                    "rule": v["rule"]["text"], "metric": v["metric"],
                    "runs_done": sum(a["n"] for a in v["arms"].values()),
                    "runs_total": len(v["content"]["seeds"]) * len(v["content"]["arms"]),
                    "timestamp": v["run_metadata"]["timestamp"],
                    "comparisons": [{**{k: c[k] for k in ("b", "a", "n", "mean_delta", "se_delta", "z",
                                                          "verdict")}, "mde": comparison_mde(v, c)}
                                    for c in v["comparisons"]]})
    pending: dict[str, dict] = {}
    for r in rows:
        if r.get("record") == "gate_run" and r["gate"] not in verdicts and r["role"] == "arm":
            p = pending.setdefault(r["gate"], {"gate": r["gate"], "gate_hash": r["gate_hash"],
                                               "verdict": "running", "rule": "", "metric": "",
                                               "runs": set(), "runs_total": None, "comparisons": [],
                                               "timestamp": r["run_metadata"]["timestamp"]})
            p["runs"].add((r["arm"], r["seed"]))
    for p in pending.values():
        p["runs_done"] = len(p.pop("runs"))
        out.append(p)
    return out


def show_gate(registry: str | Path, name: str) -> dict[str, Any]:
    """The latest verdict of gate ``name`` and its run rows (or its runs so far)."""
    rows = read_registry(registry)
    v = latest_verdicts(rows).get(name)
    if v is not None:
        h = v["gate_hash"]
    else:
        hashes = [r["gate_hash"] for r in rows if r.get("record") == "gate_run" and r["gate"] == name]
        if not hashes:
            known = sorted({r["gate"] for r in rows})
            raise ValueError(f"no gate named {name!r} in {registry}; gates there: {known}")
        h = hashes[-1]
    return {"gate": name, "gate_hash": h, "verdict": v, "runs": gate_runs(rows, h)}


def shipped_gates() -> list[Path]:
    """The gate files shipped in ``gates/`` (the checkout's, else the installed package
    data's: tern.core.paths.shipped_dir), in order."""
    from tern.core.paths import shipped_dir

    d = shipped_dir("gates")
    files = sorted(d.glob("*.toml"))
    if not files:
        raise ValueError(f"no gate files in {d}")
    return files


def shipped_registry() -> Path:
    """``gates/registry.jsonl`` as shipped (the checkout's, else the installed package
    data's): the records of the shipped gates as run on the machine named in each record (a
    copy of a finished run's registry, committed). The path may not exist."""
    from tern.core.paths import shipped_candidates

    places = [p for p in shipped_candidates("gates") if p.is_dir()] or shipped_candidates("gates")
    return places[0] / "registry.jsonl"


def registry_to_show(results_registry: str | Path, ran_here: bool) -> Path:
    """The registry a notebook shows: the results folder's when gates ran here or it
    holds records, else the shipped one (when present)."""
    own = Path(results_registry)
    if ran_here or (own.exists() and own.stat().st_size > 0):
        return own
    shipped = shipped_registry()
    return shipped if shipped.exists() else own


def gate_headlines(registry: str | Path) -> dict[str, Any]:
    """Headline figures of every gate's latest verdict: the verdict, and per comparison
    the mean Δ and its standard error (keys carry the metric, e.g. ``_delta_val_bpb``)."""
    out: dict[str, Any] = {}
    for name, v in latest_verdicts(read_registry(registry)).items():
        out[f"{name}_verdict"] = v["verdict"]
        for c in v["comparisons"]:
            key = f"{name}_{c['b']}_vs_{c['a']}"
            out[f"{key}_delta_{v['metric']}"] = c["mean_delta"]
            out[f"{key}_se_{v['metric']}"] = c["se_delta"]
    return out


def registry_report(registry: str | Path) -> str:
    """The verdict table followed by every gate's verdict in full (text)."""
    gates = list_gates(registry)
    if not gates:
        return f"no gates in {registry}"
    parts = [format_table(gates)]
    for g in gates:
        v = show_gate(registry, g["gate"])
        parts.append(format_verdict(v["verdict"]) if v["verdict"] else
                     f"gate {g['gate']}: no verdict yet, {len(v['runs'])} run(s) finished")
    return "\n\n".join(parts)


def comparison_mde(v: dict[str, Any], c: dict[str, Any]) -> float:
    """The MDE of comparison ``c`` of verdict ``v`` (tern.decide.power): as recorded, or from
    its standard error and the rule's k for records written before MDEs were recorded."""
    if c.get("mde") is not None:
        return c["mde"]
    return mde(v["rule"]["k_sigma"], c["se_delta"], c.get("power", DEFAULT_POWER))


def _fmt(x: float, spec: str) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_table(gates: list[dict[str, Any]]) -> str:
    """Verdict table: one line per comparison of each gate."""
    lines = [f"{'gate':<22} {'hash':<12} {'B vs A':<24} {'n':>2} {'mean Δ':>9} {'± se':>8} "
             f"{'z':>6} {'MDE':>8} {'verdict':<12} rule"]
    for g in gates:
        comps = g["comparisons"] or [{"b": "", "a": "", "n": 0, "mean_delta": math.nan,
                                      "se_delta": math.nan, "z": math.nan, "verdict": g["verdict"]}]
        for i, c in enumerate(comps):
            vs = f"{c['b']} vs {c['a']}" if c["b"] else f"({g['runs_done']} runs)"
            lines.append(f"{g['gate'] if i == 0 else '':<22} {g['gate_hash'][:12] if i == 0 else '':<12} "
                         f"{vs:<24} {c['n']:>2} {_fmt(c['mean_delta'], '+.5f'):>9} "
                         f"{_fmt(c['se_delta'], '.5f'):>8} {_fmt(c['z'], '+.2f'):>6} "
                         f"{_fmt(c.get('mde', math.nan), '.5f'):>8} "
                         f"{c['verdict']:<12} {g['rule'] if i == 0 else ''}")
        if len(comps) > 1:
            lines.append(f"{'':<22} {'':<12} {'gate verdict':<24} {'':>2} {'':>9} {'':>8} {'':>6} "
                         f"{'':>8} {g['verdict']}")
    lines.append("(Δ = B − A of the gate's metric, per seed paired; se: standard error; "
                 "z = mean/se; MDE: the smallest distance from the rule's threshold detected with "
                 f"power {DEFAULT_POWER:g}, (k + z_p) se — an inconclusive verdict does not exclude "
                 "smaller effects; val_bpb in bits/byte)")
    return "\n".join(lines)


def format_verdict(v: dict[str, Any]) -> str:
    c = v["content"]
    out = [f"gate {v['gate']}  [{v['gate_hash'][:12]}]  verdict: {v['verdict'].upper()}",
           f"question: {v['question']}", f"rule: {v['rule']['text']}  (metric {v['metric']}, "
           f"seeds {c['seeds']}, budget {c['budget']})", "pre-registration:",
           *("  " + line for line in c["preregistration"].strip().splitlines()), "arms:"]
    for name, a in v["arms"].items():
        rec = ", ".join(f"{k} {x:.4g}" for k, x in a["recorded"].items())
        out.append(f"  {name:<10} {v['metric']} {_fmt(a['mean'], '.5f')} ± {_fmt(a['se'], '.5f')} "
                   f"(n={a['n']}; total {a['total_params'] / 1e6:.2f}M, active "
                   f"{a['active_params'] / 1e6:.2f}M params){'; ' + rec if rec else ''}")
    out.append("comparisons:")
    for cmp in v["comparisons"]:
        seeds = "  ".join(f"s{p['seed']}: {p['delta']:+.5f}" for p in cmp["per_seed"])
        m = comparison_mde(v, cmp)
        out.append(f"  {cmp['b']} vs {cmp['a']}: Δ {_fmt(cmp['mean_delta'], '+.5f')} ± "
                   f"{_fmt(cmp['se_delta'], '.5f')} (z {_fmt(cmp['z'], '+.2f')}, n={cmp['n']}, "
                   f"MDE {_fmt(m, '.5f')}) -> {cmp['verdict']} ({cmp['reason']})")
        if cmp["verdict"] == "inconclusive":
            out.append(f"    inconclusive is not 'no effect': at n={cmp['n']} only a true Δ at least "
                       f"{_fmt(m, '.5f')} from the threshold is detected with power "
                       f"{cmp.get('power', DEFAULT_POWER):g}"
                       + (f"; {cmp['seeds_needed']} seeds would detect "
                          f"{cmp['target_effect']:.4f} ({cmp['target_basis']})"
                          if cmp.get("seeds_needed") else ""))
        out.append(f"    per seed Δ: {seeds}")
    return "\n".join(out)

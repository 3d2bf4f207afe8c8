"""Committed hosts: each host the kit was measured on, kept as a small data folder so that
every later change to the prediction model is checked against hosts you are not on.

``benchmarks/hosts/<label>/`` holds

* ``host_profile.json`` — the probe's profile of that host (tern.probe);
* ``sweep.jsonl`` — its fresh decode measurements (tern.measure.sweep rows: the full
  ModelConfig, threads, measured tok/s and its spread), measured with nothing reused;
* ``host.json`` — what the host was: CPU, numba target (``NUMBA_CPU_NAME`` /
  ``NUMBA_CPU_FEATURES``), date, commit, a note.

:func:`repredict` predicts every row again from the committed profile alone (no
calibration), and :func:`accuracy_report` gives the figures the prediction issue targets:
the share within +-20 %, the median |measured / predicted - 1|, by region (cache-resident,
cache edge, DRAM-bound: the model's hot working set against the last cache tier the
measured read curve shows) and the worst points.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tern.core.config import ModelConfig
from tern.core.host_profile import HostProfile
from tern.core.host_queries import effective_llc_bytes
from tern.core.paths import repo_root
from tern.core.records import atomic_write_json, atomic_write_text, read_jsonl, run_metadata
from tern.kernels.policy import EnginePolicy
from tern.predict.pools import decoded_context
from tern.predict.roofline import predict
from tern.probe.placement import far_apart

TARGET_WITHIN = 0.20  # |measured / predicted - 1| of a point counted as "within"
REGIONS = ("cache-resident", "cache edge", "DRAM-bound")
ROW_KEYS = ("kind", "family", "budget", "name", "config", "threads", "tokens", "repeats", "warmup",
            "tok_per_s", "tok_per_s_min", "tok_per_s_max", "samples_tok_per_s", "hot_bytes", "active_bytes",
            "total_bytes", "peak_rss_bytes", "git_commit", "timestamp", "versions", "engine_policy",
            "min_time_s", "runs_per_sample", "read_same_run", "host_read_ratio", "kernel_same_run",
            "host_kernel_ratio", "core_round_trip_ns")
# the host's read rate or kernel speed timed beside a point differs from its probe's by more than this: "drifted"
DRIFT_TOLERANCE = 0.15
DRIFT_SHARE = 0.2  # ... at this share of the points or more: the verdict says the host drifted
DRIFT_KEYS = ("host_read_ratio", "host_kernel_ratio")  # now / at the probe, per row (tern.measure.sweep.host_now)


def hosts_root() -> Path | None:
    """``benchmarks/hosts`` of the checkout (the committed hosts live in the repository, not
    in a wheel: None for a site install)."""
    root = repo_root()
    return None if root is None else root / "benchmarks" / "hosts"


@dataclass(frozen=True)
class CommittedHost:
    label: str
    profile: HostProfile
    rows: tuple[dict[str, Any], ...]
    meta: dict[str, Any]
    # a second sweep of the same points with the same code and profile, later the same
    # session (sweep_repeat.jsonl, optional): the host's own run-to-run spread, the floor
    # under any prediction's accuracy there (:func:`repeatability`)
    repeat_rows: tuple[dict[str, Any], ...] = ()


def _sweep_points(rows: str | os.PathLike | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not isinstance(rows, list) and not Path(rows).is_file():
        raise ValueError(f"sweep rows {rows}: no such file")
    src = list(read_jsonl(rows)) if not isinstance(rows, list) else rows
    kept = [{k: r[k] for k in ROW_KEYS if k in r} for r in src if r.get("kind") == "sweep_point"]
    if not kept:
        raise ValueError(f"no sweep_point rows in {rows if not isinstance(rows, list) else 'the rows given'}")
    return kept


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def save_host(label: str, profile: str | os.PathLike, rows: str | os.PathLike | list[dict[str, Any]],
              root: str | os.PathLike | None = None, note: str = "",
              repeat_rows: str | os.PathLike | list[dict[str, Any]] | None = None) -> Path:
    """Commit a host: copy its profile, keep the measured sweep rows (the fields needed to
    predict them again, not the predictions), and record what the host was. ``repeat_rows``:
    a second sweep of the same points (sweep_repeat.jsonl: the host's run-to-run spread)."""
    if not label or any(c in label for c in "/\\ ") or label.startswith("."):
        raise ValueError(f"host label must be a plain folder name, got {label!r}")
    prof = HostProfile.load(profile)
    kept = _sweep_points(rows)
    repeat = _sweep_points(repeat_rows) if repeat_rows is not None else None
    out = Path(root) if root is not None else hosts_root()
    if out is None:
        raise ValueError("committing a host needs a tern checkout (benchmarks/hosts) or an explicit root")
    folder = out / label
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(profile, folder / "host_profile.json")
    _write_rows(folder / "sweep.jsonl", kept)
    if repeat is not None:
        _write_rows(folder / "sweep_repeat.jsonl", repeat)
    meta = run_metadata(1)
    meta.update({"label": label, "cpu": prof.host.get("cpu_model") or meta.get("cpu"), "note": note,
                 **{k: prof.host.get(k) for k in ("cpu_family", "cpu_model_number", "cpu_stepping")},
                 "numba_cpu_name": os.environ.get("NUMBA_CPU_NAME", ""),
                 "numba_cpu_features": os.environ.get("NUMBA_CPU_FEATURES", ""), "points": len(kept)})
    atomic_write_json(folder / "host.json", meta)
    return folder


def load_hosts(root: str | os.PathLike | None = None) -> list[CommittedHost]:
    """Every committed host under ``root`` (default :func:`hosts_root`), by label."""
    base = Path(root) if root is not None else hosts_root()
    if base is None:  # a site install carries no committed hosts
        return []
    out = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        prof_path, rows_path = folder / "host_profile.json", folder / "sweep.jsonl"
        if not (prof_path.exists() and rows_path.exists()):
            continue
        meta_path = folder / "host.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        repeat_path = folder / "sweep_repeat.jsonl"
        repeat = tuple(read_jsonl(repeat_path)) if repeat_path.exists() else ()
        out.append(CommittedHost(folder.name, HostProfile.load(prof_path), tuple(read_jsonl(rows_path)), meta,
                                 repeat))
    return out


def repeatability(rows: Sequence[dict[str, Any]], repeat_rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """How far a second sweep of the same points measured from the first (same code and
    profile): over the (name, threads) points in both, {n, within_10pct, within_20pct (share of
    points whose tok/s ratio second / first is within ±10 / ±20 %), median_ratio, min_ratio,
    max_ratio}; None when they share no point. A host whose own repeat agrees with itself at
    fewer points than the ±20 % target asks of predictions cannot be judged by that target."""
    first = {(r["name"], int(r["threads"])): float(r["tok_per_s"]) for r in rows}
    ratios = [float(r["tok_per_s"]) / first[(r["name"], int(r["threads"]))] for r in repeat_rows
              if (r["name"], int(r["threads"])) in first]
    if not ratios:
        return None
    return {"n": len(ratios), "within_10pct": sum(abs(x - 1) <= 0.1 for x in ratios) / len(ratios),
            "within_20pct": sum(abs(x - 1) <= 0.2 for x in ratios) / len(ratios),
            "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios)}


def region_of(hot_bytes: float, llc_bytes: int) -> str:
    """cache-resident (hot working set within half the last cache tier), cache edge (up to
    twice it) or DRAM-bound."""
    if llc_bytes <= 0 or hot_bytes > 2 * llc_bytes:
        return "DRAM-bound"
    return "cache-resident" if hot_bytes <= 0.5 * llc_bytes else "cache edge"


def uncalibrated(profile: HostProfile) -> HostProfile:
    """The profile without its calibration keys: the probe-only prediction."""
    return replace(profile, calibration={})


def repredict(rows: list[dict[str, Any]] | tuple[dict[str, Any], ...], profile: HostProfile,
              calibrated: bool = False) -> list[dict[str, Any]]:
    """Every measured row predicted again from ``profile`` (probe only unless ``calibrated``),
    with the engine policy the row was measured under (EnginePolicy.of_record): name, family,
    threads, measured and predicted tok/s, ratio, region, hot bytes."""
    host = profile if calibrated else uncalibrated(profile)
    out = []
    for r in rows:
        cfg = ModelConfig.from_dict(r["config"])
        # as it was measured: its engine, and the mean context of its runs (each from a reset)
        ctx = decoded_context(r.get("tokens"), cfg.attn_window)
        p = predict(cfg, host, int(r["threads"]), context=ctx, engine_policy=EnginePolicy.of_record(r))
        llc = effective_llc_bytes(host, int(r["threads"]))
        out.append({"name": r["name"], "family": r.get("family"), "threads": int(r["threads"]),
                    "measured_tok_per_s": float(r["tok_per_s"]), "predicted_tok_per_s": p.tok_per_s,
                    "ratio": float(r["tok_per_s"]) / p.tok_per_s, "hot_bytes": p.hot_bytes,
                    "region": region_of(p.hot_bytes, llc), "model": p.model,
                    "host_read_ratio": r.get("host_read_ratio"), "host_kernel_ratio": r.get("host_kernel_ratio"),
                    "core_round_trip_ns": r.get("core_round_trip_ns")})
    return out


def drift_summary(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How far the host, timed beside each point, was from its probe: its read rate
    (``host_read_ratio``) and its cores' speed (``host_kernel_ratio``; tern.measure.sweep
    .host_now): {n, median_read_ratio, median_kernel_ratio (None where not timed), drifted
    (points where either is beyond ±DRIFT_TOLERANCE), within_20pct_steady (the accuracy
    over the other points; None without any)}; None when no point carries either ratio."""
    def ratios(p):
        return [p[k] for k in DRIFT_KEYS if isinstance(p.get(k), (int, float))]

    pts = [p for p in points if ratios(p)]
    if not pts:
        return None
    steady = [p for p in pts if all(abs(r - 1.0) <= DRIFT_TOLERANCE for r in ratios(p))]

    def median_of(key):
        v = [p[key] for p in pts if isinstance(p.get(key), (int, float))]
        return statistics.median(v) if v else None

    return {"n": len(pts), "median_read_ratio": median_of("host_read_ratio"),
            "median_kernel_ratio": median_of("host_kernel_ratio"), "drifted": len(pts) - len(steady),
            "within_20pct_steady": _summary(steady)["within_20pct"] if steady else None}


def placement_summary(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The multi-thread points split by where the threads sat when each was measured (its
    ``core_round_trip_ns``, tern.probe.core_latency): "near" (a cache line's round trip under
    tern.probe.placement.FAR_NS: cores sharing a cache) and "far"; per side the accuracy (:func:`_summary`) and
    the median round trip. None when no multi-thread point carries a round trip (rows from
    before it was recorded, or a host with one thread)."""
    pts = [p for p in points if p["threads"] > 1 and isinstance(p.get("core_round_trip_ns"), (int, float))]
    if not pts:
        return None
    out = {}
    for side, keep in (("near", lambda ns: not far_apart(ns)), ("far", far_apart)):
        part = [p for p in pts if keep(p["core_round_trip_ns"])]
        if part:
            out[side] = {**_summary(part),
                         "median_round_trip_ns": statistics.median(p["core_round_trip_ns"] for p in part)}
    return out


def _summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(p["ratio"] - 1.0) for p in points]
    return {"n": len(points), "within_20pct": sum(e <= TARGET_WITHIN for e in errs) / len(errs) if errs else None,
            "median_abs_err": statistics.median(errs) if errs else None,
            "median_ratio": statistics.median(p["ratio"] for p in points) if points else None}


def accuracy_report(points: list[dict[str, Any]], worst: int = 3) -> dict[str, Any]:
    """Overall and per-region accuracy of re-predicted points, and the ``worst`` points."""
    rep = _summary(points)
    rep["by_region"] = {reg: _summary([p for p in points if p["region"] == reg]) for reg in REGIONS
                        if any(p["region"] == reg for p in points)}
    rep["worst"] = sorted(points, key=lambda p: -abs(p["ratio"] - 1.0))[:worst]
    rep["host_drift"] = drift_summary(points)
    rep["by_placement"] = placement_summary(points)
    return rep


def hosts_report(root: str | os.PathLike | None = None) -> dict[str, Any]:
    """Per committed host: its accuracy probe-only (and calibrated when it has a calibration)."""
    out = {}
    for h in load_hosts(root):
        entry = {"meta": {k: h.meta.get(k) for k in ("cpu", "numba_cpu_name", "note", "git_commit", "timestamp")},
                 "probe_only": accuracy_report(repredict(h.rows, h.profile))}
        if h.profile.calibration:
            entry["calibrated"] = accuracy_report(repredict(h.rows, h.profile, calibrated=True))
        if h.repeat_rows:
            entry["repeatability"] = repeatability(h.rows, h.repeat_rows)
        out[h.label] = entry
    return out


def render_hosts_report(rep: dict[str, Any]) -> str:
    lines = []
    for label, e in rep.items():
        a = e["probe_only"]
        lines.append(f"{label}  ({e['meta'].get('cpu')}, numba cpu {e['meta'].get('numba_cpu_name') or 'host'})")
        lines.append(f"  probe only: {a['n']} points, {100 * a['within_20pct']:.0f} % within +-20 %, median "
                     f"|error| {100 * a['median_abs_err']:.1f} %, median measured/predicted {a['median_ratio']:.3f}")
        for reg, s in a["by_region"].items():
            lines.append(f"    {reg:<15} n={s['n']:<3} within +-20 %: {100 * s['within_20pct']:.0f} %  "
                         f"median |error| {100 * s['median_abs_err']:.1f} %")
        for side, s in (a.get("by_placement") or {}).items():
            lines.append(f"    {side} threads   n={s['n']:<3} within +-20 %: {100 * s['within_20pct']:.0f} %  "
                         f"median |error| {100 * s['median_abs_err']:.1f} %  (round trip "
                         f"{s['median_round_trip_ns']:.0f} ns)")
        for w in a["worst"]:
            trip = w.get("core_round_trip_ns")
            trip = f", threads {trip:.0f} ns apart" if isinstance(trip, (int, float)) and w["threads"] > 1 else ""
            lines.append(f"    worst: {w['name']} t{w['threads']} ratio {w['ratio']:.3f} ({w['region']}{trip})")
        if "calibrated" in e:
            c = e["calibrated"]
            lines.append(f"  calibrated: {100 * c['within_20pct']:.0f} % within +-20 %, median |error| "
                         f"{100 * c['median_abs_err']:.1f} %")
        if e.get("repeatability"):
            r = e["repeatability"]
            lines.append(f"  repeat sweep (same code and profile): {r['n']} points, {100 * r['within_20pct']:.0f} % "
                         f"within +-20 % of the first sweep ({100 * r['within_10pct']:.0f} % within +-10 %), "
                         f"second / first {r['min_ratio']:.2f}-{r['max_ratio']:.2f}: the host's own spread")
    return "\n".join(lines) if lines else "no committed hosts"


def measure_10b_pick(profile: HostProfile, results: str | os.PathLike, threads: tuple[int, ...] = (1, 2),
                     target_tok_per_s: float = 100.0) -> list[dict[str, Any]]:
    """The ~10B-total config the design search picks on ``profile`` (probe only, at 1
    thread, as notebook 08 does), built and measured at ``threads``: its rows (family
    "10b") are appended to ``results``/bench/sweep.jsonl, so a committed host carries them."""
    from tern.measure.sweep import FULL_TIMING, SweepPoint, run_sweep
    from tern.predict.toward_10b import pick_10b

    host = uncalibrated(profile)
    pick, _, _ = pick_10b(host, target_tok_per_s, threads=1)
    out = Path(results)
    pts = [SweepPoint("10b", "10b", pick.config, t, **FULL_TIMING) for t in threads]
    return run_sweep(pts, out / "bench" / "sweep.jsonl", out / "models", host)


TARGETS = {"within_20pct": 0.95, "median_abs_err": 0.07}


def verdict_text(rep: dict[str, Any], label: str = "this host") -> str:
    """One sentence: whether ``rep`` (accuracy_report) meets the prediction targets, and
    by how much it misses them when it does not."""
    misses = []
    if rep.get("within_20pct") is None:
        return f"{label}: no points to judge."
    if rep["within_20pct"] < TARGETS["within_20pct"]:
        misses.append(f"{100 * rep['within_20pct']:.0f} % of points within ±20 % (target ≥ "
                      f"{100 * TARGETS['within_20pct']:.0f} %)")
    if rep["median_abs_err"] > TARGETS["median_abs_err"]:
        misses.append(f"median |error| {100 * rep['median_abs_err']:.1f} % (target ≤ "
                      f"{100 * TARGETS['median_abs_err']:.0f} %)")
    if not misses:
        return (f"{label}: the probe-only prediction meets the targets — {100 * rep['within_20pct']:.0f} % "
                f"of {rep['n']} points within ±20 %, median |error| {100 * rep['median_abs_err']:.1f} %."
                + drift_text(rep.get("host_drift")))
    w = rep["worst"][0] if rep.get("worst") else None
    worst = f"; worst {w['name']} at {w['threads']} thread(s), measured/predicted {w['ratio']:.2f}" if w else ""
    return (f"{label}: the probe-only prediction MISSES its targets: " + " and ".join(misses) + worst + "."
            + drift_text(rep.get("host_drift")))


def host_drifted(drift: dict[str, Any] | None) -> bool:
    """Whether a drift_summary counts as a drifted host: DRIFT_SHARE of its points or more."""
    return bool(drift) and drift["drifted"] >= DRIFT_SHARE * drift["n"]


def drift_text(drift: dict[str, Any] | None) -> str:
    """A sentence when the host's read rate or kernel speed moved between the probe and the
    sweep by more than DRIFT_TOLERANCE at DRIFT_SHARE of the points or more (else "")."""
    if not host_drifted(drift):
        return ""
    steady = drift["within_20pct_steady"]
    tail = (f"; over the {drift['n'] - drift['drifted']} points where it did not, {100 * steady:.0f} % are "
            "within ±20 %" if steady is not None else "")
    medians = ", ".join(f"{name} {drift[key]:.2f}x" for name, key in
                        (("read rate", "median_read_ratio"), ("kernel speed", "median_kernel_ratio"))
                        if drift.get(key) is not None)
    return (f" The host drifted: at {drift['drifted']} of {drift['n']} points its read rate or kernel speed, "
            f"timed right before the point, was more than ±{100 * DRIFT_TOLERANCE:.0f} % from its probe's "
            f"(medians: {medians}){tail}. A host that changes speed between the probe and the sweep moves "
            "measured/predicted by as much; run the probe and the sweep again on a quiet machine.")

"""The tables of `tern bench peers` rows (tern.measure.peers): the latest row per engine,
shape and thread count, tok/s and GB/s side by side, and the text the command prints."""

from __future__ import annotations

from typing import Any

from tern.probe.placement import FAR_NS, far_apart

# rows of tern's one-region step beside per-matrix "tern" rows, from before it was the default
REGION_ENGINE = "tern-region"
# rows of the per-matrix step beside the default "tern" rows (tern.measure.peers.run_peers(per_matrix=True))
PER_MATRIX_ENGINE = "tern-per-matrix"
# rows of Engine(layout="blocked16") beside the default "tern" rows (run_peers(blocked=True))
BLOCKED_ENGINE = "tern-blocked16"
# rows of Engine(layout="rows") beside the default "tern" rows (run_peers(rows_layout=True))
ROWS_ENGINE = "tern-rows"
_EXTRA = {REGION_ENGINE: "tern_region", PER_MATRIX_ENGINE: "tern_pm", BLOCKED_ENGINE: "tern_blk",
          ROWS_ENGINE: "tern_rows"}  # engine -> key
BUSY_FRACTION = 0.05  # other processes above this share of the CPUs: the row is flagged as disturbed


# ---- rows -> tables ---------------------------------------------------------------------------


def latest_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last row of each (engine, shape, threads) in file order (later runs win)."""
    last: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.get("kind") == "peers":
            last[(r["engine"], r["shape"], r["threads"])] = r
    return list(last.values())


def peers_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per shape (ordered by bytes per token): dims, params, bytes per token of
    each engine and, per thread count, each engine's tok/s, GB/s end to end and fraction of
    read bandwidth (tern's also its predicted tok/s and measured / predicted), and tern / llama.cpp (with ``tern-region`` rows also region / llama.cpp
    and region / tern; with ``tern-per-matrix`` rows per-matrix / tern; with ``tern-blocked16`` rows
    blocked / llama.cpp and blocked / tern; with ``tern-rows`` rows, rows / llama.cpp and rows / tern)."""
    out: dict[str, dict[str, Any]] = {}
    for r in latest_rows(rows):
        e = out.setdefault(r["shape"], {"shape": r["shape"], "dims": r["dims"], "by_threads": {}})
        key = {"tern": "tern", **_EXTRA}.get(r["engine"], "llama")
        if key not in _EXTRA.values():  # these rows read the tern rows' file and bytes
            e[f"{key}_params"], e[f"{key}_bytes_per_token"] = r["total_params"], r["bytes_per_token"]
        cell = e["by_threads"].setdefault(r["threads"], {})
        cell[key] = {"tok_per_s": r["tok_per_s"], "gbps": r["gbps_end_to_end"],
                     "fraction": r.get("bandwidth_fraction"), "spread_rel": r.get("spread_rel"),
                     "fraction_now": r.get("bandwidth_fraction_same_run"),
                     "predicted": r.get("predicted_tok_per_s"), "over_predicted": r.get("ratio")}
    for e in out.values():
        for cell in e["by_threads"].values():
            if "tern" in cell and "llama" in cell:
                cell["tern_over_llama"] = cell["tern"]["tok_per_s"] / cell["llama"]["tok_per_s"]
                cell["tern_over_llama_per_byte"] = cell["tern"]["gbps"] / cell["llama"]["gbps"]
            if "tern_region" in cell and "llama" in cell:
                cell["region_over_llama"] = cell["tern_region"]["tok_per_s"] / cell["llama"]["tok_per_s"]
            if "tern_region" in cell and "tern" in cell:
                cell["region_over_tern"] = cell["tern_region"]["tok_per_s"] / cell["tern"]["tok_per_s"]
            for key, name in (("tern_pm", "pm"), ("tern_blk", "blk"), ("tern_rows", "rows")):  # over tern, llama.cpp
                for other in ("tern", "llama"):
                    if key in cell and other in cell:
                        cell[f"{name}_over_{other}"] = cell[key]["tok_per_s"] / cell[other]["tok_per_s"]
    return sorted(out.values(), key=lambda e: e.get("tern_bytes_per_token", e.get("llama_bytes_per_token", 0)))


# one text table per tuple: title, per thread count [(header, engine or None, field, width, format)]
_TEXT_TABLES = (
    ("tok/s (median of repeats)",
     (("llama", "llama", "tok_per_s", 9, ".1f"), ("tern", "tern", "tok_per_s", 8, ".1f"),
      ("ratio", None, "tern_over_llama", 5, ".2f"), ("predicted", "tern", "predicted", 9, ".1f"),
      ("/pred", "tern", "over_predicted", 5, ".2f"))),
    ("GB/s end to end (bytes per token x tok/s), fraction of the probe's read bandwidth and of the read "
     "rate timed right before the run (now)",
     (("GB/s llama", "llama", "gbps", 10, ".2f"), ("tern", "tern", "gbps", 6, ".2f"),
      ("frac llama", "llama", "fraction", 10, ".2f"), ("tern", "tern", "fraction", 5, ".2f"),
      ("now llama", "llama", "fraction_now", 9, ".2f"), ("tern", "tern", "fraction_now", 5, ".2f"))),
)


_REGION_COLS = (("region", "tern_region", "tok_per_s", 8, ".1f"), ("/llama", None, "region_over_llama", 6, ".2f"),
                ("/tern", None, "region_over_tern", 5, ".2f"))
_PM_COLS = (("per-matrix", "tern_pm", "tok_per_s", 10, ".1f"), ("/tern", None, "pm_over_tern", 5, ".2f"))
_BLK_COLS = (("blocked16", "tern_blk", "tok_per_s", 9, ".1f"), ("/llama", None, "blk_over_llama", 6, ".2f"),
             ("/tern", None, "blk_over_tern", 5, ".2f"))
_ROWS_COLS = (("rows", "tern_rows", "tok_per_s", 8, ".1f"), ("/llama", None, "rows_over_llama", 6, ".2f"),
              ("/tern", None, "rows_over_tern", 5, ".2f"))


def render_peers(result: dict[str, Any]) -> str:
    """Text tables of :func:`peers_table`: tok/s, then GB/s and fraction of read bandwidth;
    with ``tern-region`` / ``tern-per-matrix`` rows, the tok/s table adds their columns."""
    table = peers_table(result["rows"])
    threads = sorted({t for e in table for t in e["by_threads"]})
    has_region = any("tern_region" in c for e in table for c in e["by_threads"].values())
    has_pm = any("tern_pm" in c for e in table for c in e["by_threads"].values())
    has_blk = any("tern_blk" in c for e in table for c in e["by_threads"].values())
    has_rows = any("tern_rows" in c for e in table for c in e["by_threads"].values())
    lines = []
    for i, (title, cols) in enumerate(_TEXT_TABLES):
        extra = ((_REGION_COLS if has_region else ()) + (_PM_COLS if has_pm else ()) + (_BLK_COLS if has_blk else ())
                 + (_ROWS_COLS if has_rows else ()))
        cols = cols + extra if i == 0 else cols
        head = f"{'shape':<10} {'dims (d/L/ffn/V)':<26} {'MB/tok tern':>11} {'llama':>7}"
        head += "".join(f" | {t}t" + "".join(f" {h:>{w}}" for h, _, _, w, _ in cols) for t in threads)
        lines += [title, head]
        for e in table:
            line = f"{e['shape']:<10} {e['dims']:<26} {_mb(e, 'tern'):>11} {_mb(e, 'llama'):>7}"
            for t in threads:
                c = e["by_threads"].get(t, {})
                line += " |   "
                for _, eng, field, w, spec in cols:
                    v = (c.get(eng) or {}).get(field) if eng else c.get(field)
                    line += f" {'-' if v is None else format(v, spec):>{w}}"
            lines.append(line)
        lines.append("")
    busy = [f"{r['shape']} {r['engine']} {r['threads']}t ({r['host_activity']['foreign_cpu_frac']:.0%})"
            for r in latest_rows(result["rows"])
            if r.get("host_activity", {}).get("foreign_cpu_frac", 0) > BUSY_FRACTION]
    if busy:
        lines.append(f"disturbed (other processes used > {BUSY_FRACTION:.0%} of the CPUs meanwhile): " + ", ".join(busy))
    far = [f"{r['shape']} {r['engine']} {r['threads']}t ({r['core_round_trip_ns']:.0f} ns)"
           for r in latest_rows(result["rows"]) if far_apart(r.get("core_round_trip_ns") or 0)]
    if far:
        lines.append(f"threads far apart (a cache-line round trip > {FAR_NS:.0f} ns timed just before: cores that "
                     "share no L3; 2-thread figures of small models drop ~1.5x there): " + ", ".join(far))
    if result.get("note"):
        lines.append(result["note"])
    lines += [f"error: {e}" for e in result.get("errors", [])]
    lines.append(f"records: {result['records']}")
    return "\n".join(lines)


def _mb(e: dict[str, Any], key: str) -> str:
    v = e.get(f"{key}_bytes_per_token")
    return "-" if v is None else f"{v / 1e6:.1f}"

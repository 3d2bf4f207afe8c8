"""Bandwidth utilisation of a decode measurement: bytes read per token x tok/s, divided by
the probe's read bandwidth at the model's working set (tern.core.host_queries.bandwidth_gbps).

A DRAM-bound engine that streams its weights as fast as the probe's read kernel reads
memory scores 1.0; well-tuned CPU engines report 0.85-0.95 of measured read bandwidth in
decode. The working set is the model's total bytes (over many tokens routing touches
every expert, so a MoE model cycles through all of them) unless the row says otherwise.

:func:`decode_utilisation` takes the numbers; :func:`row_utilisation` reads them from any
decode row the kit writes (peers, sweep, dram_model, ladder with the model's config), and
:func:`engine_bytes_per_token` counts what tern's engine actually reads per token, where
its load-time conversions differ from the file's formats.
"""

from __future__ import annotations

import math
from typing import Any

from tern.core.config import ModelConfig, param_counts
from tern.core.host_profile import HostProfile
from tern.core.host_queries import bandwidth_gbps
from tern.predict.pools import engine_extra_bytes

NO_PROFILE = "no host profile (run `tern probe`): bandwidth fraction not computed"


def decode_utilisation(tok_per_s: float, bytes_per_token: float, working_set_bytes: float,
                       threads: int, host: HostProfile | None,
                       read_now: dict[str, Any] | None = None) -> dict[str, Any]:
    """{gbps_end_to_end, read_gbps_at_ws, bandwidth_fraction, bandwidth_note}: GB/s are
    1e9 B/s; the fraction and read rate are None (with a note) without a host profile.
    ``read_now`` (tern.probe.bandwidth.read_reference, timed beside the decode) adds
    {read_same_run, bandwidth_fraction_same_run}: the fraction of the read rate at that
    moment, which a host whose memory speed drifts does not blur."""
    for name, v in (("tok_per_s", tok_per_s), ("bytes_per_token", bytes_per_token),
                    ("working_set_bytes", working_set_bytes)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    gbps = bytes_per_token * tok_per_s / 1e9
    out: dict[str, Any] = {"gbps_end_to_end": gbps, "read_gbps_at_ws": None, "bandwidth_fraction": None,
                           "bandwidth_note": NO_PROFILE}
    if host is not None and host.thread_counts():
        read = bandwidth_gbps(host, working_set_bytes, threads)
        out.update(read_gbps_at_ws=read, bandwidth_fraction=gbps / read,
                   bandwidth_note=f"read bandwidth of profile {host.label!r} at {working_set_bytes / 1e6:.1f} MB, "
                                  f"{threads} thread(s)")
    elif host is not None:
        out["bandwidth_note"] = f"host profile {host.label!r} has no read-bandwidth curve"
    if read_now is not None:
        read = read_now.get("gbps_median")
        if not (isinstance(read, (int, float)) and math.isfinite(read) and read > 0):
            raise ValueError(f"read_now needs a positive gbps_median, got {read!r}")
        out.update(read_same_run=dict(read_now), bandwidth_fraction_same_run=gbps / read)
    return out


def engine_bytes_per_token(cfg: ModelConfig, dense16: str = "direct", b3: str = "auto",
                           llc_bytes: int | None = None, router_int8: bool = True) -> int:
    """Bytes tern's engine reads per token: the active bytes of ``cfg``
    (tern.core.config.param_counts), except where tern.run.engine converts at load: int8
    routers are read as stored by today's engine (as fp32 by engines before
    EnginePolicy.router_int8: ``router_int8=False``), base-3 ternary matrices as ternary2 unless read as stored
    (``b3``, "auto" resolved with ``llc_bytes`` as the engine does), and with
    ``dense16="expand"`` (tern.run.engine's option; default "direct" reads them as stored)
    fp16 / bf16 embedding and head rows and routers as fp32."""
    return param_counts(cfg).active.bytes + sum(engine_extra_bytes(cfg, dense16, b3, llc_bytes, router_int8))


def row_utilisation(row: dict[str, Any], host: HostProfile | None,
                    cfg: ModelConfig | None = None) -> dict[str, Any]:
    """:func:`decode_utilisation` of a decode row. Reads tok/s (a number or a summary
    with ``median``), the thread count, bytes per token (``bytes_per_token``, else
    ``active_bytes``) and the working set (``working_set_bytes``, else ``total_bytes``);
    a row without byte counts (ladder rows) needs its model's ``cfg`` (or a ``config``
    dict in the row)."""
    tps = row.get("tok_per_s")
    if isinstance(tps, dict):
        tps = tps.get("median")
    if tps is None:
        raise ValueError("the row has no tok_per_s")
    threads = row.get("threads")
    per_token = row.get("bytes_per_token", row.get("active_bytes"))
    ws = row.get("working_set_bytes", row.get("total_bytes"))
    if per_token is None or ws is None:
        if cfg is None and isinstance(row.get("config"), dict):
            cfg = ModelConfig.from_dict(row["config"])
        if cfg is None:
            raise ValueError("the row carries no byte counts (bytes_per_token / active_bytes, "
                             "working_set_bytes / total_bytes): pass the model's config")
        pc = param_counts(cfg)
        per_token = pc.active.bytes if per_token is None else per_token
        ws = pc.total.bytes if ws is None else ws
    return decode_utilisation(float(tps), float(per_token), float(ws), int(threads or 1), host)


def with_utilisation(rows: list[dict[str, Any]], host: HostProfile | None) -> list[dict[str, Any]]:
    """Copies of ``rows`` with :func:`row_utilisation`'s fields added."""
    return [{**r, **row_utilisation(r, host)} for r in rows]

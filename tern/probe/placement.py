"""Where two threads' cores sit, read off their cache-line round trip (ns, measured by
tern.probe.core_latency): the threshold and its wording, without numba, so that tables and
reports (tern.measure.hosts, tern.measure.peers_table) can use them without loading the kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FAR_NS = 150.0  # round trips above this: the threads' cores share no cache level (benchmarks/README)
RoundTripNow = Callable[[], float | None]  # the round trip timed now (ns), None where there is none


def far_apart(round_trip_ns: float) -> bool:
    """Whether a round trip says the two threads' cores share no cache (> FAR_NS)."""
    return round_trip_ns > FAR_NS


def describe_round_trip(m: dict[str, Any] | None) -> str:
    """One line for people: the round trip (tern.probe.core_latency.measure_round_trip) and
    what it means for 2-thread decoding."""
    if m is None:
        return "threads' round trip: not measured (fewer than 2 threads ran at once)"
    where = ("cores that share no cache (e.g. two CCDs of an EPYC): every phase hand-off of the "
             "2-thread engine costs several of these, and small models gain little from a second thread"
             if m["far"] else "neighbouring cores (a shared L3)")
    return (f"threads' round trip: {m['round_trip_ns']:.0f} ns (runs {m['min_ns']:.0f}-{m['max_ns']:.0f} ns): "
            f"{where}")

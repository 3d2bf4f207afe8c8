"""What each figure of the report shows: one line per figure file name (fnmatch patterns),
the notebook that draws it, and whether it is dense enough to need the full page width.

A figure a notebook saves under its RESULTS folder appears on the report's index under its
notebook with this line; a figure missing here is listed under "Other figures" with its
file name only (tests/report/test_wheel_install.py fails on such a figure).
"""

from __future__ import annotations

import fnmatch
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Caption:
    pattern: str  # fnmatch pattern of the PNG file name
    notebook: str  # "01" ... "08"
    text: str  # what this shows, one line
    wide: bool = False  # full page width (dense)


CAPTIONS = (
    Caption("probe_read_bandwidth.png", "01", "Read bandwidth against working-set size on 1 and all threads: "
            "each flat step is a memory level, its height the GB/s the roofline uses.", wide=True),
    Caption("probe_all_kernels.png", "01", "Every probed kernel (read; copy and triad in a full probe) "
            "against working-set size: decode is priced with read alone.", wide=True),
    Caption("roofline_presets.png", "02", "Predicted decode tok/s of every preset on this host and the "
            "reference PC, 1 and all threads (log scale)."),
    Caption("roofline_time_breakdown.png", "02", "Where a predicted token's time goes on one thread: each "
            "op's measured cost, each pool's memory stall and the fixed overhead.", wide=True),
    Caption("roofline_knee.png", "02", "Predicted tok/s against total params at fixed active params: the "
            "drop where the experts leave the last-level cache is the knee."),
    Caption("roofline_formats.png", "02", "Predicted tok/s of dense models against active params, one line "
            "per weight format."),
    Caption("roofline_feasibility_10b.png", "02", "Predicted tok/s of a 10B-total ternary model over active "
            "params and threads; the white line is the target.", wide=True),
    Caption("roofline_explore.png", "02", "The explorer at its default setting: the setting on its knee "
            "curve, and each pool's bytes against the usable last-level cache.", wide=True),
    *(Caption(f"train_{preset}_{kind}.png", nb, text)
      for nb, preset in (("03", "sandbox"), ("04", "30m"))
      for kind, text in (("curves", "Training loss and validation bits per byte against tokens seen."),
                         ("sparsity", "Share of FFN hidden units that are exactly zero, per layer "
                                      "(work the engine skips)."),
                         ("expert_load", "Router load of each expert per MoE layer (1.0 = balanced)."))),
    Caption("engine_ladder.png", "05", "Decode tok/s of each rung of the engine ladder: what each "
            "optimization buys on the same model."),
    Caption("peers*.png", "05", "tern's engine beside llama.cpp on the same model shapes: tok/s and "
            "GB/s end to end.", wide=True),
    Caption("*utilisation*.png", "05", "Every decode benchmark as a fraction of the probe's read "
            "bandwidth at its working set."),
    Caption("sweep_fixed_active.png", "06", "Measured against predicted tok/s as routed experts grow at "
            "fixed active params, from cache-resident to DRAM-bound.", wide=True),
    Caption("sweep_fixed_total.png", "06", "Measured against predicted tok/s at fixed total params as "
            "top-k (active params) grows.", wide=True),
    Caption("sweep_ratios.png", "06", "Measured over predicted tok/s of every sweep point (1.0: the "
            "prediction is exact).", wide=True),
    Caption("sweep_hosts.png", "06", "Measured over predicted tok/s against the working set, one panel "
            "per committed host (this machine first), each predicted from its own probe.", wide=True),
    Caption("gates_forest.png", "07", "Each gate comparison's mean Δ of validation bits per byte ± k·se, "
            "coloured by verdict, with the rule's threshold.", wide=True),
    Caption("gates_*_capacity.png", "07", "Validation bits per byte against total params as routed experts "
            "grow at the same active bytes (± 1 se), and each arm's expert load.", wide=True),
    Caption("toward_10b*.png", "08", "The ~10B-total model: measured and predicted tok/s per thread count "
            "against the target."),
)


def caption_for(name: str) -> Caption | None:
    """The caption of figure file ``name`` (the first matching pattern), or None."""
    return next((c for c in CAPTIONS if fnmatch.fnmatchcase(name, c.pattern)), None)


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) in pixels from a PNG's header, or None when it is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", head[16:24])

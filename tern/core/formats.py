"""Weight storage formats and their exact sizes.

Every byte count in the kit (roofline, exporter, engine, benchmarks) goes through
:func:`tensor_bytes`, so a format's cost is defined once.

A format stores ``rows x cols`` weights as a payload of ``bits_per_weight`` bits each
(block scales folded in, as llama.cpp quotes its formats) plus, for row-scaled formats,
one fp32 scale per output row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits_per_weight: float  # payload bits per weight, block scales included
    row_scale_bytes: int  # bytes of scale stored per output row (0 if none)
    ternary: bool  # weights restricted to {-1, 0, +1}
    description: str

    def payload_bytes(self, n_weights: int) -> int:
        """Bytes of the packed payload for ``n_weights`` weights (rounded up to a byte)."""
        return math.ceil(n_weights * self.bits_per_weight / 8)


FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("fp32", 32.0, 0, False, "IEEE float32"),
        WeightFormat("fp16", 16.0, 0, False, "IEEE float16"),
        WeightFormat("bf16", 16.0, 0, False, "bfloat16"),
        WeightFormat("int8", 8.0, 4, False, "int8, one fp32 scale per row"),
        WeightFormat(
            "q4", 4.5, 0, False, "4-bit, blocks of 32 with an fp16 scale (llama.cpp Q4_0)"
        ),
        WeightFormat(
            "ternary2", 2.0, 4, True, "ternary, 2-bit packed (4 trits/byte), fp32 scale per row"
        ),
        WeightFormat(
            "ternary_b3", 1.6, 4, True, "ternary, base-3 packed (5 trits/byte), fp32 scale per row"
        ),
        WeightFormat(
            "tq2_0", 2.0625, 0, True, "llama.cpp TQ2_0: 256-blocks of 2-bit trits + fp16 scale"
        ),
        WeightFormat(
            "tq1_0",
            1.6875,
            0,
            True,
            "llama.cpp TQ1_0: 256-blocks, 240 trits base-3 + 16 at 2 bit + fp16 scale",
        ),
        WeightFormat(
            "lut4", 4.0, 4, True, "reference engine's ternary LUT packing (4 bits/weight)"
        ),
    )
}


def get_format(name: str) -> WeightFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown weight format {name!r}; known formats: {', '.join(FORMATS)}"
        ) from None


def tensor_bytes(fmt: str | WeightFormat, shape: tuple[int, ...]) -> int:
    """Stored bytes of a weight tensor of ``shape`` in ``fmt``.

    The last axis is the input (columns); every other axis counts as output rows,
    so a stacked expert tensor (E, H, D) has E*H rows of D columns.
    """
    f = get_format(fmt) if isinstance(fmt, str) else fmt
    n = math.prod(shape)
    rows = n // shape[-1] if shape and shape[-1] else 0
    return f.payload_bytes(n) + rows * f.row_scale_bytes

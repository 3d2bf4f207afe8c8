"""The figure every tern plot returns: a matplotlib Figure outside pyplot's registry that
shows itself as a PNG in any IPython front end.

Library modules never choose a matplotlib backend: a backend set at import switches off
Jupyter's inline display, and figures then show as ``<Figure size ... with 2 Axes>``. The
plots build their figures with the object API instead (:func:`subplots`), so

* nothing is kept in pyplot's registry: no figure leaks in a loop, and the inline backend
  does not draw a second copy at the end of a cell;
* the caller saves the figure (``fig.savefig(path)``; headless, no display needed);
* Jupyter displays the returned figure: through the inline backend's formatter when it is
  active, else through :meth:`TernFigure._repr_png_` (before pyplot has loaded a backend,
  or under any other backend).
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.figure import Figure


class TernFigure(Figure):
    """A matplotlib Figure with an IPython PNG representation."""

    def _repr_png_(self) -> bytes:
        return figure_png(self)


def figure_png(fig: Figure, dpi: float | None = None) -> bytes:
    """The figure as PNG bytes (tight bounding box, as Jupyter's inline backend draws it)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] = (6.4, 4.8),
             **kwargs: Any) -> tuple[TernFigure, Any]:
    """``(figure, axes)`` like ``matplotlib.pyplot.subplots`` but without pyplot:
    ``kwargs`` go to :meth:`Figure.subplots` (``squeeze``, ``sharey``, ``gridspec_kw``...)."""
    fig = TernFigure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)

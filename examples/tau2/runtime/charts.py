"""The one way our commands draw a chart: a matplotlib `Figure` on its own Agg canvas (no GUI, no global
backend switch, safe in any process) saved atomically as PNG."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from examples.tau2.runtime.files import write_bytes_atomic


def new_figure(width: float, height: float, panels: int = 1, dpi: int = 120) -> tuple[Any, list[Any]]:
    """A figure of `panels` axes side by side (inches), laid out by matplotlib's constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, panels, squeeze=False)[0])


def save_png(fig: Any, path: Path) -> Path:
    """Render `fig` and write it to `path` so that readers never see a half-written image."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    write_bytes_atomic(path, buffer.getvalue())
    return path

"""The loss curve: loss and KL at each evaluation, from `metrics.jsonl`, as a real matplotlib plot.

Drawn on a bare `matplotlib.figure.Figure` with the Agg canvas: no display, no pyplot global
state, safe in any thread. Series are read by name from the epoch records the MetricsLogger
writes (`<split>_loss`, `<split>_kl` for split train and each evaluated split), so the plot shows
whatever the loop evaluated, labelled with the split it came from.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

# (record key prefix, legend label); only the splits present in the records are drawn.
SPLITS = (("train", "train (mean since the previous evaluation)"),
          ("validation", "validation (at the evaluation)"),
          ("test", "test set (at the evaluation)"))
TERMS = (("loss", "loss (nats per image)", "objective: reconstruction + KL weight x KL"),
         ("kl", "KL (nats per image)", "KL(q(z|x,y) || p(z)), unweighted"))


def loss_curve_figure(records: list[dict]) -> Figure:
    """Two panels against epochs: the loss, and the KL, one line per split found in `records`."""
    figure = Figure(figsize=(10, 4), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(TERMS))
    for ax, (term, ylabel, title) in zip(axes, TERMS):
        for split, label in SPLITS:
            points = [(r["epoch"], r[f"{split}_{term}"]) for r in records
                      if _finite(r.get(f"{split}_{term}"))]
            if points:
                epochs, values = zip(*points)
                ax.plot(epochs, values, marker="o" if len(points) <= 40 else None, markersize=3,
                        label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize="medium")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            # A fixed corner, not loc="best": the curves fall, so the upper right is clear, and
            # "best" searches for a place (matplotlib warns when that search is slow).
            ax.legend(fontsize="small", loc="upper right")
    return figure


def save_loss_curve(records: list[dict], path: str | os.PathLike) -> Path:
    """Writes `loss_curve_figure(records)` as a PNG, atomically (temp file + os.replace)."""
    path = Path(path)
    buffer = io.BytesIO()
    FigureCanvasAgg(loss_curve_figure(records)).print_png(buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)

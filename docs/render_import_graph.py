"""Draw the package's import graph by stage: docs/images/import-graph.png.

    .venv/bin/python docs/render_import_graph.py [--out docs/images/import-graph.png]

One box per level, stacked from the CLI at the top to the modules every stage may use at the
bottom (config, presets, errors, limits), with the five stages of `cvae/` between: data, model,
sampling, training, evaluation. Each box lists its modules; each arrow on the right is a package
that imports another, and every arrow points down. The graph is read from the source by
tests/import_graph.py, the same reading tests/test_layout.py checks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import import_graph  # noqa: E402  (tests/, put on the path above)

BASE = ("config", "errors", "limits")  # drawn as one box: below everything
CLI = ("cli",)  # the CLI package: its commands, help texts and argument types
ROWS = ("cli", "service", "export", *reversed(import_graph.STAGES), "base")
TITLES = {"cli": "cvae.cli  (above everything)", "service": "service  (the FastAPI app)",
          "export": "cvae.export  (portable models: above every stage)",
          "base": "cvae.config, cvae.errors, cvae.limits  (below every stage)",
          **{stage: f"cvae.{stage}  (stage {i + 1} of 5)"
             for i, stage in enumerate(import_graph.STAGES)}}
COLOURS = {"data": "#dbe9f6", "model": "#e3f1dc", "sampling": "#fdf0d5", "training": "#f8dede",
           "evaluation": "#ebe1f3"}
BOX_WIDTH, ARC_ROOM, GAP, LINE = 7.2, 2.6, 0.35, 0.22  # inches


def row_of(package: str) -> str:
    return "base" if package in BASE else "cli" if package in CLI else package


def modules_by_row() -> dict[str, list[str]]:
    """Row -> its modules' names (`__init__` left out; the base row's with their package)."""
    found: dict[str, list[str]] = {}
    for module, path in import_graph.module_paths().items():
        if path.name != "__init__.py":
            package = import_graph.package_of(module)
            name = module.split(".", 1)[1] if package == "service" else path.stem
            found.setdefault(row_of(package), []).append(name)
    return {row: sorted(names) for row, names in found.items()}


def wrapped(names: list[str], width: int = 78) -> list[str]:
    """Names joined into lines of at most `width` characters."""
    lines, line = [], ""
    for name in names:
        if line and len(line) + len(name) + 2 > width:
            lines.append(line + ",")
            line = ""
        line = f"{line}, {name}" if line else name
    return [*lines, line]


def row_edges() -> list[tuple[str, str]]:
    """(importing row, imported row) for every pair of rows one of whose packages imports the
    other's, within the base row left out."""
    edges = {(row_of(source), row_of(target))
             for source, targets in import_graph.package_graph().items() for target in targets}
    return sorted((s, t) for s, t in edges if s != t)


def draw(out: Path) -> Path:
    modules = modules_by_row()
    heights = {row: LINE * (2.2 + len(wrapped(modules[row]))) for row in ROWS}
    total = sum(heights.values()) + GAP * (len(ROWS) + 1)
    tops, y = {}, total - GAP
    for row in ROWS:
        tops[row] = y
        y -= heights[row] + GAP
    figure = Figure(figsize=(BOX_WIDTH + ARC_ROOM + 0.6, total), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_axes((0, 0, 1, 1), xlim=(0, BOX_WIDTH + ARC_ROOM + 0.6), ylim=(0, total))
    axes.set_axis_off()
    for row in ROWS:
        top, height = tops[row], heights[row]
        axes.add_patch(FancyBboxPatch((0.3, top - height), BOX_WIDTH, height,
                                      boxstyle="round,pad=0.02", edgecolor="#555555",
                                      facecolor=COLOURS.get(row, "#eeeeee"), linewidth=1.0))
        axes.text(0.42, top - 0.14, TITLES[row], va="top", fontsize=10, fontweight="bold")
        axes.text(0.42, top - 0.14 - 1.4 * LINE, "\n".join(wrapped(modules[row])), va="top",
                  fontsize=8, family="monospace", linespacing=1.35)
    right = 0.3 + BOX_WIDTH
    edges = row_edges()
    for source, target in edges:
        outgoing = [t for s, t in edges if s == source]
        incoming = [s for s, t in edges if t == target]
        start = tops[source] - heights[source] * (0.15 + 0.7 * (outgoing.index(target) + 0.5)
                                                  / len(outgoing))
        end = tops[target] - heights[target] * (0.15 + 0.7 * (incoming.index(source) + 0.5)
                                                / len(incoming))
        span = ROWS.index(target) - ROWS.index(source)
        axes.add_patch(FancyArrowPatch((right, start), (right, end), arrowstyle="-|>",
                                       mutation_scale=9, color="#666666", linewidth=0.8,
                                       connectionstyle=f"arc3,rad={-0.12 - 0.05 * span}"))
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "images" / "import-graph.png")
    print(f"wrote {draw(parser.parse_args().out)}")


if __name__ == "__main__":
    main()

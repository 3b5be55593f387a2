"""The figures' shared drawing: matplotlib without a display, the study
records' curves (one panel per arm, or several folders of records overlaid
on each arm's panel) and saving.

Every curve here has environment frames (millions) on x and, on y, the mean
return of the last 100 training episodes (whole games where the level has
lives) at each point the study runner recorded.
"""

from __future__ import annotations

import os

X_LABEL = "environment frames (M)"


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said once) where
    matplotlib is not installed (benchmarks/requirements.txt)."""
    try:
        import matplotlib
    except ImportError:
        print("No figure: matplotlib is not installed (benchmarks/requirements.txt).")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def y_label(records: list[dict]) -> str:
    """What a curve's y averages, in the records' unit."""
    games = records and all(r.get("unit") == "game" for r in records)
    return f"mean return, last 100 training {'games' if games else 'episodes'}"


def curve(record: dict) -> tuple[list[float], list[float]]:
    """(frames in millions, mean of the last 100) of a record's points."""
    points = [p for p in record.get("curve") or [] if p.get("mean") is not None]
    return [p["frames"] / 1e6 for p in points], [p["mean"] for p in points]


def save(figure, path: str, dpi: int = 110) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=dpi)
    print(f"Figure: {path}")


def _grid(plt, panels: int, columns: int = 3):
    columns = min(panels, columns)
    rows = -(-panels // columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False
    )
    for ax in axes.flat[panels:]:
        ax.axis("off")
    return figure, axes


def curves_figure(records: list[dict], path: str, title: str):
    """Each record's curve in a panel of its own, its test mean as a dashed
    line; returns the figure (closed), None without matplotlib or curves."""
    plt = pyplot()
    records = [r for r in records if r.get("curve")]
    if plt is None or not records:
        return None
    figure, axes = _grid(plt, len(records))
    for ax, record in zip(axes.flat, records, strict=False):
        ax.plot(*curve(record), lw=1.5)
        for result in record.get("test", {}).get("levels", {}).values():
            ax.axhline(result["mean_return"], ls="--", lw=1, color="gray")
        ax.set_title(record["arm"])
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel(y_label([record]))
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    save(figure, path)
    plt.close(figure)
    return figure


def overlay_figure(folders: dict[str, list[dict]], path: str, title: str):
    """Several folders of records of the same arms (a baseline and a new
    default): a panel per arm, each folder's curve overlaid in its colour
    with its test mean dashed, the label naming the folder; returns the
    figure (closed), None without matplotlib or curves."""
    plt = pyplot()
    arms = list(
        dict.fromkeys(
            r["arm"] for records in folders.values() for r in records if r.get("curve")
        )
    )
    if plt is None or not arms:
        return None
    figure, axes = _grid(plt, len(arms))
    for ax, arm in zip(axes.flat, arms, strict=False):
        drawn = []
        for index, (label, records) in enumerate(folders.items()):
            record = next((r for r in records if r.get("arm") == arm), None)
            if record is None or not record.get("curve"):
                continue
            drawn.append(record)
            ax.plot(*curve(record), lw=1.5, color=f"C{index}", label=label)
            for result in record.get("test", {}).get("levels", {}).values():
                ax.axhline(result["mean_return"], ls="--", lw=1, color=f"C{index}")
        ax.set_title(arm)
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel(y_label(drawn))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    figure.suptitle(f"{title} (dashed: each one's test mean)")
    figure.tight_layout()
    save(figure, path)
    plt.close(figure)
    return figure


def require_pyplot():
    """pyplot() for a command line that draws and nothing else: without
    matplotlib, its line and exit 1."""
    plt = pyplot()
    if plt is None:
        raise SystemExit(1)
    return plt

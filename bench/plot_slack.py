"""Plot batch work beside realtime: the batch's share of its rate alone against the realtime
delay p99 ratio, one point per run, with the issue's goal as a shaded corner.

    .venv/bin/python bench/plot_slack.py OUT.png LABEL=REPORT.json [LABEL=REPORT.json ...]

A report is ``bench/slack.py``'s (``batch_throughput_ratio``, ``delay_p99_ratio``) or
``bench/served.py --beside-images``'s (its first row's ``images_ratio`` and
``realtime_p99_ratio``). Points of one label share a colour. Needs matplotlib.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

GOAL_SHARE = 0.8
GOAL_P99 = 1.1


def _point(report: dict) -> tuple[float, float]:
    if "rows" in report:
        row = report["rows"][0]
        return row["images_ratio"], row["realtime_p99_ratio"]
    return report["batch_throughput_ratio"], report["delay_p99_ratio"]


def main(argv: list[str]) -> int:
    out, *reports = argv
    figure, axes = plt.subplots(figsize=(11, 5))
    points: dict[str, list[tuple[float, float]]] = {}
    for item in reports:
        label, path = item.split("=", 1)
        points.setdefault(label, []).append(_point(json.loads(Path(path).read_text())))
    colours = plt.get_cmap("tab20").colors  # more labels than the default cycle's ten
    markers = "os^D"
    for index, (label, xy) in enumerate(points.items()):
        colour, marker = colours[(2 * index) % 20], markers[index % len(markers)]
        axes.scatter(
            [x for x, _ in xy], [y for _, y in xy], label=label, s=45, color=colour, marker=marker
        )
    axes.fill_between([GOAL_SHARE, 1.1], 0, GOAL_P99, color="tab:green", alpha=0.12)
    axes.text(GOAL_SHARE + 0.01, GOAL_P99 - 0.12, "goal", color="tab:green")
    axes.set_xlim(0, 1.1)
    axes.set_ylim(0.5, max(2.5, max(y for xy in points.values() for _, y in xy) + 0.2))
    axes.set(
        xlabel="batch throughput beside realtime / alone",
        ylabel="realtime delay p99 beside batch / alone",
    )
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

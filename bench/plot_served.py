"""Plot ``bench/served.py`` reports: p99 output delay and served step p99 against N.

    .venv/bin/python bench/plot_served.py OUT.png LABEL=REPORT.json [LABEL=REPORT.json ...]

One line per report (a process layout), its rows in order of N (a ``--step-down`` report
has them largest first); the engine-only step p99, when a report
carries it (``--engine-bench``), is drawn dashed on the right panel. Needs matplotlib.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(argv: list[str]) -> int:
    out, *reports = argv
    figure, (delay, step) = plt.subplots(1, 2, figsize=(11, 4.2))
    engine: dict[int, float] = {}
    for item in reports:
        label, path = item.split("=", 1)
        rows = sorted(json.loads(Path(path).read_text())["rows"], key=lambda r: r["sessions"])
        counts = [row["sessions"] for row in rows]
        delay.plot(counts, [row["delay_p99_ms"] for row in rows], marker="o", label=label)
        step.plot(counts, [row["step_p99_ms"] for row in rows], marker="o", label=label)
        for row in rows:
            if "engine_only_step_p99_ms" in row:
                engine[row["sessions"]] = row["engine_only_step_p99_ms"]
    if engine:
        counts = sorted(engine)
        step.plot(counts, [engine[n] for n in counts], "k--", label="engine alone")
    delay.axhline(80, color="grey", linewidth=0.8)
    delay.set_yscale("log")
    delay.set(xlabel="concurrent sessions", ylabel="p99 output delay (ms, log)")
    delay.set_title("what clients get")
    step.axhline(80, color="grey", linewidth=0.8)
    step.set(xlabel="concurrent sessions", ylabel="engine step p99 (ms)")
    step.set_title("engine step, served and alone")
    for axes in (delay, step):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

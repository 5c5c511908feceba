"""The soak's short variant: ``bench/soak.py`` for 14 s against a real ``duplex serve``.

Sessions come and go (closed, or dropped and resumed) for the whole run; then the load
stops and everything settles. The server must end where it began after its warm-up:
the same trio tasks and open fds, RSS and GC-tracked objects within loose bounds, no
session or engine slot held, no traceback in its log. The 30-minute run and its figures
are in docs/reliability.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_a_short_soak_leaves_the_server_as_it_found_it(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "soak.py"), "--seconds", "14",
            "--warmup-s", "5", "--sessions", "4", "--sample-s", "2", "--no-plot",
            "--out", str(out),
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    counts = report["client_counts"]
    assert counts["responses"] > 0 and counts["sessions_opened"] > 1, counts
    assert counts["closed"] > 0 and counts["resumed"] > 0, counts
    assert report["server_log"]["tracebacks"] == 0, report["server_log"]
    assert report["idle_end"]["sessions_live"] == 0
    delta = report["idle_delta"]
    assert delta["tasks"] <= 2, delta  # every session's and socket's tasks ended
    assert delta["fds_total"] <= 2, delta
    assert delta["rss_mb_total"] < 40, delta
    assert delta["gc_objects"] < 20_000, delta  # garbage not yet collected included
    # after a full collection: what closed sessions left (trio's expired deadlines are
    # pruned at 1,000 stale entries of three objects each; a closed session is ~240)
    assert delta["gc_live"] < 3_000, delta
    # the load really ran: sessions were live, tasks and fds above the idle baseline
    assert report["under_load_range"]["sessions_live"][1] >= 2, report["under_load_range"]
    assert report["under_load_range"]["tasks"][1] > report["idle_baseline"]["tasks"]

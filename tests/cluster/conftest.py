"""Ray on this machine: every listener on 127.0.0.1 (set before ``ray`` is imported).

``duplex.cluster.LOOPBACK_ENV`` holds the same settings (``test_e2e_ray`` checks that
they agree); they are repeated here because importing ``duplex.cluster`` imports ray.
"""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

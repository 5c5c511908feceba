"""Policies for the robot endpoint's end-to-end tests, loaded with ``server.policy =
"tests.transport.openpi_policies:NAME"`` (the pluggable ``module:factory`` path)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from duplex.models import PolicyOptions, PolicyRequest


class Echo:
    """Answers each robot with what routing and batching did to its request."""

    def __init__(self, options: PolicyOptions) -> None:
        self.options = options

    @property
    def metadata(self) -> Mapping[str, Any]:
        return {"policy": "echo", "action_horizon": self.options.action_horizon}

    def infer_batch(self, requests: Sequence[PolicyRequest]) -> list[Any]:
        out: list[Any] = []
        for request in requests:
            if "boom" in request.observation:
                out.append(RuntimeError("do not show this to the robot"))
                continue
            state = np.asarray(request.observation.get("state", np.zeros(1)), np.float32)
            out.append(
                {
                    "actions": np.tile(state, (self.options.action_horizon, 1)),
                    "session": request.session_id,
                    "reset": np.bool_(request.reset),
                    "client": np.int64(request.client),
                    "batch": np.int64(len(requests)),
                }
            )
        return out


def echo(options: PolicyOptions) -> Echo:
    return Echo(options)

"""Ray as the cluster's control plane: the controller started or found, its table read.

Ray is told nothing per request or per frame: the controller's table is read once per
ingress refresh, and capacity reports are the controller's own polls.

On a machine whose only allowed traffic is loopback (tests, one-host trials), every
Ray listener must bind 127.0.0.1: ``LOOPBACK_ENV`` (set before ``ray`` is imported)
makes Ray take 127.0.0.1 as the node address, and ``node_ip_address="127.0.0.1"``
is passed to each node (docs/cluster.md, "One host").
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, Final

import ray
import trio
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._controller import CONTROLLER_NAME, NAMESPACE, Controller
from ._ingress import TableUnavailable
from ._placement import NodeReport

__all__ = ["LOOPBACK_ENV", "RayTable", "controller", "start_controller"]

LOOPBACK_ENV: Final = {
    # Ray's own switch for single-machine clusters: the node address is 127.0.0.1
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # no usage report leaves the machine
    "RAY_USAGE_STATS_ENABLED": "0",
}

TABLE_TIMEOUT_S = 5.0


def start_controller(
    serve_args: Sequence[str] = (),
    *,
    gpus_per_node: float = 0,
    poll_s: float = 0.5,
    drain_grace_s: float = 5.0,
    env: dict[str, str] | None = None,
) -> Any:
    """Start the cluster's controller (detached: it outlives this driver) on this Ray node
    (the head, where ``duplex cluster head`` runs: losing a worker machine must not take
    the control plane with it); its handle.

    Raises:
        ValueError: a controller already runs in this Ray cluster.
    """
    here = ray.get_runtime_context().get_node_id()
    return (
        ray.remote(Controller)
        .options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
            name=CONTROLLER_NAME,
            namespace=NAMESPACE,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=8,
            max_restarts=-1,  # a controller whose process dies is started again: it
            # takes its nodes back (`Controller._adopt`); `down` kills it for good
        )
        .remote(
            list(serve_args),
            gpus_per_node=gpus_per_node,
            poll_s=poll_s,
            drain_grace_s=drain_grace_s,
            env=env,
        )
    )


def controller() -> Any:
    """The running controller's handle.

    Raises:
        ValueError: none runs in the Ray cluster this driver is connected to.
    """
    return ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)


class RayTable:
    """The controller's node table, as an ingress reads it (``NodeTable``)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def nodes(self) -> list[NodeReport]:
        """Raises: TableUnavailable: the controller did not answer (Ray's head is gone)."""
        call = partial(ray.get, self.handle.table.remote(), timeout=TABLE_TIMEOUT_S)
        try:
            return list(await trio.to_thread.run_sync(call))
        except (RayError, GetTimeoutError) as exc:
            raise TableUnavailable(repr(exc)) from exc

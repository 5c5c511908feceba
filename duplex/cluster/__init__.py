"""duplex.cluster: duplex nodes on a Ray cluster (docs/cluster.md).

One node per GPU or host runs today's one-host server (``topology``) on its own
port, started and watched by a controller on Ray (``_controller``, ``_node``);
stateless ingress copies route each request to a node (``_ingress``) by a pure
placement (``_placement``). Ray carries the control plane only: frames go socket to
socket. Nothing below this package imports it.
"""

from ._cli import cluster_main, cluster_parser
from ._controller import CONTROLLER_NAME, NAMESPACE, NODE_RESOURCE, Controller, NodeRow
from ._ingress import Ingress, NodeTable, TableUnavailable, serve_ingress
from ._node import NodeServer, ServerReport
from ._placement import (
    Expired,
    Full,
    NodeReport,
    NodeState,
    Placed,
    Placement,
    PlacementStatistics,
    node_object_id,
    node_of_object,
    object_id_on,
)
from ._ray import LOOPBACK_ENV, RayTable, controller, start_controller

__all__ = [
    "CONTROLLER_NAME",
    "LOOPBACK_ENV",
    "NAMESPACE",
    "NODE_RESOURCE",
    "Controller",
    "Expired",
    "Full",
    "Ingress",
    "NodeReport",
    "NodeRow",
    "NodeServer",
    "NodeState",
    "NodeTable",
    "Placed",
    "Placement",
    "PlacementStatistics",
    "RayTable",
    "ServerReport",
    "TableUnavailable",
    "cluster_main",
    "cluster_parser",
    "controller",
    "node_object_id",
    "node_of_object",
    "object_id_on",
    "serve_ingress",
    "start_controller",
]

"""Robot policies over OpenPI's protocol: ``WS /v1/realtime/robot/openpi`` and ``WS /``."""

from ._serving import ROBOT_PATH, ROOT_PATH, RobotService, robot_routes

__all__ = ["ROBOT_PATH", "ROOT_PATH", "RobotService", "robot_routes"]

"""Run by OpenPI's own client (``openpi-client``, in its own virtual environment, numpy<2):
connect with ``WebsocketClientPolicy``, infer twice, reset, infer, print a JSON report.

Usage: python openpi_client_run.py WS_URL
       python openpi_client_run.py HOST PORT   (OpenPI's own form: it connects to ws://HOST:PORT/)
"""

import json
import sys

import numpy as np
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy


def observation(k):
    """A deterministic observation (no RNG: the server's numpy is another version)."""
    pixels = np.arange(224 * 224 * 3, dtype=np.int64).reshape(224, 224, 3)
    return {
        "observation/image": ((pixels * (k + 3)) % 251).astype(np.uint8),
        "observation/wrist_image": ((pixels * (k + 7)) % 241).astype(np.uint8),
        "observation/state": np.linspace(-1.0, 1.0, 8, dtype=np.float32) * (k + 1),
        "prompt": "pick up the red block",
    }


def main(*target):
    if len(target) == 2:  # as OpenPI's examples do: WebsocketClientPolicy(host, port)
        policy = WebsocketClientPolicy(target[0], int(target[1]))
    else:
        policy = WebsocketClientPolicy(host=target[0])
    report = {"metadata": policy.get_server_metadata(), "numpy": np.__version__, "results": []}
    for k in range(2):
        result = policy.infer(observation(k))
        actions = result["actions"]
        report["results"].append(
            {
                "shape": list(actions.shape),
                "dtype": actions.dtype.str,
                "actions": actions.astype(float).tolist(),
                "server_timing": result["server_timing"],
            }
        )
    # reset is not in OpenPI's client (its reset() is a no-op): send the endpoint by hand
    policy._ws.send(msgpack_numpy.packb({"endpoint": "reset"}))
    report["reset"] = msgpack_numpy.unpackb(policy._ws.recv())
    try:
        policy.infer({"observation/state": np.zeros(2, dtype=np.complex64)})
    except (ValueError, TypeError) as exc:  # openpi-client itself refuses to pack complex
        report["complex"] = type(exc).__name__
    policy._ws.send(b"\xc1\x00 not msgpack")
    report["bad_frame"] = msgpack_numpy.unpackb(policy._ws.recv())
    report["after_bad"] = list(policy.infer(observation(0))["actions"].shape)
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])

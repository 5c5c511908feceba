"""`ReferencePolicy`: a small seeded torch model that answers like a robot policy.

It stands in for a real checkpoint (no weights are ever downloaded): the
shapes and the work per batch are a policy's, the numbers are not. Each camera
image (uint8, H x W x 3, any size) is sampled on a 32 x 32 pixel lattice and
pooled to 4 x 4 x 3, the state vector is
cut or zero-padded to ``action_dim``, and an MLP with weights drawn from
``seed`` maps the lot to one action chunk of ``action_horizon x action_dim``
float32 values in [-1, 1]. A batch is one forward pass.

Observation keys (missing ones read as zeros; ``prompt`` is accepted and unused):
``observation/state``, ``observation/image``, ``observation/wrist_image``.
A request whose values have the wrong type or shape fails alone (its result is
the exception); the rest of its batch is answered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, final

import numpy as np

from ._policy import PolicyOptions, PolicyRequest, PolicyResult

__all__ = ["CAMERAS", "STATE_KEY", "ReferencePolicy"]

CAMERAS: Final = ("observation/image", "observation/wrist_image")
STATE_KEY: Final = "observation/state"
GRID: Final = 32
"""Each image is sampled on a GRID x GRID lattice of pixels..."""
POOLED: Final = 4
"""...then average-pooled to POOLED x POOLED per channel."""
HIDDEN: Final = 256
MAX_IMAGE_SIDE: Final = 4096
IMAGE_RESOLUTION: Final = (224, 224)
"""What the metadata asks robots to send (any size is read)."""


@final
class ReferencePolicy:
    """A seeded MLP over pooled camera images and the robot state.

    Args:
        options: device, seed and the action chunk's shape.
    """

    def __init__(self, options: PolicyOptions) -> None:
        import torch  # here, not at import: duplex.models loads without torch
        from torch import nn

        if options.action_horizon < 1 or options.action_dim < 1:
            raise ValueError("action_horizon and action_dim must be >= 1")
        self.options = options
        self.horizon = options.action_horizon
        self.dim = options.action_dim
        self._torch = torch
        self.device = torch.device(options.device)
        features = len(CAMERAS) * 3 * POOLED * POOLED + self.dim
        generator = torch.Generator().manual_seed(options.seed)
        layers = [nn.Linear(features, HIDDEN), nn.Linear(HIDDEN, HIDDEN)]
        layers.append(nn.Linear(HIDDEN, self.horizon * self.dim))
        for layer in layers:
            bound = 1.0 / layer.in_features**0.5
            with torch.no_grad():
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
        self.net = nn.Sequential(layers[0], nn.GELU(), layers[1], nn.GELU(), layers[2], nn.Tanh())
        self.net.to(self.device).eval()
        self._metadata: dict[str, Any] = {
            "policy": "duplex-reference",
            "action_horizon": self.horizon,
            "action_dim": self.dim,
            "action_space": "joint_position",
            "image_resolution": list(IMAGE_RESOLUTION),
            "cameras": list(CAMERAS),
            "state_key": STATE_KEY,
        }

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._metadata

    def features(self, observation: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """One observation's camera samples (cameras x GRID x GRID x 3, uint8) and state.

        Raises:
            ValueError: an image that is not uint8 H x W x 3, or a state that is not numbers.
        """
        images = np.stack([self._sampled(observation.get(key), key) for key in CAMERAS])
        return images, self._state(observation.get(STATE_KEY))

    @staticmethod
    def _sampled(image: Any, key: str) -> np.ndarray:
        if image is None:
            return np.zeros((GRID, GRID, 3), np.uint8)
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3:
            raise ValueError(f"{key} must be a uint8 H x W x 3 array")
        height, width, channels = image.shape
        if channels != 3 or not (0 < height <= MAX_IMAGE_SIDE and 0 < width <= MAX_IMAGE_SIDE):
            raise ValueError(f"{key} must be H x W x 3 with sides 1..{MAX_IMAGE_SIDE}")
        rows = np.linspace(0, height - 1, GRID).astype(np.intp)
        cols = np.linspace(0, width - 1, GRID).astype(np.intp)
        return image[np.ix_(rows, cols)]

    def _state(self, state: Any) -> np.ndarray:
        vector = np.zeros(self.dim, np.float32)
        if state is None:
            return vector
        if not isinstance(state, np.ndarray) or state.dtype.kind not in "biuf":
            raise ValueError(f"{STATE_KEY} must be a numeric array")
        values = state.astype(np.float32).ravel()[: self.dim]
        vector[: values.size] = values
        return vector

    def infer_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyResult]:
        """One forward pass over the requests whose observations read; the others fail."""
        torch = self._torch
        from torch.nn import functional as F

        results: list[PolicyResult] = [None] * len(requests)
        images: list[np.ndarray] = []
        states: list[np.ndarray] = []
        good: list[int] = []
        for index, request in enumerate(requests):
            try:
                image, state = self.features(request.observation)
            except ValueError as exc:
                results[index] = exc
                continue
            images.append(image)
            states.append(state)
            good.append(index)
        if not good:
            return results
        with torch.inference_mode():
            pixels = torch.from_numpy(np.stack(images)).to(self.device)  # B, cams, G, G, 3
            pixels = pixels.permute(0, 1, 4, 2, 3).flatten(0, 1).float() / 255.0
            pooled = F.adaptive_avg_pool2d(pixels, POOLED).reshape(len(good), -1)
            state = torch.from_numpy(np.stack(states)).to(self.device)
            chunks = self.net(torch.cat([pooled, state], dim=1)).view(-1, self.horizon, self.dim)
            actions = chunks.float().cpu().numpy()
        for row, index in enumerate(good):
            results[index] = {"actions": actions[row]}
        return results

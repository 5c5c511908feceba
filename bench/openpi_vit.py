"""A robot policy of realistic size for ``bench/openpi.py`` on a GPU (``--policy
bench.openpi_vit:factory``): seeded random weights, nothing downloaded.

A ViT-S/16-shaped encoder (width 384, 12 layers, 6 heads) over the two 224 x 224
cameras (196 patches each) and a state token, then an MLP action head producing
one ``action_horizon x action_dim`` chunk (50 x 32 by default in the bench). bf16 on
CUDA, float32 on CPU. A batch is one forward pass; a bad observation fails alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from duplex.models import PolicyOptions, PolicyRequest

CAMERAS = ("observation/image", "observation/wrist_image")
SIDE, PATCH, WIDTH, DEPTH, HEADS = 224, 16, 384, 12, 6


class VitPolicy:
    def __init__(self, options: PolicyOptions) -> None:
        torch.manual_seed(options.seed)
        self.device = torch.device(options.device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.horizon, self.dim = options.action_horizon, options.action_dim
        tokens = len(CAMERAS) * (SIDE // PATCH) ** 2 + 1
        self.patch = nn.Conv2d(3, WIDTH, PATCH, PATCH)
        self.state = nn.Linear(self.dim, WIDTH)
        self.position = nn.Parameter(torch.randn(1, tokens, WIDTH) * 0.02)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, activation="gelu", batch_first=True,
            norm_first=True,
        )  # fmt: skip
        self.encoder = nn.TransformerEncoder(layer, DEPTH, enable_nested_tensor=False)
        self.head = nn.Sequential(
            nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 1024), nn.GELU(),
            nn.Linear(1024, self.horizon * self.dim),
        )  # fmt: skip
        self.modules = nn.ModuleList([self.patch, self.state, self.encoder, self.head])
        self.modules.to(self.device, self.dtype).eval()
        self.position.data = self.position.data.to(self.device, self.dtype)
        self._metadata = {
            "policy": "vit-s16-random",
            "action_horizon": self.horizon,
            "action_dim": self.dim,
            "image_resolution": [SIDE, SIDE],
            "cameras": list(CAMERAS),
        }
        with torch.inference_mode():  # warm up (kernels, allocator)
            for batch in (1, 8, 32):
                self._forward(np.zeros((batch, 2, SIDE, SIDE, 3), np.uint8),
                              np.zeros((batch, self.dim), np.float32))  # fmt: skip

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._metadata

    def _forward(self, images: np.ndarray, states: np.ndarray) -> np.ndarray:
        batch = images.shape[0]
        pixels = torch.from_numpy(images).to(self.device, non_blocking=True)
        pixels = pixels.flatten(0, 1).permute(0, 3, 1, 2).to(self.dtype) / 255.0
        patches = self.patch(pixels).flatten(2).transpose(1, 2)  # B*2, 196, W
        patches = patches.reshape(batch, -1, WIDTH)
        state = self.state(torch.from_numpy(states).to(self.device, self.dtype)).unsqueeze(1)
        tokens = torch.cat([state, patches], dim=1) + self.position
        pooled = self.encoder(tokens).mean(dim=1)
        return self.head(pooled).float().view(batch, self.horizon, self.dim).cpu().numpy()

    def infer_batch(self, requests: Sequence[PolicyRequest]) -> list[Any]:
        results: list[Any] = [None] * len(requests)
        images, states, good = [], [], []
        for index, request in enumerate(requests):
            obs = request.observation
            try:
                cams = [np.asarray(obs[key]) for key in CAMERAS]
                if any(c.shape != (SIDE, SIDE, 3) or c.dtype != np.uint8 for c in cams):
                    raise ValueError("cameras must be 224 x 224 x 3 uint8")
                state = np.zeros(self.dim, np.float32)
                given = np.asarray(obs.get("observation/state", state), np.float32).ravel()
                state[: min(self.dim, given.size)] = given[: self.dim]
            except (KeyError, ValueError, TypeError) as exc:
                results[index] = exc
                continue
            images.append(np.stack(cams))
            states.append(state)
            good.append(index)
        if good:
            with torch.inference_mode():
                actions = self._forward(np.stack(images), np.stack(states))
            for row, index in enumerate(good):
                results[index] = {"actions": actions[row]}
        return results


def factory(options: PolicyOptions) -> VitPolicy:
    return VitPolicy(options)

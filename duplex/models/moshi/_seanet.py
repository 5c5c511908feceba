"""Causal convolutions with explicit streaming state, and the SEANet encoder/decoder.

Every convolution is functional about its state: it reads its buffer from a
`ConvState` and writes the replacement back, so one code path serves both the
whole-signal pass (start from `ConvState.fresh`) and per-slot streaming (the
caller gathers the listed slots' buffers and scatters them back). The state a
layer keeps is exactly the reference's (``moshi.modules.conv``):

- `CausalConv1d`: the last ``(kernel - 1) * dilation + 1 - stride`` input
  samples (zeros before the first frame, or the first sample repeated for
  ``replicate`` padding, the resampling conv's mode);
- `CausalConvTranspose1d`: the ``kernel - stride`` overlap samples of the
  output that the next input step still adds to (bias removed).

Module nesting reproduces the checkpoint names: ``encoder.model.{i}.conv.conv.weight``,
``encoder.model.{i}.block.{1,3}.conv.conv.weight``, ``decoder.model.{i}.convtr.convtr.weight``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import torch
from torch import nn

from ._mimi_config import MimiConfig

__all__ = [
    "CausalConv1d",
    "CausalConvTranspose1d",
    "ConvState",
    "SEANetDecoder",
    "SEANetEncoder",
    "StatefulConv",
]


@final
class ConvState:
    """The buffers of a run of stateful convolutions, read and replaced in layer order.

    Args:
        buffers: one ``[B, C, L]`` tensor per stateful layer, in forward order.
        first: ``[B]`` rows on their first frame (replicate padding restarts there).
    """

    def __init__(self, buffers: Sequence[torch.Tensor], first: torch.Tensor) -> None:
        self.buffers = list(buffers)
        self.first = first
        self._next = 0

    @staticmethod
    def fresh(
        layers: Sequence[StatefulConv], batch: int, *, device: torch.device, dtype: torch.dtype
    ) -> ConvState:
        """All-zero buffers (the state before a slot's first frame)."""
        buffers = [
            torch.zeros(batch, *layer.state_shape, device=device, dtype=dtype) for layer in layers
        ]
        return ConvState(buffers, torch.ones(batch, dtype=torch.bool, device=device))

    def read(self) -> torch.Tensor:
        """The current layer's buffer."""
        return self.buffers[self._next]

    def write(self, value: torch.Tensor) -> None:
        """Replace the current layer's buffer and move to the next layer."""
        self.buffers[self._next] = value
        self._next += 1


@final
class _Conv(nn.Module):
    """Holds the ``nn.Conv1d`` at ``.conv`` (the reference ``NormConv1d`` nesting)."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv = conv


@final
class _ConvTr(nn.Module):
    """Holds the ``nn.ConvTranspose1d`` at ``.convtr`` (``NormConvTranspose1d``)."""

    def __init__(self, convtr: nn.ConvTranspose1d) -> None:
        super().__init__()
        self.convtr = convtr


@final
class CausalConv1d(nn.Module):
    """Conv1d padded on the left by its own history; the output has ``T / stride`` steps.

    Args:
        replicate: pad the first frame with its first sample instead of zeros.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        replicate: bool = False,
    ) -> None:
        super().__init__()
        conv = nn.Conv1d(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )
        self.conv = _Conv(conv)
        self.stride = stride
        self.replicate = replicate
        self.history = (kernel_size - 1) * dilation + 1 - stride

    @property
    def state_shape(self) -> tuple[int, int]:
        """``(channels, samples)`` of the left-context buffer."""
        return (self.conv.conv.in_channels, self.history)

    def forward(self, x: torch.Tensor, state: ConvState) -> torch.Tensor:
        """``[B, C, T]`` -> ``[B, C', T / stride]``; ``T`` must be a multiple of the stride."""
        previous = state.read()
        if self.replicate:
            previous = torch.where(state.first[:, None, None], x[..., :1], previous)
        full = torch.cat([previous, x], dim=-1)
        state.write(full[..., full.shape[-1] - self.history :])
        return self.conv.conv(full)


@final
class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d whose output tail overlapping the next step is carried over."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        convtr = nn.ConvTranspose1d(
            in_channels, out_channels, kernel_size, stride, groups=groups, bias=bias
        )
        self.convtr = _ConvTr(convtr)
        self.overlap = kernel_size - stride

    @property
    def state_shape(self) -> tuple[int, int]:
        """``(channels, samples)`` of the pending overlap."""
        return (self.convtr.convtr.out_channels, self.overlap)

    def forward(self, x: torch.Tensor, state: ConvState) -> torch.Tensor:
        """``[B, C, T]`` -> ``[B, C', T * stride]``."""
        partial = state.read()
        convtr = self.convtr.convtr
        y = convtr(x)
        keep = y.shape[-1] - self.overlap
        tail = y[..., keep:]
        if convtr.bias is not None:
            tail = tail - convtr.bias[:, None]
        state.write(tail)
        head = y[..., : self.overlap] + partial
        return torch.cat([head, y[..., self.overlap : keep]], dim=-1)


StatefulConv = CausalConv1d | CausalConvTranspose1d


@final
class ResnetBlock(nn.Module):
    """``x + conv1x1(elu(conv_k(elu(x))))`` (true skip, halved hidden width)."""

    def __init__(self, dim: int, kernel_size: int, dilation: int, compress: int) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(
            nn.ELU(),
            CausalConv1d(dim, hidden, kernel_size, dilation=dilation),
            nn.ELU(),
            CausalConv1d(hidden, dim, 1),
        )

    def forward(self, x: torch.Tensor, state: ConvState) -> torch.Tensor:
        return x + _run(self.block, x, state)


def _run(layers: nn.Sequential, x: torch.Tensor, state: ConvState) -> torch.Tensor:
    for layer in layers:
        if isinstance(layer, CausalConv1d | CausalConvTranspose1d | ResnetBlock):
            x = layer(x, state)
        else:
            x = layer(x)
    return x


def _stateful(module: nn.Module) -> list[StatefulConv]:
    """Stateful convolutions in forward order (registration order matches it here)."""
    return [m for m in module.modules() if isinstance(m, CausalConv1d | CausalConvTranspose1d)]


@final
class SEANetEncoder(nn.Module):
    """Waveform ``[B, 1, T]`` -> latent ``[B, dimension, T / hop_length]``."""

    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        width = config.n_filters
        layers: list[nn.Module] = [CausalConv1d(1, width, config.kernel_size)]
        for ratio in reversed(config.ratios):
            layers += [_resnet(config, width, j) for j in range(config.n_residual_layers)]
            layers += [nn.ELU(), CausalConv1d(width, 2 * width, 2 * ratio, stride=ratio)]
            width *= 2
        layers += [nn.ELU(), CausalConv1d(width, config.dimension, config.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    @property
    def stateful(self) -> list[StatefulConv]:
        """Its stateful convolutions in the order they read `ConvState`."""
        return _stateful(self)

    def forward(self, x: torch.Tensor, state: ConvState) -> torch.Tensor:
        return _run(self.model, x, state)


@final
class SEANetDecoder(nn.Module):
    """Latent ``[B, dimension, T]`` -> waveform ``[B, 1, T * hop_length]``."""

    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        width = config.n_filters * 2 ** len(config.ratios)
        layers: list[nn.Module] = [CausalConv1d(config.dimension, width, config.kernel_size)]
        for ratio in config.ratios:
            layers += [
                nn.ELU(),
                CausalConvTranspose1d(width, width // 2, 2 * ratio, stride=ratio),
            ]
            width //= 2
            layers += [_resnet(config, width, j) for j in range(config.n_residual_layers)]
        layers += [nn.ELU(), CausalConv1d(width, 1, config.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    @property
    def stateful(self) -> list[StatefulConv]:
        """Its stateful convolutions in the order they read `ConvState`."""
        return _stateful(self)

    def forward(self, x: torch.Tensor, state: ConvState) -> torch.Tensor:
        return _run(self.model, x, state)


def _resnet(config: MimiConfig, width: int, index: int) -> ResnetBlock:
    dilation = config.dilation_base**index
    return ResnetBlock(width, config.residual_kernel_size, dilation, config.compress)

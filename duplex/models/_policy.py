"""The robot policy contract: what a policy takes and returns, and how one is named.

A policy maps a batch of observations to a batch of results in one call, so
a request engine (`RequestEngine`, ``_requests.py``, through `PolicyRunner`)
can run many robots' requests together. A policy written for one observation at a time (OpenPI's
``BasePolicy.infer``) is wrapped by `OneAtATime`.

``--policy`` names one: ``reference`` (`ReferencePolicy`, the built-in seeded
model), ``none`` (no robot endpoint), or ``module:factory``: any importable
callable that takes `PolicyOptions` and returns a `Policy`. The result is
checked against the contract at startup, never probed later.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, final, runtime_checkable

import numpy as np

from duplex.exceptions import ConfigError

__all__ = [
    "OneAtATime",
    "Policy",
    "PolicyOptions",
    "PolicyRequest",
    "PolicyResult",
    "PolicyRunner",
    "load_policy",
    "policy_factory",
]


@final
@dataclass(frozen=True, slots=True)
class PolicyRequest:
    """One robot's inference request.

    Args:
        observation: the robot's observation (str keys; arrays as read-only ndarrays).
        session_id: the robot's episode; policy state is keyed by ``(client, session_id)``.
        reset: start this session afresh (its first inference, or the first after a
            reset or a change of ``session_id``).
        client: the connection it came from (two robots may use the same ``session_id``).
    """

    observation: Mapping[str, Any] = field(repr=False)
    session_id: str = "default"
    reset: bool = False
    client: int = 0


PolicyResult: TypeAlias = Mapping[str, Any] | np.ndarray | Exception
"""What a policy returns for one request: a map of arrays (``{"actions": ...}``), an
ndarray, or an ``Exception`` instance when that request alone failed."""


@runtime_checkable
class Policy(Protocol):
    """A batched robot policy; its methods run off the event loop, one batch at a time."""

    @property
    def metadata(self) -> Mapping[str, Any]:
        """What a robot is told on connect (image resolution, cameras, action space, ...)."""
        ...

    def infer_batch(self, requests: Sequence[PolicyRequest]) -> Sequence[PolicyResult]:
        """One result per request, in order. Raising fails the whole batch."""
        ...


@final
class OneAtATime:
    """A `Policy` over an OpenPI-style ``infer(observation) -> dict``: a batch is a loop.

    Args:
        infer: the single-observation policy.
        metadata: what a robot is told on connect.
    """

    def __init__(
        self, infer: Callable[[Mapping[str, Any]], PolicyResult], metadata: Mapping[str, Any]
    ) -> None:
        self.infer = infer
        self._metadata = dict(metadata)

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._metadata

    def infer_batch(self, requests: Sequence[PolicyRequest]) -> list[PolicyResult]:
        results: list[PolicyResult] = []
        for request in requests:
            try:
                results.append(self.infer(request.observation))
            except Exception as exc:  # this request's failure, handed back as its result
                results.append(exc)
        return results


@final
class PolicyRunner:
    """A `Policy` as a `BatchRunner`: one policy call is one unit (it cannot be split).

    Args:
        policy: the batched policy.
        max_batch: the most requests one call takes.
    """

    name = "policy"

    def __init__(self, policy: Policy, *, max_batch: int = 64) -> None:
        self.policy = policy
        self.max_batch = max_batch

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The policy's metadata (what a robot is told on connect)."""
        return self.policy.metadata

    def run_batch(self, requests: Sequence[PolicyRequest], gate: object) -> Sequence[PolicyResult]:
        return self.policy.infer_batch(requests)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyOptions:
    """What a policy factory is given (from the server config).

    Args:
        device: torch device (``engine.model_device``).
        seed: weight seed (``server.model_seed``).
        action_horizon: steps per action chunk (``policy.action_horizon``).
        action_dim: values per action step (``policy.action_dim``).
    """

    device: str = "cpu"
    seed: int = 0
    action_horizon: int = 10
    action_dim: int = 8


def load_policy(name: str, options: PolicyOptions) -> Policy:
    """Build the policy ``name`` names (``reference`` or ``module:factory``).

    Raises:
        ConfigError: no such module or factory, or what it built is not a `Policy`.
    """
    if name == "reference":
        from ._policy_reference import ReferencePolicy

        return ReferencePolicy(options)
    policy = policy_factory(name)(options)
    if not isinstance(policy, Policy):
        raise ConfigError(
            f"policy.model: {name} returned a {type(policy).__name__}, which has no "
            "metadata and infer_batch (wrap a single-observation policy in "
            "duplex.models.OneAtATime)",
            key="policy.model",
        )
    return policy


def policy_factory(name: str) -> Callable[[PolicyOptions], Any]:
    """The callable ``module:factory`` names, imported but not called (checked at startup).

    Raises:
        ConfigError: not ``module:factory``, no such module, or no such callable.
    """
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(
            f"policy.model: {name!r} is not reference, none or module:factory", key="policy.model"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"policy.model: cannot import {module_name!r}: {exc}", key="policy.model"
        ) from None
    factory = vars(module).get(attribute)
    if not callable(factory):
        raise ConfigError(
            f"policy.model: {module_name!r} has no callable {attribute!r}", key="policy.model"
        )
    return factory

"""Diagnostic: ``duplex serve`` with a ``faulty-loopback`` model that crashes on demand.

    FAULT_FILE=F python bench/_faulty_serve.py serve --model faulty-loopback ...

The loopback model, except that an engine step raises while the file ``FAULT_FILE``
exists (the step removes it first, so one touch is one crash): an engine crash, as a
model that fails mid-step would cause, triggered from outside the process.
``bench/faults.py`` uses it. Only for the in-process engine (engine processes and
session shards import the model registry afresh and do not know this model).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from duplex.models import (
    LOOPBACK_SPEC,
    LoopbackRunner,
    ModelSpec,
    StepOutput,
    StepPlan,
    register_model,
)

SPEC = dataclasses.replace(LOOPBACK_SPEC, name="faulty-loopback")


class FaultOnDemand:
    """The loopback runner; a step raises once per touch of the fault file."""

    def __init__(self, spec: ModelSpec) -> None:
        self.inner = LoopbackRunner(spec)
        self.spec = spec
        self.path = os.environ["FAULT_FILE"]

    def reset_slot(self, slot: int) -> None:
        self.inner.reset_slot(slot)

    def execute(self, plan: StepPlan) -> StepOutput:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return self.inner.execute(plan)
        raise RuntimeError("injected engine fault (bench/_faulty_serve.py)")


def main() -> int:
    register_model(SPEC, FaultOnDemand)
    from duplex.cli import main as duplex_main

    return duplex_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

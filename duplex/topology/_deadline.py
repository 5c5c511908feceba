"""The process's last word on shutdown: it exits by ``shutdown_grace_s + 1`` whatever it holds.

The graceful path closes sockets, stops actors and waits for engines; each step has its
own timeout, but a worker thread inside one long kernel (a diffusion attention at a large
size runs for tens of seconds on a CPU), a C call that never returns, or a stop that
waits on another cannot be cancelled from trio, and ``trio.run`` does not return while
one is running. So once the shutdown starts, a daemon timer thread (which no blocked
event loop or GIL-releasing kernel holds back) logs what is left, kills the process's
children (engine processes, workers, shards) and ends the process with ``os._exit`` at
the deadline. A clean shutdown ends first, and exits at once
(`ExitDeadline.exit_now`) rather than through the interpreter's teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Final, final

from duplex.logs import get_logger

__all__ = ["EXIT_MARGIN_S", "ExitDeadline"]

EXIT_MARGIN_S: Final = 0.9
"""After the grace, the forced exit's own margin below ``shutdown_grace_s + 1``."""


@final
class ExitDeadline:
    """A forced exit ``seconds`` after `arm`; `disarm` (the clean end) cancels it.

    Args:
        code: the exit status of a forced exit (the shutdown was asked for: 0).
    """

    def __init__(self, code: int = 0) -> None:
        self._code = code
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        if self._timer is not None:
            return
        self._timer = threading.Timer(seconds, self._exit, args=(seconds,))
        self._timer.daemon = True
        self._timer.name = "duplex-exit-deadline"
        self._timer.start()

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def exit_now(self, code: int) -> None:
        """The shutdown ended cleanly: exit at once (streams flushed), without the
        interpreter's teardown. Its final garbage collection of a model server's heap took
        2-3 s on a loaded 2-core host, past the grace, with nothing left to do."""
        self.disarm()
        _kill_children()
        _flush()
        os._exit(code)

    def _exit(self, seconds: float) -> None:
        busy = sorted(
            thread.name
            for thread in threading.enumerate()
            if thread is not threading.current_thread() and thread.is_alive()
        )
        children = _kill_children()
        get_logger(component="server").warning(
            "shutdown past its grace; exiting now", after_s=round(seconds, 2),
            threads=busy[:20], children_killed=children,
        )  # fmt: skip
        _flush()
        os._exit(self._code)


def _kill_children() -> int:
    """SIGKILL every process this one started that is still running (engine processes,
    connection workers, shards: they ignore SIGINT and SIGTERM, their parent stops them),
    so none outlives it holding a device, a port or its stderr; returns how many."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(pid) for pid in f.read().split())
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()

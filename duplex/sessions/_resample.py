"""The sessions' resampler is the leaf module `duplex.resample` (the client uses it too)."""

from duplex.resample import StreamingResampler

__all__ = ["StreamingResampler"]

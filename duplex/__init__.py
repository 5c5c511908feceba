"""duplex: an event-driven actor runtime on trio for realtime full-duplex AI sessions."""

__version__ = "0.1.0"
__all__ = ["__version__"]

"""Resume credentials: a random bearer token kept only as its SHA-256 digest.

The token is 32 random bytes (urlsafe base64, 43 characters), handed to the
client once per attachment and rotated on every successful resume; the
session keeps only the digest and compares digests in constant time
(``hmac.compare_digest``), as vllm-omni's ``ResumeToken`` does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable

__all__ = ["ResumeCredential"]

TOKEN_BYTES = 32


class ResumeCredential:
    """Issues tokens and verifies them; never stores a token itself.

    Args:
        random_bytes: the randomness source (``os.urandom`` in production).
    """

    def __init__(self, random_bytes: Callable[[int], bytes]) -> None:
        self._random_bytes = random_bytes
        self._digest: bytes | None = None
        self.rotations = 0

    def issue(self) -> str:
        """A fresh token; the previous one stops working."""
        raw = self._random_bytes(TOKEN_BYTES)
        if len(raw) != TOKEN_BYTES:
            raise ValueError(f"random_bytes must return {TOKEN_BYTES} bytes")
        token = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
        self._digest = _digest(token)
        self.rotations += 1
        return token

    def verify(self, token: str) -> bool:
        """Constant-time check of ``token`` against the current digest."""
        if self._digest is None:
            return False
        return hmac.compare_digest(_digest(token), self._digest)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()

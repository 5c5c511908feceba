"""duplex.topology: the server's processes and the links between them.

The server process, its connection workers (``_frontend``/``_workers``), its
session shards (``_shard``/``_shards``) and its engine processes
(``_engine_process``/``_engine_client``), supervised by ``_children`` and joined by
``_link``. Sessions and wire protocols are the same code in every layout; this
package only decides where they run.
"""

from ._media import resolve_media
from ._server import resolve_model, resolve_policy, run_server, serve_duplex

__all__ = ["resolve_media", "resolve_model", "resolve_policy", "run_server", "serve_duplex"]

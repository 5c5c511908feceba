"""duplex.services: the request route families beside the sessions' routes.

One package per family, each a wire schema (``_protocol.py``, sans-I/O) and its
serving (``_serving.py``: the routes and the service they call): ``speech``
(``/v1/audio/speech*``), ``media`` (``/v1/images/*``, ``/v1/videos*``,
``/v1/realtime/video``) and ``robots`` (OpenPI). The topology builds the
services and hands their routes to the app (``duplex.transport.build_app``);
the app imports none of them.
"""

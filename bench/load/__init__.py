"""The load generator's process and everything it imports: no ``kserve``, no ``torch``.

:mod:`bench.load.generator` (``python -m bench.load.generator``, driven by
:class:`bench.matrix.cells.LoadClient`) sends closed-loop load;
:mod:`~bench.load.payloads` builds its tiles and request bodies for every
protocol; :mod:`~bench.load.probes` reads a server's metrics and who used the
CPU at a window's start and end. ``tritonclient.grpc`` and ``kserve`` register
the same protobuf symbols, so nothing here may import the server.
"""

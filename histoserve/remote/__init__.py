"""Talking to servers: the tile client, V2 REST and gRPC transports, dispatch and retries.

:class:`~histoserve.remote.client.HistoserveClient` (one call, one answer),
the transports of ``histoserve embed`` (httpx, ``tritonclient.grpc``),
credentials, ``Retry-After``, spreading requests over several servers, what a
server says it serves, and every answer checked against its request.
Imports ``wire/``, the root modules and its own modules: no slide, no file.
"""

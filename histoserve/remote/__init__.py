"""Talking to servers: the client core, V2 REST and gRPC transports, dispatch and retries.

:class:`~histoserve.remote.client.HistoserveClient` is the one core every
caller sends through (a notebook, ``histoserve embed``, ``histoserve
aggregate``): beneath it the transports (httpx, ``tritonclient.grpc``),
credentials, ``Retry-After``, spreading requests over several servers; in it
what a server says it serves, and every answer checked against its request.
Imports ``wire/``, the root modules and its own modules: no slide, no file.
"""

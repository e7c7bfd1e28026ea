"""The front door: the server process a client talks to.

KServe's ModelServer with histoserve's overrides (``app``: the FastAPI app,
the body limit, drain on SIGTERM), the sockets it listens on (``listeners``),
the gRPC server (``grpc_server``), the separate metrics port
(``metrics_port``), the one table from histoserve's errors to HTTP and gRPC
statuses (``edge``), the collector's settings while serving
(``gc_policy``) and ``--log_format json``'s lines (``json_logs``). KServe's own pieces it wires in (the data plane, the REST
fast path) are in :mod:`predictor.kserve`.
"""

"""The test-and-benchmark harness: what ``tests/`` and ``bench/`` both need, in one place.

Not shipped in the wheel (``pyproject.toml`` packages ``predictor*`` only) and
never imports a test module. Modules, one job each:

- :mod:`harness.server`: ``python -m predictor`` (or any server command) as a
  subprocess on free loopback ports: start, wait until ready, logs, stop;
- :mod:`harness.packages`: real demo ``.pt2`` packages, compiled once and
  cached on disk across sessions and processes;
- :mod:`harness.factories`: ``--module`` factories shared by several test modules;
- :mod:`harness.tiles`: synthetic tiles and their encodings;
- :mod:`harness.slides`: real tiled TIFF/SVS slides, each written once per process;
- :mod:`harness.waiting`: wait on a condition with a deadline (never a fixed sleep);
- :mod:`harness.reference`: the vendor's preprocessing and the package run
  in-process, the numerical truth tests compare servers against;
- :mod:`harness.grpc_client`: an outside ``tritonclient.grpc`` client in its own
  interpreter (it cannot share a process with kserve), with
  :mod:`harness.grpc_worker` as that interpreter's loop.

Importing the package imports none of them.
"""

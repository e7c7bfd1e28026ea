"""Several front-end processes, one device owner (``--frontends N``).

``supervisor`` runs the device owner (``owner``: every model's one batcher,
the device scheduler and the devices) and keeps N front ends (``frontend``:
HTTP, gRPC and stage 1 for every model), which reach the batchers through
``proxy`` (one proxy per model over one link) on a Unix socket, with tiles
and answers in shared memory (``shm``, ``segments``; the small messages in
``messages``); ``children`` starts and reaps them. ``process`` holds what
each process sets up before anything heavy is imported.
``docs/architecture.md`` ("Several front ends") has the design.
"""

"""Several front-end processes, one device owner (``--frontends N``).

``supervisor`` runs the device owner (``owner``: the model's one batcher and
the devices) and keeps N front ends (``frontend``: HTTP, gRPC and stage 1),
which reach the batcher through ``proxy`` over a Unix socket, with tiles and
answers in shared memory (``shm``; the small messages in ``messages``).
``process`` holds what each process sets up before anything heavy is
imported. ``docs/architecture.md`` ("Several front ends") has the design.
"""

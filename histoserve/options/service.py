"""The ``--priority`` option's help, shared by ``histoserve embed`` and ``aggregate``.

A cohort run is bulk work: it asks for the server's bulk class
(:data:`histoserve.limits.BULK_PRIORITY`) by default, so a viewer asking
with priority 1 goes ahead of its backlog.
"""

from __future__ import annotations

PRIORITY_HELP = (
    "class of service of every request: 1 interactive (most urgent), 2 bulk; "
    "0: the server's default"
)

"""``RoleError``: why a role cannot go on, said to its user as is.

No sockets. Raised by the role base class (refused by the broker, broker unreachable, out
of memory), by the checks of what a WELCOME may tell a role (``zrl.roles.trust``) and by
the roles themselves; the CLI prints it as one line, ``error: ...``.
"""

from __future__ import annotations


class RoleError(RuntimeError):
    """A role cannot go on (refused by the broker, broker unreachable, ...); user-facing."""


class ExperimentStopped(RoleError):
    """The broker says the experiment is over (its head stopped it): stop cleanly, exit 0."""

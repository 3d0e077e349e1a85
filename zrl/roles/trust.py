"""What a role takes from the broker's WELCOME, and what it refuses.

No sockets. A WELCOME comes from whoever answers at the broker's address; without keys
(CURVE) a role cannot tell its own broker from a forger. So what a WELCOME names is used
only within limits set by this process's own command line:

- ``checked_checkpoint_dir``: a role's files lie under its own checkpoint root (``zrl start
  --checkpoint-root``, else the working directory): in ``checkpoint.dir`` when that lies under
  the root (the head's own host, a shared filesystem), else in ``<root>/<run>`` (another host,
  where the head's path means nothing). Snapshots and checkpoints are read and written there.
- ``factories_from``: factory references are imported, and pickled factories unpickled,
  only from an authenticated broker (``broker_authenticated``: keys, or inproc from this
  process), or for references the role was given locally.
- ``checked_env_id``: an ``env.id`` that names a module (``package.module:Env-v0``, which
  gymnasium imports) likewise, only from an authenticated broker or when given locally.
- ``load_checkpoint_file``: what is read under ``checkpoint.dir`` is loaded without running
  code, within the file's own bytes (``check_stored_zip``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from zrl.config.factories import Factories, env_id_module
from zrl.roles.errors import RoleError
from zrl.transport import protocol as P
from zrl.transport.security import Keys


def broker_authenticated(broker: str, keys: Keys | None) -> bool:
    """Whether what the broker says comes from the user's own broker: CURVE proves its
    server key, and an inproc broker lives in this process."""
    return keys is not None or broker.startswith("inproc://")


RUN_CHECKPOINTS = "checkpoints"
"""The name of a head's checkpoint directory in its run directory (``RUN_DIR/checkpoints``)."""
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")


def run_name(d: str, fallback: str) -> str:
    """The run a ``checkpoint.dir`` belongs to, as one path component: the run directory's
    name for a head's ``RUN_DIR/checkpoints``, else the directory's own name; ``fallback``
    (the experiment's name) when that is no plain name (``/``, ``..``, odd characters)."""
    path = PurePosixPath(os.path.normpath(d))
    name = path.parent.name if path.name == RUN_CHECKPOINTS else path.name
    return name if _RUN_NAME.fullmatch(name) else fallback


def checked_checkpoint_dir(
    d: str | None, root: Path | None, broker: str, experiment: str = "experiment"
) -> str | None:
    """Where this role keeps its files (resolved), given the broker's ``checkpoint.dir``:
    that directory if it lies under this role's checkpoint root, else ``<root>/<run>``
    (``run_name``; ``experiment``: the config's name, when the directory's name will not
    do). None without a ``checkpoint.dir``: no role keeps files then.

    The root is ``root`` (``zrl start --checkpoint-root``; ``zrl run`` passes its run's
    checkpoint directory to the roles it starts), else the working directory. So a role on
    the head's host (or on a filesystem it shares) uses the head's checkpoints, and a role
    on another host, where the head's path does not exist, keeps its own under its root; a
    forged WELCOME can point no file outside the root (RoleError if ``<root>/<run>`` leads
    out of it through a link). An inproc broker's config comes from this process and is
    taken as is."""
    if d is None:
        return None
    if root is None:
        if broker.startswith("inproc://"):
            return d
        root = Path.cwd().resolve()
    resolved = Path(d).expanduser().resolve()
    if resolved.is_relative_to(root):
        return str(resolved)
    own = (root / run_name(d, experiment)).resolve()
    if not own.is_relative_to(root):
        raise RoleError(
            f"this role's checkpoint directory {root / run_name(d, experiment)} resolves to "
            f"{own}, not inside its checkpoint root {root}: refusing to read or write "
            "checkpoints there. Start the role with --checkpoint-root DIR naming another "
            "directory."
        )
    return str(own)


def factories_from(
    msg: P.Message, *, authenticated: bool, local_factories: dict[str, str]
) -> Factories:
    """The env/model factories a WELCOME names (references in ``factories``, pickles in the
    array ``factories``), if this role may take them; otherwise RoleError."""
    refs = msg.meta.get("factories") or {}
    if not isinstance(refs, dict) or not all(isinstance(v, str) for v in refs.values()):
        raise RoleError("the broker sent malformed factory references")
    # A reference imports a module and calls what it names ("os:abort" would do): without
    # an authenticated broker, only the references this role was given locally.
    if not authenticated:
        for kind, ref in refs.items():
            if local_factories.get(kind) != ref:
                raise RoleError(
                    f"the broker names the {kind} factory {ref!r} over an unauthenticated "
                    f"channel, and this role was not started with --{kind}-factory={ref}; "
                    "refusing to import it. Start every role with --keys DIR, or pass the "
                    f"same --{kind}-factory to `zrl start` (zrl run does so for its roles)."
                )
    pickled = msg.arrays.get("factories")
    if pickled is None:
        return Factories.from_wire(refs, None)
    # Unpickling runs code: only from a broker we authenticated (CURVE), or from our own
    # process (inproc), never from whoever answers on an open port.
    if not authenticated:
        raise RoleError(
            "the broker offers pickled env/model factories over an unauthenticated "
            "channel; refusing them. Start every role with --keys DIR, or give the "
            "factories as importable 'package.module:name' references."
        )
    return Factories.from_wire(refs, pickled.tobytes())


def checked_env_id(env_id: str, *, authenticated: bool, local_env_id: str | None) -> str:
    """The broker's ``env.id`` if this role may make it; otherwise RoleError. gymnasium imports
    the module of an id ``package.module:Env-v0`` (``this:Nope-v0`` imports ``this``), so
    without an authenticated broker only an id without a module, or the very id this role was
    given locally (``zrl start ROLE --env-id ID``)."""
    module = env_id_module(env_id)
    if module is None or authenticated or env_id == local_env_id:
        return env_id
    raise RoleError(
        f"the broker names env.id {env_id!r}, which imports the module {module!r}, over an "
        f"unauthenticated channel, and this role was not started with --env-id={env_id}; "
        "refusing to import it. Start every role with --keys DIR, or pass the same --env-id "
        "to `zrl start` (zrl run does so for its roles)."
    )


def check_stored_zip(path: Path) -> None:
    """RoleError unless ``path`` is a zip whose every entry is stored uncompressed (as
    ``torch.save`` writes them), so that loading it holds at most the file's own bytes: a
    compressed entry (a zip bomb: 3 MB on disk, 3 GB read) is refused from the zip directory
    before anything is read."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise RoleError(
            f"{path} is not a checkpoint zrl can load (not a torch zip archive: {exc}); "
            "move it away to start afresh"
        ) from None
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise RoleError(
                f"{path} is not a checkpoint zrl wrote: its entry {info.filename!r} is "
                f"compressed ({info.compress_size} bytes unpacking to {info.file_size}); "
                "move it away to start afresh"
            )


def load_checkpoint_file(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of a learner or params checkpoint: tensors, numbers,
    strings and containers only, never code (``checkpoint.dir`` comes from the broker), and
    never more than the file's own bytes (``check_stored_zip``). A file that is anything
    else stops the role naming it (also a RecursionError or MemoryError while reading it),
    and is left for the user: the role never saves over it."""
    import torch

    check_stored_zip(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file trips on, it is refused
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RoleError(
            f"{path} is not a checkpoint zrl can load without running code "
            f"({type(exc).__name__}: {first[:300]}); move it away to start afresh"
        ) from None
    if not isinstance(state, dict):
        raise RoleError(f"{path} is not a zrl checkpoint (it holds a {type(state).__name__})")
    return state

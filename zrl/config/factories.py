"""The env and model factories of an experiment: callables or ``"package.module:name"``.

A factory is either a callable or an importable reference ``"package.module:name"``.
References travel as strings. Callables are shipped to roles on other hosts as
cloudpickle bytes by the broker, and because unpickling runs code, only over
CURVE-authenticated sockets: ``zrl run`` makes a key directory for the run when a
script holds callables and no ``--keys`` was given.

A reference runs code too (it imports a module and calls what it names: ``os:abort``
would do), so a role imports the references of a WELCOME only when the broker is
authenticated (``--keys``) or in its own process, or when the role was given the same
reference locally: ``zrl start ROLE --env-factory REF --model-factory REF``. ``zrl run``
passes its script's references to the roles it starts (and prints them in the commands
for other hosts); otherwise the role refuses to start with a ``RoleError`` saying this.

An ``env.id`` of the form ``"package.module:Env-v0"`` is a reference too: gymnasium imports
the module to register the env (``env_id_module``). The same rule holds for it: a role makes
it only from an authenticated broker, or when it was given the same id locally: ``zrl start
ROLE --env-id ID`` (``zrl run`` passes its config's).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle

FACTORIES_FILE = "factories.pkl"  # pickled script factories in a run directory


def env_id_module(env_id: str) -> str | None:
    """The module gymnasium imports to make ``env_id`` (``"package.module:Env-v0"``: the module
    registers the env), or None for an id it looks up in its registry without importing."""
    module, sep, _ = env_id.partition(":")
    return module if sep else None


class FactoryError(ValueError):
    """A factory that cannot be resolved or shipped; user-facing."""


def resolve_reference(ref: str) -> Any:
    """``"package.module:name"`` -> the object it names."""
    if ":" not in ref:
        raise FactoryError(f"factory reference {ref!r} is not of the form package.module:name")
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise FactoryError(f"cannot import factory {ref!r}: {exc}") from None
    return obj


@dataclass
class Factories:
    """The env and model factories of an experiment (None: zrl's built-in ones)."""

    env: Callable[[], Any] | str | None = None
    model: Callable[..., Any] | str | None = None

    @property
    def callables(self) -> dict[str, Any]:
        return {k: v for k, v in (("env", self.env), ("model", self.model)) if callable(v)}

    @property
    def references(self) -> dict[str, str]:
        return {k: v for k, v in (("env", self.env), ("model", self.model)) if isinstance(v, str)}

    def needs_pickle(self) -> bool:
        return bool(self.callables)

    def pickled(self) -> bytes:
        return cloudpickle.dumps(self.callables)

    @classmethod
    def from_wire(cls, references: dict[str, str], pickled: bytes | None) -> Factories:
        """Rebuild what the broker sent. Only call with ``pickled`` from an authenticated peer."""
        values: dict[str, Any] = dict(references)
        if pickled:
            values.update(cloudpickle.loads(pickled))
        return cls(env=values.get("env"), model=values.get("model"))

    def env_fn(self) -> Callable[[], Any] | None:
        return resolve_reference(self.env) if isinstance(self.env, str) else self.env

    def model_fn(self) -> Callable[..., Any] | None:
        return resolve_reference(self.model) if isinstance(self.model, str) else self.model

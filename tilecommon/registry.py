"""Named extensions of one kind: a `Registry` maps names to objects in
registration order, and finds names it does not hold among the package entry
points of its group.

The built-in objects register themselves where they are defined, with the
decorator `REGISTRY.register(name)`; a third party either imports tileplan
and does the same, or declares an entry point in the registry's group
(`name = "module:object"`), loaded the first time the registry is asked for a
name it does not hold or for all its names.  An entry point that does not
load is a ConfigError naming it.  tileplan's registries: baseline policies,
proposal kinds and optimizers (planner.search.registry) and op kinds
(planner.ir.opkind).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from tilecommon.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named extensions of one kind (`what`), in registration order; `group`
    is the entry-point group searched for names not registered, `flag` the
    command-line flag (or field) that names them, for error messages."""

    def __init__(self, what: str, group: str, flag: str) -> None:
        self.what = what
        self.group = group
        self.flag = flag
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the object under `name` (re-registering the
        same object is a no-op; another object under a taken name is an error)."""
        def add(obj: T) -> T:
            old = self._items.get(name)
            if old is not None and old is not obj:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._items[name] = obj
            return obj
        return add

    def unregister(self, name: str) -> None:
        """Forget `name` (a test's own extension, once the test is done)."""
        self._items.pop(name, None)

    def _load_entry_points(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep in sorted(entry_points(group=self.group), key=lambda e: e.name):
            if ep.name in self._items:
                continue
            try:
                self._items[ep.name] = ep.load()
            except Exception as e:  # a broken plug-in names itself, not a traceback
                raise ConfigError(f"entry point group {self.group}", ep.name,
                                  f"{ep.value} does not load: {type(e).__name__}: {e}") from e

    def get(self, name: str) -> T:
        """The extension called `name`; ConfigError naming the known ones."""
        if name not in self._items:
            self._load_entry_points()
        if name not in self._items:
            raise ConfigError(self.flag, self.what, f"unknown; known: {self.names()}", name)
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        """Every registered name (entry points included), in registration order."""
        self._load_entry_points()
        return list(self._items)

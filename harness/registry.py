"""Generic typed registries with helpful errors.

Modelled on lm-evaluation-harness's registry: registering a name twice raises, looking up an
unknown name raises with the closest match and the list of valid choices. Plugins register at
import time; a registry may name the modules that populate it so that lookups import them
lazily (the heavy torch-uncertainty/timm imports only happen when a name is actually used).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """Base class for registry lookup and registration errors."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(RegistryError):
    """A name was registered twice in the same registry."""


class UnknownNameError(RegistryError):
    """A name was looked up that no plugin registered."""

    def __init__(self, message: str, name: str, choices: list[str], suggestion: str | None):
        super().__init__(message)
        self.name = name
        self.choices = choices
        self.suggestion = suggestion


def closest(name: str, choices: list[str]) -> str | None:
    """Return the choice most similar to ``name``, or None if nothing is close."""
    matches = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return matches[0] if matches else None


class Registry(Generic[T]):
    """A name → object mapping for one kind of plugin (methods, backbones, datasets).

    Args:
        kind: Human-readable kind used in error messages, e.g. ``"method"``.
        modules: Modules imported on first lookup; importing them registers the plugins.
    """

    def __init__(self, kind: str, modules: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._modules = modules
        self._loaded = not modules
        self._items: dict[str, T] = {}

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for mod in self._modules:
                importlib.import_module(mod)

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is omitted.

        Raises:
            DuplicateNameError: if ``name`` is already registered.
        """

        def add(item: T) -> T:
            if name in self._items:
                raise DuplicateNameError(
                    f"{self.kind} {name!r} is already registered "
                    f"(by {self._items[name]!r}); pick another name"
                )
            self._items[name] = item
            return item

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        """Look up ``name``.

        Raises:
            UnknownNameError: naming the closest match and every valid choice.
        """
        self._load()
        try:
            return self._items[name]
        except KeyError:
            choices = sorted(self._items)
            suggestion = closest(str(name), choices)
            hint = f" Did you mean {suggestion!r}?" if suggestion else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}.{hint} Valid choices: {', '.join(choices)}",
                str(name),
                choices,
                suggestion,
            ) from None

    def names(self) -> list[str]:
        """All registered names, sorted."""
        self._load()
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        self._load()
        yield from sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def __len__(self) -> int:
        self._load()
        return len(self._items)

"""Generic typed registries with helpful errors.

Modelled on lm-evaluation-harness's registry: registering a name twice raises, looking up an
unknown name raises with the closest match and the list of valid choices. Plugins register at
import time; a registry scans its packages lazily, on the first lookup (so the heavy
torch-uncertainty/timm imports only happen when a name is actually used).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from harness.contract.build import closest

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


class Registry(Generic[T]):
    """A name → object mapping for one kind of plugin (methods, backbones, datasets).

    Plugins register by being there: on the first lookup every module of ``packages`` whose name
    starts with ``prefix`` (and not with ``_``) is imported (``pkgutil`` scan), and importing a
    module registers what it defines. Nothing keeps a hand-written list of modules. Extra plugin
    packages come from :meth:`add_package` or the environment variable ``env`` (comma-separated
    package names importable from ``sys.path``), which worker processes inherit.

    Args:
        kind: Human-readable kind used in error messages, e.g. ``"method"``.
        packages: Packages scanned on first lookup.
        prefix: Only modules whose name starts with it are imported (``"backbones"``).
        env: Environment variable naming extra packages to scan.
    """

    def __init__(
        self,
        kind: str,
        packages: tuple[str, ...] = (),
        prefix: str = "",
        env: str | None = None,
    ) -> None:
        self.kind = kind
        self.prefix = prefix
        self.env = env
        self._packages = list(packages)
        self._scanned: set[str] = set()
        self._items: dict[str, T] = {}

    def add_package(self, package: str) -> None:
        """Scan ``package`` for plugins too (at the next lookup)."""
        if package not in self._packages:
            self._packages.append(package)

    def packages(self) -> list[str]:
        """The packages scanned: the built-in ones, then those added, then ``$env``'s."""
        extra = os.environ.get(self.env, "") if self.env else ""
        names = [p.strip() for p in extra.split(",") if p.strip()]
        return list(dict.fromkeys([*self._packages, *names]))

    def _load(self) -> None:
        for package in self.packages():
            if package in self._scanned:
                continue
            self._scanned.add(package)  # before importing: a plugin may look names up
            try:
                pkg = importlib.import_module(package)
            except ImportError as exc:
                raise RegistryError(
                    f"{self.kind} package {package!r} cannot be imported: {exc}"
                ) from exc
            for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
                if info.name.startswith("_") or not info.name.startswith(self.prefix):
                    continue
                importlib.import_module(f"{package}.{info.name}")

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

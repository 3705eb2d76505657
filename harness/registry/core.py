"""Generic typed registries with helpful errors.

Modelled on lm-evaluation-harness's registry: registering a name twice raises, looking up an
unknown name raises with the closest match and the list of valid choices. Plugins register at
import time; a registry scans its packages lazily, on the first lookup (so the heavy
torch-uncertainty/timm imports only happen when a name is actually used).

Plugins from outside the package come three ways, all honoured in worker processes and Slurm
tasks: installed distributions' entry points (groups ``harness.methods``, ``harness.backbones``,
``harness.datasets``, ``harness.metrics``, ``harness.trackers``, ``harness.figures``: each names a
module, or a package whose modules are all imported; ``harness.executors``: ``"module:Class"``,
imported when picked), modules named with ``--plugin MODULE`` (:func:`load_plugins`, which also
puts them in ``$HARNESS_PLUGINS`` so spawned workers and Slurm tasks import them too), and the
``HARNESS_METHOD_PACKAGES`` / ``_BACKBONE_`` / ``_DATASET_`` variables. The seven registries are
listed in :mod:`harness.registry`; what a plugin registers with, in :mod:`harness.plugins`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from harness.contract.build import closest
from harness.contract.env import PLUGINS, VARIABLES, Variable, module_names

T = TypeVar("T")

#: Comma-separated plugin modules every process imports before its first lookup.
PLUGINS_ENV = PLUGINS.name
_imported_plugins: set[str] = set()


def plugin_modules() -> list[str]:
    """The modules named in ``$HARNESS_PLUGINS``, in order.

    Raises:
        EnvError: an item is not a module name (``harness`` refuses it at start-up).
    """
    return PLUGINS.read([])


def import_plugins() -> None:
    """Import every module of ``$HARNESS_PLUGINS`` not imported yet (each registers what it
    defines).

    Raises:
        RegistryError: a module cannot be imported (naming it and why).
    """
    for module in plugin_modules():
        if module in _imported_plugins:
            continue
        _imported_plugins.add(module)  # before importing: the module may look names up
        try:
            importlib.import_module(module)
        except Exception as exc:  # a plugin may raise anything while importing
            _imported_plugins.discard(module)
            raise plugin_error(module, exc) from exc


def load_plugins(modules: Iterable[str]) -> None:
    """``--plugin MODULE``: import ``modules`` here and add them to ``$HARNESS_PLUGINS``, which
    spawned worker processes inherit and Slurm tasks are given (the Slurm executor exports it)."""
    modules = list(modules)
    for module in modules:
        if module in _imported_plugins:
            continue
        if module.endswith(".py") or os.sep in module or "/" in module:  # a path, not a name
            stem = os.path.splitext(os.path.basename(module))[0]
            raise RegistryError(
                f"--plugin {module!r}: a file path, not a module name: put its folder on "
                f"PYTHONPATH and pass --plugin {stem}"
            )
        try:
            importlib.import_module(module)
        except Exception as exc:  # a plugin may raise anything while importing
            raise plugin_error(module, exc) from exc
        _imported_plugins.add(module)
    names = list(dict.fromkeys([*plugin_modules(), *modules]))
    if names:
        os.environ[PLUGINS_ENV] = ",".join(names)


def module_file_state(module: str) -> tuple[str, int, int]:
    """(file, mtime_ns, size) of a module found without importing it (its parents are), or
    ``(module, -1, -1)`` when it cannot be found."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return (module, -1, -1)
    st = os.stat(spec.origin)
    return (spec.origin, st.st_mtime_ns, st.st_size)


def plugin_error(module: str, exc: BaseException, what: str = "plugin module") -> RegistryError:
    """One line for a plugin module that failed to import: its error and where it was raised
    (the innermost frame, usually in the plugin's own file), without the traceback. ``what``
    names the thing that named the module (``"method package"``, an entry point)."""
    return RegistryError(f"{what} {module!r} {import_failure(module, exc)}")


def import_failure(module: str, exc: BaseException) -> str:
    """``cannot be imported: <why>`` for a module that is not there, else ``raised <type> at
    <file>:<line> while importing: <first line of its message>``."""
    import traceback

    if isinstance(exc, ModuleNotFoundError) and exc.name == module:
        return f"cannot be imported: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"raised {type(exc).__name__}{where} while importing: {first}"


def entry_point_error(ep: importlib.metadata.EntryPoint, exc: BaseException) -> RegistryError:
    """One line for an installed distribution's entry point whose module failed to import: the
    entry point, its group, its module, the error, and the distribution to fix or uninstall."""
    module = ep.value.partition(":")[0].strip()
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) or (getattr(dist, "metadata", None) or {}).get("Name")
    fix = f"; fix or uninstall its distribution ({name})" if name else ""
    return RegistryError(
        f"entry point {ep.name!r} (group {ep.group}, module {module}) "
        f"{import_failure(module, exc)}{fix}"
    )


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
    """A name → object mapping for one kind of plugin: methods, backbones and datasets
    (:mod:`harness.registry`), executors (:mod:`harness.executors`), trackers
    (:mod:`harness.storage.loggers`), figures (:mod:`reports.figures.base`). Each is defined in
    the layer that uses it; all are found the same ways: the built-in modules, ``--plugin
    MODULE`` (``$HARNESS_PLUGINS``), the ``env`` packages, and installed entry points.

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
        group: Entry-point group of installed plugin distributions (``harness.methods``).
        modules: Modules imported on the first full lookup, for kinds whose built-ins are
            registered by one module rather than found by scanning a package (trackers,
            figures).
        entry_values: an entry point registers its *value* (``"module:Class"``) under its
            name, read from the distribution's metadata and imported only when used (the
            executors: a Slurm-like plugin's dependencies are not imported to list it);
            otherwise an entry point names a module (or package) that registers at import.
    """

    def __init__(
        self,
        kind: str,
        packages: tuple[str, ...] = (),
        prefix: str = "",
        env: str | None = None,
        group: str | None = None,
        modules: tuple[str, ...] = (),
        entry_values: bool = False,
    ) -> None:
        self.kind = kind
        self._modules = tuple(modules)
        self._entry_values = entry_values
        self.prefix = prefix
        self.env = env
        self.group = group
        self._entry_points_loaded = False
        self._packages = list(packages)
        self._built_in = frozenset(packages)
        self._scanned: set[str] = set()
        self._items: dict[str, T] = {}

    def add_package(self, package: str) -> None:
        """Scan ``package`` for plugins too (at the next lookup)."""
        if package not in self._packages:
            self._packages.append(package)

    def packages(self) -> list[str]:
        """The packages scanned: the built-in ones, then those added, then ``$env``'s."""
        return list(dict.fromkeys([*self._packages, *self._env_packages()]))

    def loaded(self) -> bool:
        """Whether this process scanned a package or registered an entry already."""
        return bool(self._scanned or self._items)

    def sources(self) -> list[tuple[str, int, int]]:
        """What the first lookup would import, found without importing it: (file, mtime_ns,
        size) of every module of every scanned package, then each entry point by name. Equal
        sources register equal entries, so a listing computed from them can be reused."""
        out = [module_file_state(m) for m in self._modules]
        for package in self.packages():
            try:
                spec = importlib.util.find_spec(package)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                out.append((package, -1, -1))
                continue
            for folder in spec.submodule_search_locations or []:
                for info in sorted(pkgutil.iter_modules([folder]), key=lambda i: i.name):
                    if not info.name.startswith("_") and info.name.startswith(self.prefix):
                        out.append(module_file_state(f"{package}.{info.name}"))
            out.append(module_file_state(package))
        if self.group:
            eps = importlib.metadata.entry_points(group=self.group)
            out += [(f"entry point {ep.name} = {ep.value}", 0, 0) for ep in eps]
        return out

    def load_modules(self) -> None:
        """Import the built-in ``modules`` (once): before a plugin registers, so that the
        built-ins come first in :meth:`registered` order whichever is imported first."""
        for module in self._modules:
            if module not in self._scanned:
                self._scanned.add(module)  # before importing: the module registers through us
                importlib.import_module(module)

    def _load(self) -> None:
        self.load_modules()
        for package in self.packages():
            if package in self._scanned:
                continue
            self._scanned.add(package)  # before importing: a plugin may look names up
            try:
                pkg = self._import_from(package, package)
                for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
                    if info.name.startswith("_") or not info.name.startswith(self.prefix):
                        continue
                    self._import_from(package, f"{package}.{info.name}")
            except Exception:
                self._scanned.discard(package)  # the next lookup says so again, never skips it
                raise
        self._load_entry_points()
        import_plugins()

    def _import_from(self, package: str, module: str) -> object:
        """Import ``module`` of the scanned ``package``. A package that is not there, and any
        error of a plugin package's module (from ``$env`` or :meth:`add_package`), is one
        :class:`RegistryError` naming the package, where it was named, the module and the
        error; a built-in module's own error (a bug) propagates as it is."""
        try:
            return importlib.import_module(module)
        except Exception as exc:  # a plugin may raise anything while importing
            from_env = package not in self._packages and package in self._env_packages()
            what = f"{self.kind} package {package!r}" + (f" (from ${self.env})" if from_env else "")
            if module == package and isinstance(exc, ImportError):
                raise RegistryError(f"{what} cannot be imported: {exc}") from exc
            if package in self._built_in:
                raise
            if module != package:
                what += ": module"
            raise plugin_error(module, exc, what) from exc

    def _env_packages(self) -> list[str]:
        """The packages ``$env`` names (the harness's variables are checked by their entry in
        harness.contract.env; a plugin's own registry may name another variable)."""
        if not self.env:
            return []
        var = VARIABLES.get(self.env) or Variable(self.env, "module names", module_names)
        return var.read([])

    def _load_entry_points(self) -> None:
        """Import the modules installed distributions declare in this registry's group (a
        package's modules are all imported), after the built-in ones so a clash names the
        plugin."""
        if not self.group or self._entry_points_loaded:
            return
        self._entry_points_loaded = True  # metadata is read once per process: it is slow
        for ep in importlib.metadata.entry_points(group=self.group):
            key = f"entry point {ep.name} = {ep.value}"
            if key in self._scanned:
                continue
            self._scanned.add(key)
            if self._entry_values:
                self._items.setdefault(ep.name, ep.value)  # a built-in or plugin name wins
                continue
            try:
                obj = ep.load()
                for info in pkgutil.iter_modules(getattr(obj, "__path__", [])):
                    if not info.name.startswith("_"):
                        importlib.import_module(f"{obj.__name__}.{info.name}")
            except Exception as exc:  # an installed plugin may raise anything while importing
                raise entry_point_error(ep, exc) from exc

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

    def _load_named(self, name: str) -> None:
        """Import only the module named like ``name`` in each scanned package (``methods.
        sigma_ens`` for ``sigma_ens``), then the ``$HARNESS_PLUGINS`` modules: a cell's process
        imports the method it runs, not every method (nor what their modules import)."""
        if name.isidentifier() and not name.startswith("_") and name.startswith(self.prefix):
            for package in self.packages():
                if package in self._scanned:
                    continue
                try:
                    found = importlib.util.find_spec(f"{package}.{name}") is not None
                except (ImportError, ValueError):  # the package itself is missing: _load says so
                    found = False
                if found:
                    self._import_from(package, f"{package}.{name}")
                    if name in self._items:
                        break
        import_plugins()

    def get(self, name: str) -> T:
        """Look up ``name``: from the module of the same name when there is one, else after
        the full scan (a module registering several names, a plugin package, an entry point).

        A name found in its own module is returned without scanning the rest, so that module
        and the ``$HARNESS_PLUGINS`` ones are the only ones imported; a clash with a name
        registered elsewhere shows on the full scan (``names()``, ``harness ls``, a suite's
        validation), never silently.

        Raises:
            UnknownNameError: naming the closest match and every valid choice.
        """
        if name not in self._items:
            self._load_named(str(name))
        if name not in self._items:
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

    def registered(self) -> list[tuple[str, T]]:
        """Every entry in the order it was registered (built-ins first, in their module's
        order; then plugins): for kinds whose order is shown, such as the page's figures."""
        self._load()
        return list(self._items.items())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._items

    def __len__(self) -> int:
        self._load()
        return len(self._items)

"""``harness ls``: the registered methods, backbones, datasets and corruption sets.

Listing them means importing every module that registers one (torch, torch-uncertainty, timm:
seconds). The text is kept in the user cache under a key made of everything that could change
it — each scanned module's path, modification time and size, the entry points, the
``--plugin``/``$HARNESS_PLUGINS`` modules, the versions of the harness, Python and
torch-uncertainty — found without importing any of them; an unchanged installation is listed
from that file. Editing or adding a method, backbone or dataset file changes the key.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from pathlib import Path

#: ``$HARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``)/implicit-ensemble-harness.
CACHE_ENV = "HARNESS_CACHE_DIR"


def cache_dir() -> Path:
    """Where ``harness ls`` keeps its listing."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "implicit-ensemble-harness" / "ls"


def listing_key() -> str:
    """A digest of every input of the listing, computed without importing a plugin."""
    import importlib.metadata

    import harness
    from harness.registry import BACKBONES, DATASETS, METHODS
    from harness.registry.core import module_file_state, plugin_modules

    try:
        tu = importlib.metadata.version("torch-uncertainty")  # corruption names come from it
    except importlib.metadata.PackageNotFoundError:
        tu = "absent"
    parts = {
        "versions": [harness.__version__, sys.version, tu],
        "registries": [r.sources() for r in (METHODS, BACKBONES, DATASETS)],
        "plugins": [module_file_state(m) for m in plugin_modules()],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def listing() -> str:
    """The text of ``harness ls``, from the registries (importing every plugin module)."""
    from harness.contract.build import field_doc
    from harness.data.corruption_sets import corruption_listing
    from harness.registry import BACKBONES, DATASETS, METHODS

    out = io.StringIO()
    out.write("methods:\n")
    for name, spec in METHODS.items():
        bbs = ", ".join(spec.backbones) if spec.backbones else "any backbone"
        hps = ", ".join(f"{n}={d!r}" for n, _, d, _ in field_doc(spec.hparams)) or "-"
        out.write(f"  {name:16s} {spec.reference}\n  {'':16s} backbones: {bbs}; hparams: {hps}\n")
    out.write("backbones:\n")
    for name, spec in BACKBONES.items():
        out.write(f"  {name:16s} {spec.description}\n")
    out.write("datasets:\n")
    for name, spec in DATASETS.items():
        kind = f"K={spec.num_classes}" if spec.num_classes else "OOD only"
        out.write(f"  {name:16s} {kind:9s} {spec.description}\n")
    out.write("corruption sets:\n")
    for name, description in corruption_listing():
        out.write(f"  {name:16s} {description}\n")
    return out.getvalue()


def executors_text() -> str:
    """The ``executors:`` block, computed each time (a name table: no import, nothing to cache)."""
    from harness.executors import executor_listing

    rows = "".join(f"  {name:16s} {line}\n" for name, line in executor_listing())
    return f"executors:\n{rows}"


def cmd_ls(args) -> int:
    """Print the listing: from the cache when nothing it depends on changed."""
    from harness.registry import BACKBONES, DATASETS, METHODS

    if any(r.loaded() for r in (METHODS, BACKBONES, DATASETS)):
        # This process registered entries already (a caller of main(), a test): the sources on
        # disk no longer say what the registries hold, so they are listed as they are.
        print(listing() + executors_text(), end="")
        return 0
    path = cache_dir() / f"{listing_key()}.txt"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        text = None
    if text is None:
        text = listing()
        _store(path, text)
    print(text + executors_text(), end="")
    return 0


def _store(path: Path, text: str) -> None:
    """Keep ``text`` as the only cached listing; a cache that cannot be written is skipped."""
    from harness.storage.safe_files import atomic_write

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob("*.txt"):
            if old != path:
                old.unlink(missing_ok=True)
        atomic_write(path, lambda f: f.write(text))
    except OSError:  # a read-only home: list without a cache
        pass

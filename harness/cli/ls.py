"""``harness ls``: the registered methods, backbones, datasets, corruption sets and metric columns.

Listing them means importing every module that registers one (torch, torch-uncertainty, timm:
seconds). The text is kept in the user cache (:mod:`harness.storage.user_cache`, ``ls/``) under
a key made of everything that could change it — each scanned module's path, modification time
and size (and the corruption-set table's: private machinery, which no scan sees), the entry
points, the ``--plugin``/``$HARNESS_PLUGINS`` modules, the versions of the harness, Python and
torch-uncertainty — found without importing any of them; an unchanged installation is listed
from that file. Editing or adding a method, backbone or dataset file
changes the key. The executors are listed after it, from their name table (no import).
"""

from __future__ import annotations

import io
import sys

#: The cache kind (folder under the user cache root) of the listing.
CACHE_KIND = "ls"
#: The module of the listing's corruption sets (their name table and benchmark sets).
CORRUPTION_SETS = "harness.data._machinery.corruption_sets"


def listing_key() -> str:
    """A digest of every input of the listing, computed without importing a plugin."""
    import importlib.metadata

    import harness
    from harness.registry import BACKBONES, DATASETS, METHODS, METRICS
    from harness.registry.core import module_file_state, plugin_modules
    from harness.storage.user_cache import digest

    try:
        tu = importlib.metadata.version("torch-uncertainty")  # corruption names come from it
    except importlib.metadata.PackageNotFoundError:
        tu = "absent"
    parts = {
        "versions": [harness.__version__, sys.version, tu],
        "registries": [r.sources() for r in (METHODS, BACKBONES, DATASETS, METRICS)],
        "plugins": [module_file_state(m) for m in plugin_modules()],
        # The corruption-set block's table: private machinery, so no registry's scan sees it.
        "corruption sets": module_file_state(CORRUPTION_SETS),
    }
    return digest(parts)


def listing() -> str:
    """The text of ``harness ls``, from the registries (importing every plugin module)."""
    from harness.contract.build import field_doc
    from harness.data._machinery.corruption_sets import corruption_listing
    from harness.registry import BACKBONES, DATASETS, METHODS, METRICS

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
    out.write("metrics:\n")  # the columns records hold and reports show, in their order
    for key, spec in METRICS.registered():
        notes = [
            spec.group,
            f"{spec.direction} is better" if spec.direction else "no better direction",
            *(["hidden by default"] if spec.hidden else []),
            "computed by a plugin" if spec.compute is not None else "built-in",
        ]
        out.write(f"  {key:16s} {spec.label} ({'; '.join(notes)})\n")
    return out.getvalue()


def executors_text() -> str:
    """The ``executors:`` block, computed each time (a name table: no import, nothing to cache)."""
    from harness.executors import executor_listing

    rows = "".join(f"  {name:16s} {line}\n" for name, line in executor_listing())
    return f"executors:\n{rows}"


def cmd_ls(args) -> int:
    """Print the listing: from the cache when nothing it depends on changed."""
    from harness.registry import BACKBONES, DATASETS, METHODS, METRICS

    if any(r.loaded() for r in (METHODS, BACKBONES, DATASETS, METRICS)):
        # This process registered entries already (a caller of main(), a test): the sources on
        # disk no longer say what the registries hold, so they are listed as they are.
        print(listing() + executors_text(), end="")
        return 0
    from harness.storage.user_cache import read_text, store_text

    key = listing_key()
    text = read_text(CACHE_KIND, key)
    if text is None:
        text = listing()
        store_text(CACHE_KIND, key, text)
    print(text + executors_text(), end="")
    return 0

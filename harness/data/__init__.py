"""Dataset plugins: ``ls harness/data`` is the list of dataset modules — each registers at least
one dataset in ``harness.registry.DATASETS`` on import (tests/harness/data/test_data_layout.py):
``digits`` (the built-in benchmark and its OOD sets), ``fashion_mnist``, ``torchvision_sets``
(CIFAR-10/100, SVHN, MNIST), ``photo_sets`` (Textures, Places365, TinyImageNet), ``ood_28``
(28×28 OOD sets), ``imagenet``, ``imagenet_ood`` (OpenOOD's ImageNet OOD sets) and ``sst2``
(SST-2 and its text OOD sets). The machinery they share — specs and registration, loaders,
corruptions, downloads — lives in the private package ``_machinery``, which the registry's scan
skips."""

from typing import Any

#: What a dataset plugin writes against (docs/architecture.md, "A dataset — one file"), public
#: here so no plugin imports the private machinery. Resolved on first use (PEP 562): importing
#: ``harness.data`` for one of its modules must not import torch (the CLI's fast paths).
__all__ = ["DatasetSpec", "ImageSet", "default_data_root", "register_dataset"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from harness.data._machinery import base

        return getattr(base, name)
    raise AttributeError(f"module 'harness.data' has no attribute {name!r}")

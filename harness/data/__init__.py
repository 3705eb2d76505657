"""Dataset plugins: ``ls harness/data`` is the list of dataset modules — each registers at least
one dataset in ``harness.registry.DATASETS`` on import (tests/harness/data/test_data_layout.py):
``digits`` (the built-in benchmark and its OOD sets), ``fashion_mnist``, ``torchvision_sets``
(CIFAR-10/100, SVHN, MNIST), ``photo_sets`` (Textures, Places365, TinyImageNet), ``ood_28``
(28×28 OOD sets), ``imagenet``, ``imagenet_ood`` (OpenOOD's ImageNet OOD sets) and ``sst2``
(SST-2 and its text OOD sets). The machinery they share — specs and registration, loaders,
corruptions, downloads — lives in the private package ``_machinery``, which the registry's scan
skips."""

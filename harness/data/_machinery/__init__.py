"""What the dataset modules of :mod:`harness.data` are built from (not datasets: nothing here
registers, and the registry's scan skips this package).

``base`` (``DatasetSpec``, ``register_dataset``, the split kinds, ``LoaderOptions``, the data
root), ``loader`` (``make_loader``: the one place a loader is made; the device-resident image
loader), ``file_loader`` (image files decoded in DataLoader workers: ImageNet), ``text``
(tokenisers and token-id splits: SST-2), ``corruption_sets`` (which corruptions exist and which
this machine can generate), ``corruptions`` (published and generated corrupted test sets),
``sources`` (download declarations) and ``download`` (``harness data download``).
"""

"""``harness ls``: the registered methods, backbones, datasets and corruption sets."""

from __future__ import annotations


def cmd_ls(args) -> int:
    from harness.contract.build import field_doc
    from harness.registry import BACKBONES, DATASETS, METHODS

    print("methods:")
    for name, spec in METHODS.items():
        bbs = ", ".join(spec.backbones) if spec.backbones else "any backbone"
        hps = ", ".join(f"{n}={d!r}" for n, _, d, _ in field_doc(spec.hparams)) or "-"
        print(f"  {name:16s} {spec.reference}\n  {'':16s} backbones: {bbs}; hparams: {hps}")
    print("backbones:")
    for name, spec in BACKBONES.items():
        print(f"  {name:16s} {spec.description}")
    print("datasets:")
    for name, spec in DATASETS.items():
        kind = f"K={spec.num_classes}" if spec.num_classes else "OOD only"
        print(f"  {name:16s} {kind:9s} {spec.description}")
    from harness.data.corruption_sets import corruption_listing

    print("corruption sets:")
    for name, description in corruption_listing():
        print(f"  {name:16s} {description}")
    return 0

"""``harness bench``: training and evaluation throughput and peak memory, side by side.

All methods run in one process on synthetic data of the backbone's input shape: the plain
backbone at batch B and at M·B (the bound for any shared-backbone ensemble: its images/s ÷ M,
since each input image costs M backbone passes), σN-Ens, FiLM-Ensemble, the deep ensemble
(torch-uncertainty's loop, and CUDA streams), BatchEnsemble, Packed-Ensembles and MC Dropout.
Throughput counts input images seen by the ensemble per second, after warm-up, with device
synchronisation; on GPU with bf16 autocast and channels_last. Results are printed with their
ratio to the bound and written as JSON with provenance.

``--loop synthetic`` (the default) times a bare training step on one fixed batch;
``--loop real`` also times every row through the real training loop (``train_epoch``, the
recipe's optimizer and schedule, the device loader with augmentation; see
:func:`harness.engine.cost.real_loop_throughput`) and adds the ratio real/synthetic as a column.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.config.suite import expand_hparams
from harness.contract import Recipe
from harness.contract.build import parse_name_values
from harness.engine.cost import real_loop_throughput, throughput
from harness.engine.environment import environment, resolve_device
from harness.engine.graphed import step_mode
from harness.engine.train import SYNC_EVERY
from harness.registry import METHODS
from harness.storage.safe_files import atomic_write
from methods._base import BuildContext
from methods._triton import current_mode as sigma_kernels

LOOPS = ("synthetic", "real")

DEFAULT_METHODS = [
    ("sigma_ens", {}),
    ("film_ensemble", {}),
    ("deep_ensemble", {"parallel": "loop"}),
    ("deep_ensemble", {"parallel": "streams"}),
    ("batch_ensemble", {}),
    ("packed_ensemble", {"alpha": 2, "gamma": 2}),
    ("mc_dropout", {"dropout_rate": 0.1}),
]


def bench_one(
    name: str,
    hp: dict[str, Any],
    m: int,
    batch: int,
    in_shape: tuple[int, ...],
    classes: int,
    backbone: str,
    device: torch.device,
    recipe: Recipe,
    steps: int,
    warmup: int,
    compile_model: bool,
    loop: str = "synthetic",
    val_images: int = 1000,
    augment: str = "crop_flip",
) -> dict[str, Any]:
    """Build one method on the backbone and measure it (see :func:`run_bench`)."""
    spec = METHODS.get(name)
    params = expand_hparams(spec, hp)[0]
    torch.manual_seed(0)
    model = spec.build(BuildContext(backbone, in_shape, classes, m), spec.make_hparams(params))
    model.to(device)
    if recipe.channels_last and device.type == "cuda":
        model.to(memory_format=torch.channels_last)
    if compile_model:
        model.compile()
    x = torch.randn(batch, *in_shape, device=device)
    if recipe.channels_last and device.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (batch,), device=device)
    out = throughput(model, x, y, recipe, device, steps=steps, warmup=warmup)
    if loop == "real":
        out.update(
            real_loop_throughput(
                model,
                recipe,
                device,
                batch,
                in_shape,
                classes,
                steps=steps,
                warmup=warmup,
                streams=spec.feeding_for(params).streams(m),  # the runner's loader does the same
                val_images=val_images,
                augment=augment,
            )
        )
        out["real_ratio_to_synthetic"] = out["real_train_images_per_s"] / out["train_images_per_s"]
    out["params"] = sum(p.numel() for p in model.parameters())
    del model, x, y
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def run_bench(
    backbone: str,
    m: int,
    batch: int,
    image_size: int,
    classes: int,
    steps: int,
    warmup: int,
    compile_model: bool,
    methods: list[tuple[str, dict]],
    device: torch.device,
    loop: str = "synthetic",
    on_row: Callable[[dict[str, Any]], None] | None = None,
    cuda_graph: str = "auto",
    channels: int | None = None,
    val_images: int = 1000,
    augment: str = "crop_flip",
) -> dict[str, Any]:
    """Every row of the table: the plain backbone at B and at M·B (the bound ÷ M), then each
    method at M members and batch B.

    Args:
        loop: ``"synthetic"`` times the bare step only; ``"real"`` also times the real training
            loop and adds ``real_train_images_per_s`` and ``real_ratio_to_synthetic``.
        on_row: called with the result so far (``complete`` False) after every measured row,
            so that a run killed at its time limit keeps what it measured.
        cuda_graph: the recipe's ``cuda_graph`` for the real loop ("auto": a replayed CUDA
            graph on CUDA unless ``compile_model``; "off": eager steps).
        channels: input channels (None: 1 for ``digits_cnn``, else 3).
        val_images: with ``loop="real"``, the synthetic split whose evaluation is timed.
        augment: with ``loop="real"``, the loader's training augmentation, as the suite's
            recipe ("none" or "crop_flip").
    """
    # Length: a flat sequence of table rows (the plain backbone at B and M·B, then one row per
    # method), a few lines each; a helper per row would only move the list elsewhere.
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {LOOPS}, got {loop!r}")
    in_ch = channels if channels is not None else (1 if backbone == "digits_cnn" else 3)
    in_shape = (in_ch, image_size, image_size)
    # compile: the training step too (harness.engine.train.step_loss), not only forward
    recipe = Recipe(amp=True, channels_last=True, compile=compile_model, cuda_graph=cuda_graph)
    common = dict(
        in_shape=in_shape,
        classes=classes,
        backbone=backbone,
        device=device,
        recipe=recipe,
        steps=steps,
        warmup=warmup,
        compile_model=compile_model,
        loop=loop,
        val_images=val_images,
        augment=augment,
    )
    rows: list[dict[str, Any]] = []
    result = {
        "provenance": {
            **environment(device),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "bf16_autocast": device.type == "cuda",
            "channels_last": device.type == "cuda",
            "compile": compile_model,
            "step_mode": step_mode(recipe, device)[0],  # of the real loop
            "sigma_kernels": sigma_kernels(),  # σNorm: auto (Triton on CUDA) or reference
        },
        "config": {
            "backbone": backbone,
            "M": m,
            "batch": batch,
            "image_size": image_size,
            "classes": classes,
            "steps": steps,
            "warmup": warmup,
            "loop": loop,
            "channels": in_ch,
            "val_images": val_images,
            "augment": augment,
            "sync_every": SYNC_EVERY,  # host reads of the real loop: one per this many steps
        },
        "rows": rows,
        "complete": False,
    }

    def add(row: dict[str, Any]) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(result)

    plain_b = bench_one("single", {}, 1, batch, **common)
    add(
        {
            "label": f"plain backbone, batch {batch}",
            "method": "single",
            "M": 1,
            "batch": batch,
            **plain_b,
        }
    )
    plain_mb = bench_one("single", {}, 1, m * batch, **common)
    bound = {
        "train_images_per_s": plain_mb["train_images_per_s"] / m,
        "eval_images_per_s": plain_mb["eval_images_per_s"] / m,
        "peak_train_mem_mib": plain_mb["peak_train_mem_mib"],
    }
    # The bound's row prints the ÷ M figures its label names (the ratios of every other row
    # are to them); the plain backbone's own rates at M·B stay in the JSON under mb_*.
    add(
        {
            "label": f"plain backbone, batch {m * batch} (= M·B): bound ÷ M",
            "method": "single",
            "M": 1,
            "batch": m * batch,
            **{k: v for k, v in plain_mb.items() if not k.startswith("real_")},
            "train_images_per_s": bound["train_images_per_s"],
            "eval_images_per_s": bound["eval_images_per_s"],
            "mb_train_images_per_s": plain_mb["train_images_per_s"],
            "mb_eval_images_per_s": plain_mb["eval_images_per_s"],
            "bound_train_images_per_s": bound["train_images_per_s"],
            "bound_eval_images_per_s": bound["eval_images_per_s"],
            **(
                {"real_train_images_per_s": plain_mb["real_train_images_per_s"] / m}
                if "real_train_images_per_s" in plain_mb
                else {}
            ),
            **{
                k: v
                for k, v in plain_mb.items()
                if k.startswith("real_")
                and k not in ("real_train_images_per_s", "real_eval_ms_per_1k")
            },
            # per 1,000 *input* images the bound evaluates M·1,000, as an ensemble's M rows do
            **(
                {"real_eval_ms_per_1k": plain_mb["real_eval_ms_per_1k"] * m}
                if plain_mb.get("real_eval_ms_per_1k") is not None
                else {}
            ),
        }
    )
    for name, hp in methods:
        try:
            res = bench_one(name, hp, m, batch, **common)
        except Exception as exc:  # one method failing must not lose the other rows
            add(
                {
                    "label": name,
                    "method": name,
                    "hparams": hp,
                    "M": m,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
            continue
        label = name + (f" ({', '.join(f'{k}={v}' for k, v in hp.items())})" if hp else "")
        row = {"label": label, "method": name, "hparams": hp, "M": m, "batch": batch, **res}
        row["train_ratio_to_bound"] = res["train_images_per_s"] / bound["train_images_per_s"]
        row["eval_ratio_to_bound"] = res["eval_images_per_s"] / bound["eval_images_per_s"]
        if res["peak_train_mem_mib"] and bound["peak_train_mem_mib"]:
            row["train_mem_ratio_to_bound"] = (
                res["peak_train_mem_mib"] / bound["peak_train_mem_mib"]
            )
        add(row)
    result["complete"] = True
    return result


# The table's columns: (header, row key, format); the real-loop ones only with ``--loop real``.
COLUMNS = [
    ("train img/s", "train_images_per_s", "rate"),
    ("eval img/s", "eval_images_per_s", "rate"),
    ("train MiB", "peak_train_mem_mib", "{:,.0f}"),
    ("train/bound", "train_ratio_to_bound", "{:.3f}"),
    ("eval/bound", "eval_ratio_to_bound", "{:.3f}"),
    ("mem/bound", "train_mem_ratio_to_bound", "{:.3f}"),
]
REAL_COLUMNS = [
    ("real img/s", "real_train_images_per_s", "rate"),
    ("real MiB", "real_peak_train_mem_mib", "{:,.0f}"),
    ("real/synth", "real_ratio_to_synthetic", "{:.3f}"),
]


def columns(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The columns of ``result``'s table (the real-loop ones when it was measured)."""
    return COLUMNS + (REAL_COLUMNS if result["config"].get("loop") == "real" else [])


def cell(row: dict[str, Any], key: str, fmt: str) -> str:
    """One formatted value; ``-`` where it does not apply (memory on a CPU, ratios of the
    bound's own rows). ``fmt="rate"``: whole numbers, but two significant digits below 10 (tiny
    CPU checks) so that no rate prints as 0."""
    value = row.get(key)
    if value is None:
        return "-"
    if fmt == "rate":
        return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"
    return fmt.format(value)


def format_rows(result: dict[str, Any]) -> str:
    """The printed table: one line per row, the columns of :func:`columns`."""
    cols = columns(result)
    width = [max(len(h), 10) for h, _, _ in cols]
    lines = [f"{'':52s} " + " ".join(f"{h:>{w}s}" for (h, _, _), w in zip(cols, width))]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['label']:52s} failed: {r['error']}")
            continue
        values = [f"{cell(r, k, f):>{w}s}" for (_, k, f), w in zip(cols, width)]
        lines.append(f"{r['label'][:52]:52s} " + " ".join(values))
    return "\n".join(lines)


def epoch_estimate(row: dict[str, Any], steps: int, val: int) -> float | None:
    """Seconds of one epoch of ``steps`` steps and ``val`` validation images, from a real-loop
    row's phases: the steps, the method's diagnostics, the validation (None without them)."""
    need = ("real_step_ms", "real_diagnostics_s", "real_eval_ms_per_1k")
    if any(row.get(k) is None for k in need):
        return None
    return (
        steps * row["real_step_ms"] / 1e3
        + row["real_diagnostics_s"]
        + val * row["real_eval_ms_per_1k"] / 1e6
    )


def format_phases(result: dict[str, Any], epoch_steps: int | None, epoch_val: int) -> str:
    """The real loop's per-phase table: a step (the bound's row: its M·B step, what any
    shared-backbone ensemble's step costs at best), the regulariser's part of it, the method's
    per-epoch diagnostics, the evaluation per 1,000 images (validation, final evaluation) and,
    with ``epoch_steps``, one epoch's estimate and its ratio to the bound's."""
    head = ["step ms", "L_div ms", "diag s/ep", "eval ms/1k"]
    if epoch_steps:
        head += [f"epoch s ({epoch_steps} st, {epoch_val} val)", "epoch/bound"]
    width = [max(len(h), 10) for h in head]
    lines = [
        f"{'per phase (--loop real)':52s} " + " ".join(f"{h:>{w}s}" for h, w in zip(head, width))
    ]
    bound = next((r for r in result["rows"] if "bound_train_images_per_s" in r), None)
    bound_epoch = epoch_estimate(bound, epoch_steps, epoch_val) if bound and epoch_steps else None
    for r in result["rows"]:
        if "error" in r or "real_step_ms" not in r:
            continue
        values = [
            cell(r, "real_step_ms", "{:,.1f}"),
            cell(r, "real_regulariser_ms", "{:,.1f}"),
            cell(r, "real_diagnostics_s", "{:.3f}"),
            cell(r, "real_eval_ms_per_1k", "{:,.1f}"),
        ]
        if epoch_steps:
            est = epoch_estimate(r, epoch_steps, epoch_val)
            values.append("-" if est is None else f"{est:.2f}")
            ratio = est / bound_epoch if est is not None and bound_epoch else None
            values.append("-" if ratio is None or r is bound else f"{ratio:.3f}")
        lines.append(
            f"{r['label'][:52]:52s} " + " ".join(f"{v:>{w}s}" for v, w in zip(values, width))
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        device = resolve_device(args.device)
    except ValueError as exc:  # an unknown name, or a GPU this machine does not have
        print(f"harness bench: error: --device: {exc}", file=sys.stderr)
        return 2
    if args.epoch_steps and args.loop != "real":  # the estimate is made of real-loop phases
        print("harness bench: error: --epoch-steps needs --loop real", file=sys.stderr)
        return 2
    real_only = [
        f for f, v in (("--augment", args.augment), ("--val-images", args.val_images)) if v
    ]
    if real_only and args.loop != "real":  # they shape the real loop only: never ignored silently
        print(f"harness bench: error: {' and '.join(real_only)} need --loop real", file=sys.stderr)
        return 2
    if args.epoch_val and not args.epoch_steps:
        print("harness bench: error: --epoch-val needs --epoch-steps", file=sys.stderr)
        return 2
    out = Path(args.output)
    if out.is_dir() or not str(args.output).strip():  # said now, not after the first row
        print(f"harness bench: error: -o {args.output!r}: not a file path", file=sys.stderr)
        return 2
    if out.parent.exists() and not out.parent.is_dir():
        print(f"harness bench: error: -o {args.output}: {out.parent} is not a folder",
              file=sys.stderr)  # fmt: skip
        return 2
    methods = (
        [parse_name_values(t, "method") for t in args.methods] if args.methods else DEFAULT_METHODS
    )

    def write(partial: dict[str, Any]) -> None:  # after every row: a kill keeps the measured
        atomic_write(out, lambda f: f.write(json.dumps(partial, indent=1) + "\n"))

    result = run_bench(
        args.backbone,
        args.M,
        args.batch,
        args.image_size,
        args.classes,
        args.steps,
        args.warmup,
        args.compile,
        methods,
        device,
        loop=args.loop,
        on_row=write,
        cuda_graph=args.cuda_graph,
        channels=args.channels,
        val_images=args.val_images or 1000,
        augment=args.augment or "crop_flip",
    )
    print(
        f"harness bench: {args.backbone}, M={args.M}, B={args.batch}, loop={args.loop} "
        f"({result['provenance']['step_mode']} steps), "
        f"{result['provenance']['device']}"
    )
    print(format_rows(result))
    if args.loop == "real":
        print(format_phases(result, args.epoch_steps, args.epoch_val))
        if args.epoch_steps:
            for r in result["rows"]:
                est = epoch_estimate(r, args.epoch_steps, args.epoch_val)
                if est is not None:
                    r["real_epoch_estimate_s"] = est
            result["config"]["epoch_steps"] = args.epoch_steps
            result["config"]["epoch_val"] = args.epoch_val
    write(result)
    print(f"wrote {out}")
    return 0 if not any("error" in r for r in result["rows"]) else 1

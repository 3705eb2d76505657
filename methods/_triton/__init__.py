"""Fused Triton kernels for the σNorm layers, and the one place that decides when they run.

The PyTorch implementation in ``methods/_sigma/batchnorm.py`` is the specification and the CPU
path; the kernels in :mod:`methods._triton.sigma_bn` compute the same function in fewer launches
on CUDA (two per layer forward and backward in training, one in evaluation). Why hand-written
kernels: no library ships a batch normalization whose statistics are per member of a batched
ensemble with a gated per-member affine (cuDNN's and Apex's BatchNorm reduce over the whole
batch; torch-uncertainty loops over members), and on a GPU the eager σNorm layer was many
generic kernels per layer and the host could not launch them fast enough (docs/benchmarks.md).

Selection (:func:`use_kernels`): the kernels run when the tensor is on CUDA, Triton imports,
the code is not being traced by ``torch.compile`` (Inductor generates its own fused kernels from
the reference path) and :func:`kernels` has not been set to ``"reference"``. ``TRITON_INTERPRET=1``
(Triton's CPU interpreter, set before Triton is first imported) lets the tests run the same
kernels on CPU tensors: they call the kernels directly or set :func:`kernels` to ``"triton"``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from functools import cache

import torch

from harness.contract.env import SIGMA_KERNEL_MODES, SIGMA_KERNELS

log = logging.getLogger("harness")

#: "auto": the kernels on CUDA, the reference elsewhere; "triton": the kernels wherever Triton
#: can run them (CUDA, or any device under TRITON_INTERPRET=1); "reference": never.
MODES = SIGMA_KERNEL_MODES
#: The process's default: ``HARNESS_SIGMA_KERNELS`` (the GPU benchmark times the reference path
#: with it, ``reference``), else "auto". A value outside MODES is an ``EnvError`` naming the
#: variable (``harness`` refuses it before any command runs: harness.contract.env).
ENV = SIGMA_KERNELS.name
_mode: str = SIGMA_KERNELS.read("auto")
#: Whether the fallback of a "triton" request this machine cannot honour was said (once).
_fallback_said = False


@cache
def triton_available() -> bool:
    """Whether ``import triton`` would succeed (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    """Whether Triton runs its kernels in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def current_mode() -> str:
    """The mode :func:`kernels` set ("auto" unless changed)."""
    return _mode


@contextlib.contextmanager
def kernels(mode: str) -> Iterator[None]:
    """Run σNorm layers with ``mode`` inside the block ("auto", "triton" or "reference"); used
    by the benchmark to time both paths in one process and by the tests on the CPU."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"σNorm kernel mode must be one of {MODES}, got {mode!r}")
    before, _mode = _mode, mode
    try:
        yield
    finally:
        _mode = before


def use_kernels(x: torch.Tensor) -> bool:
    """Whether the σNorm layer seeing ``x`` runs the Triton kernels (module docstring)."""
    if _mode == "reference" or torch.compiler.is_compiling():
        return False
    if triton_available() and x.is_cuda:
        return True
    if triton_available() and _mode == "triton" and interpreted() and x.device.type == "cpu":
        return True
    if _mode == "triton":
        _say_fallback(x)
    return False


def _say_fallback(x: torch.Tensor) -> None:
    """Say once per process that "triton" was asked for and what runs instead: a request this
    machine cannot honour (no Triton, no CUDA) is neither an error nor silently ignored."""
    global _fallback_said
    if _fallback_said:
        return
    _fallback_said = True
    if not triton_available():
        why = "Triton is not installed"
    elif x.device.type == "cpu":
        why = "the tensors are on the CPU (no CUDA; TRITON_INTERPRET=1 runs Triton on the CPU)"
    else:
        why = f"Triton has no kernels for {x.device.type} tensors"
    source = f"{ENV}=triton" if SIGMA_KERNELS.raw() == "triton" else "kernels('triton')"
    log.warning(
        "%s asks for the σNorm Triton kernels, but %s: the σNorm layers run the PyTorch "
        "reference path instead",
        source,
        why,
    )

"""A record's ``environment`` block: the processor, its kernel flags and the libraries torch's
kernels come from (docs/records.md, ``environment``), read once per process and ``None`` where
the system does not say, never an error."""

from __future__ import annotations

import json

import pytest
import torch

from harness.engine import environment as env

#: /proc/cpuinfo as an x86 Linux guest writes it (two processors, flags abridged).
X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c rdrand avx2 avx512f avx512bw \
avx512vl avx512_bf16 avx512_vnni vmx

processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c rdrand avx2 avx512f avx512bw \
avx512vl avx512_bf16 avx512_vnni vmx
"""
#: ... and as an Arm (aarch64) machine does: ``Features``, and no model name.
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm \
sve sve2 bf16 i8mm
CPU implementer\t: 0x41
"""

#: torch.__config__.show() of an MKL build (abridged) and of one with OpenBLAS and no MKL.
MKL_BUILD = """PyTorch built with:
  - GCC 13.3
  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64 \
architecture applications
  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd69a3df32adcccb623b12cd7baa22)
  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, LAPACK_INFO=mkl, USE_MKL=ON,
"""
OPENBLAS_BUILD = """PyTorch built with:
  - GCC 11.2
  - Build settings: BLAS_INFO=open, BUILD_TYPE=Release, LAPACK_INFO=open, USE_MKL=OFF,
"""


@pytest.fixture
def fresh(monkeypatch):
    """The per-process reading cleared before and after, so a test's machine stays its own."""
    env._process.cache_clear()
    yield monkeypatch
    env._process.cache_clear()


def test_the_kernel_flags_are_the_few_that_pick_kernels_in_a_fixed_order():
    """Only :data:`KERNEL_FLAGS` (not ``fpu``, ``vmx``, ``rdrand``…), in that tuple's order
    whatever order /proc/cpuinfo lists them in; Arm's ``Features`` line is read the same way."""
    assert env.cpu_flags(X86) == (
        "sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16"
    )
    assert env.cpu_flags(ARM) == "asimd sve sve2 bf16 i8mm"
    assert env.cpu_flags("processor\t: 0\nflags\t\t: fpu vme\n") == ""  # a line, none of ours


def test_the_model_name_comes_from_cpuinfo_else_the_platform(monkeypatch):
    """``model name`` where Linux writes it; an Arm machine's /proc/cpuinfo has none, and a
    machine without /proc/cpuinfo none at all: then ``platform.processor()``, else the
    architecture."""
    assert env.cpu_model(X86) == "AMD EPYC 7B13"
    monkeypatch.setattr(env.platform, "processor", lambda: "")
    monkeypatch.setattr(env.platform, "machine", lambda: "aarch64")
    assert env.cpu_model(ARM) == "aarch64"
    monkeypatch.setattr(env, "_cpuinfo", lambda: None)
    monkeypatch.setattr(env.platform, "processor", lambda: "arm")
    assert env.cpu_model() == "arm"


def test_the_libraries_are_read_from_torchs_build_description():
    """MKL's and oneDNN's versions and the BLAS from ``torch.__config__.show()``; a build
    without MKL or oneDNN gives None for them, not an error."""
    assert env.torch_libraries(MKL_BUILD) == {"blas": "mkl", "mkl": "2024.2", "onednn": "3.12.0"}
    assert env.torch_libraries(OPENBLAS_BUILD) == {"blas": "open", "mkl": None, "onednn": None}
    assert env.torch_libraries("") == {"blas": None, "mkl": None, "onednn": None}
    found = env.torch_libraries(torch.__config__.show())  # this torch: whatever it says, a text
    assert all(v is None or (isinstance(v, str) and v) for v in found.values())


def test_numpys_blas_is_none_where_numpy_does_not_say(monkeypatch):
    """numpy before 1.26 has no ``show_config(mode=...)`` (a TypeError), a build may lack the
    entry: None either way."""
    import numpy as np

    def old(*args, **kwargs):
        raise TypeError("show_config() got an unexpected keyword argument 'mode'")

    monkeypatch.setattr(np, "show_config", old)
    assert env.numpy_blas() is None
    monkeypatch.setattr(np, "show_config", lambda mode: {"Build Dependencies": {}})
    assert env.numpy_blas() is None
    blas = {"name": "openblas", "version": "0.3.27"}
    monkeypatch.setattr(np, "show_config", lambda mode: {"Build Dependencies": {"blas": blas}})
    assert env.numpy_blas() == "openblas 0.3.27"


def test_a_cpu_record_names_the_machine_and_is_json_ready(fresh):
    """The new fields are in every record, as texts (or None), and the block survives JSON."""
    block = env.environment(torch.device("cpu"))
    for key in ("cpu", "cpu_flags", "blas", "mkl", "onednn", "numpy_blas", "cudnn"):
        assert key in block, key
    assert block["cudnn"] is None  # asked of a GPU cell only
    assert block["threads"] == torch.get_num_threads()
    assert block["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert all(v is None or isinstance(v, str | int) for v in block.values())
    assert json.loads(json.dumps(block)) == block


def test_without_proc_cpuinfo_the_missing_fields_are_none(fresh):
    """On a system without /proc/cpuinfo (macOS, Windows) and a torch that names no library,
    the block is still written: the fields it cannot know are None."""
    fresh.setattr(env, "_cpuinfo", lambda: None)
    fresh.setattr(torch.__config__, "show", lambda: "")
    fresh.setattr(env, "numpy_blas", lambda: None)
    block = env.environment(torch.device("cpu"))
    assert block["cpu_flags"] is None and block["numpy_blas"] is None
    assert (block["blas"], block["mkl"], block["onednn"]) == (None, None, None)
    assert block["cpu"]  # the platform's answer, at worst the architecture


def test_the_machine_is_read_once_per_process(fresh):
    """A grid writes a record per cell: /proc/cpuinfo, the package metadata and torch's build
    description are read for the first, not again (the thread count is read every time: a
    cell may set it, and ``device`` says it)."""
    first = env.environment(torch.device("cpu"))

    def reread(*args, **kwargs):
        raise AssertionError("read again")

    for name in ("cpu_flags", "cpu_model", "torch_libraries", "numpy_blas", "_version"):
        fresh.setattr(env, name, reread)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        again = env.environment(torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert again["threads"] == 1 and again["device"].endswith(" 1 threads)")
    per_cell = {"threads", "device"}
    assert {k: v for k, v in again.items() if k not in per_cell} == {
        k: v for k, v in first.items() if k not in per_cell
    }


def test_a_gpu_record_names_cudnn(fresh):
    """cuDNN's version is asked for a cell on a GPU (on a machine without one, torch's calls
    stood in for), and its failure to load leaves None, not a failed cell."""
    fresh.setattr(torch.cuda, "current_device", lambda: 0)
    fresh.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    env._cudnn.cache_clear()
    fresh.setattr(torch.backends.cudnn, "version", lambda: 92400)
    try:
        block = env.environment(torch.device("cuda"))
        assert block["device"] == "cuda:0 NVIDIA H200" and block["cudnn"] == 92400
        env._cudnn.cache_clear()

        def broken() -> int:
            raise RuntimeError("cuDNN version incompatibility")

        fresh.setattr(torch.backends.cudnn, "version", broken)
        assert env.environment(torch.device("cuda"))["cudnn"] is None
    finally:
        env._cudnn.cache_clear()

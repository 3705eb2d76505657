"""The σNorm Triton kernels compiled for A100 (sm_80) and H100/H200 (sm_90) on a machine without
a GPU, by benchmarks/triton_aot.py (CI runs every case; these tests its ``--quick`` subset).

The subset: ResNet-18's first σN-Ens layer ((4·128, 64, 32, 32)), every kernel the launcher calls
for it (training forward: 2, backward: 2, evaluation: 1), bf16 channels_last and fp32 NCHW, both
archs: 20 real compilations with Triton's compiler and its bundled ptxas, about 10 s on 2 cores.
The script runs in a subprocess: it installs a stand-in CUDA driver for the whole process, and
this process's Triton runs in its CPU interpreter (tests/conftest.py), where kernels cannot
compile. The limit checks and the case naming are also tested in-process on stand-in compiled
kernels, where each limit can be crossed on purpose.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "triton_aot.py"


def _nvidia_tools() -> bool:
    """Triton with its CUDA backend's ptxas and cuobjdump (the CUDA wheels bundle both)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    bin_dir = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
    return (bin_dir / "ptxas").exists() and (bin_dir / "cuobjdump").exists()


needs_triton = pytest.mark.skipif(
    not _nvidia_tools(), reason="Triton's CUDA backend (ptxas, cuobjdump) is not installed"
)

KERNELS = ("_stats_partial", "_forward_apply", "_backward_partial", "_backward_apply",
           "_eval_apply")  # fmt: skip
PHASES = {"_stats_partial": "train-fwd", "_forward_apply": "train-fwd",
          "_backward_partial": "train-bwd", "_backward_apply": "train-bwd",
          "_eval_apply": "eval-fwd"}  # fmt: skip
COMBOS = {("bf16", "channels_last"), ("fp32", "nchw")}
SM80_SMEM = 163 * 1024  # bytes per block, A100 (the smaller of the two archs' limits)


def run_script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def aot():
    """The script as a module, for its checks on stand-in kernels (imports nothing heavy)."""
    spec = importlib.util.spec_from_file_location("triton_aot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["triton_aot"] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["triton_aot"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> dict:
    """The --quick run for both archs (once per module): its JSON document."""
    out = tmp_path_factory.mktemp("triton_aot") / "quick.json"
    proc = run_script("--arch", "80", "90", "--quick", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-4000:]
    return json.loads(out.read_text())


# ----------------------------------------------------------------------- real compilations


@needs_triton
def test_every_kernel_compiles_for_both_archs_without_spills(quick):
    rows = quick["rows"]
    assert quick["failed"] == 0 and quick["archs"] == [80, 90]
    got = {(r["kernel"], r["arch"], r["dtype"], r["layout"]) for r in rows}
    assert got == {(k, a, d, lay) for k in KERNELS for a in (80, 90) for d, lay in COMBOS}
    assert len(rows) == 20
    for r in rows:
        case = f"{r['kernel']} sm_{r['arch']} {r['dtype']} {r['layout']}"
        assert r["problems"] == [], case
        assert r["n_spills"] == 0, case
        assert 0 < r["n_regs"] <= 255, case
        assert 0 <= r["smem_bytes"] <= SM80_SMEM, case
        assert r["smem_bytes"] == r["smem_dynamic"] + r["smem_static"], case
        assert r["phase"] == PHASES[r["kernel"]], case
    # Each (kernel, arch, dtype, layout) is its own binary: nothing was deduplicated away
    # wrongly, and nothing compiled twice.
    assert quick["distinct_compilations"] == quick["compilations_run"] == 20
    assert len({(r["arch"], r["binary"]) for r in rows}) == 20


@needs_triton
def test_compiled_with_the_launchers_meta_parameters(quick):
    """Grid, block sizes and constexprs are those methods._triton.sigma_bn's own geometry picks
    for the layer's input (the script records the launcher's launches; this recomputes them)."""
    from methods._triton.sigma_bn import _BLOCK_K, _Geometry

    for r in quick["rows"]:
        assert r["shape"] == [512, 64, 32, 32] and r["variant"] == "sigma"
        fmt = torch.channels_last if r["layout"] == "channels_last" else torch.contiguous_format
        x = torch.empty(r["shape"], device="meta", memory_format=fmt)
        geo = _Geometry(x, 4)
        meta = r["meta"]
        assert r["grid"] == list(geo.grid)
        assert (meta["BLOCK_R"], meta["BLOCK_C"]) == (geo.block_r, geo.block_c)
        assert meta["num_warps"] == 4  # Triton's default: the launcher passes none
        if r["kernel"] in ("_forward_apply", "_backward_apply"):
            assert meta["BLOCK_K"] == _BLOCK_K
        if r["kernel"] in ("_forward_apply", "_backward_apply", "_eval_apply"):
            assert meta["HAS_GAMMA"] is True  # σN-Ens's gate
        if r["kernel"] == "_forward_apply":  # momentum 0.1, running statistics tracked
            assert (meta["UPDATE"], meta["CMA"]) == (True, False)
        if r["kernel"] == "_backward_apply":
            assert meta["NEEDS_DX"] is True
        # The unit stride became a constant of the binary: the pixels' in NCHW, the channels'
        # in channels_last.
        unit = "stride_s" if r["layout"] == "nchw" else "stride_c"
        assert r["specialised"] == {unit: 1}
    # The two layouts walk the tensor differently: channels_last takes 64 contiguous channels.
    blocks = {r["layout"]: (r["meta"]["BLOCK_R"], r["meta"]["BLOCK_C"]) for r in quick["rows"]}
    assert blocks == {"nchw": (256, 16), "channels_last": (64, 64)}


@needs_triton
def test_a_spill_fails_the_run_and_names_the_case(tmp_path):
    """Registers capped at 32 (Triton's maxnreg) force every kernel to spill: exit status 1,
    one line per case naming it, and the spill in the JSON."""
    out = tmp_path / "spill.json"
    proc = run_script("--arch", "80", "--quick", "--maxnreg", "32", "--json", str(out))
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert (
        "FAIL _backward_apply sm_80 bf16 channels_last resnet18 C=64 32x32 sigma train-bwd: "
        "spills: " in proc.stderr
    )
    assert "10 of 10 cases failed" in proc.stderr
    doc = json.loads(out.read_text())
    assert doc["failed"] == 10
    assert all(r["n_regs"] <= 32 and r["n_spills"] > 0 for r in doc["rows"])


# ---------------------------------------------------------------------------------- misuse


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arch", "75"], "unknown arch '75': choose from 80 (A100), 90 (H100/H200)"),
        (["--arch", "80", "sm_100"], "unknown arch 'sm_100'"),
        (["--arch", "ampere"], "unknown arch 'ampere'"),
        ([], "the following arguments are required: --arch"),
        (["--arch", "90", "--jobs", "0"], "--jobs must be ≥ 1, got 0"),
    ],
)
def test_usage_errors_exit_2_with_the_reason(args, message):
    proc = run_script(*args, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""  # refused before anything compiled


def test_arch_spellings(aot):
    assert [aot.parse_arch(a) for a in ("80", "sm_90", "SM80", "sm90")] == [80, 90, 80, 90]


def test_kernels_imported_under_the_interpreter_are_refused_clearly(aot):
    """In a process whose Triton interprets (these tests' own, on a machine without CUDA), the
    kernels are not compilable objects; the script says so instead of compiling nothing."""
    from methods._triton import interpreted

    if not interpreted():
        pytest.skip("Triton compiles in this process (CUDA without TRITON_INTERPRET)")
    with pytest.raises(RuntimeError, match="imported under TRITON_INTERPRET=1"), aot.recording([]):
        pass


# -------------------------------------------------- the limit checks, on stand-in kernels


def stand_in_case(aot, kernel: str = "_backward_apply"):
    layer = aot.Layer("odd", (7, 5, 5), None)
    fn = SimpleNamespace(arg_names=["X", "stride_c", "BLOCK_R"])
    launch = aot.Launch(kernel, fn, (4, 1, 50), (), {"BLOCK_R": 512}, "train-bwd")
    return aot.Case(layer, "bf16", "channels_last", "sigma", launch)


def stand_in_kernel(shared: int = 1024, num_warps: int = 4):
    md = SimpleNamespace(shared=shared, num_warps=num_warps, num_stages=3, hash="ab" * 32)
    return SimpleNamespace(metadata=md, src=SimpleNamespace(constants={(1,): 1, (2,): 512}))


def usage(regs: int = 100, stack: int = 0, local: int = 0, static: int = 0) -> dict:
    return {"regs": regs, "stack": stack, "local": local, "static_smem": static}


def test_within_limits_has_no_problems(aot):
    row = aot.case_row(stand_in_case(aot), 80, stand_in_kernel(), usage(static=0), None)
    assert row["problems"] == []
    assert (row["n_regs"], row["n_spills"], row["smem_bytes"]) == (100, 0, 1024)
    assert row["specialised"] == {"stride_c": 1}  # BLOCK_R is a launcher kwarg, not listed
    assert row["meta"] == {"BLOCK_R": 512, "num_warps": 4, "num_stages": 3}


@pytest.mark.parametrize(
    ("arch", "kernel", "res", "problem"),
    [
        # ptxas puts spill slots on the stack frame (cuobjdump's STACK), 4 bytes each
        (80, {}, usage(stack=16), "spills: 16 bytes of local memory"),
        (90, {}, usage(local=8), "spills: 8 bytes of local memory"),
        (80, {}, usage(regs=256), "256 registers > 255"),
        # 16 warps × 32 threads × 160 registers = 81920: the register file per block is 64 K
        (90, {"num_warps": 16}, usage(regs=160), "81920 registers per block > 65536"),
        (80, {"shared": 163 * 1024}, usage(static=1024), "B shared memory > 166912 (A100)"),
        (90, {"shared": 227 * 1024 + 1}, usage(), "B shared memory > 232448 (H100/H200)"),
    ],
)
def test_each_limit_fails_the_case(aot, arch, kernel, res, problem):
    row = aot.case_row(stand_in_case(aot), arch, stand_in_kernel(**kernel), res, None)
    assert len(row["problems"]) == 1 and problem in row["problems"][0]
    assert aot.fail_line(row).startswith(
        f"FAIL _backward_apply sm_{arch} bf16 channels_last odd C=7 5x5 sigma train-bwd: "
    )


def test_sm90_shared_memory_that_sm80_refuses(aot):
    kernel = stand_in_kernel(shared=200 * 1024)
    assert aot.case_row(stand_in_case(aot), 90, kernel, usage(), None)["problems"] == []
    assert aot.case_row(stand_in_case(aot), 80, kernel, usage(), None)["problems"]


def test_a_refusal_is_named_with_the_compilers_reason(aot):
    row = aot.case_row(stand_in_case(aot), 90, None, None, "PTXASError: ptxas failed")
    assert row["problems"] == ["refused: PTXASError: ptxas failed"]
    assert "n_regs" not in row
    assert aot.fail_line(row) == (
        "FAIL _backward_apply sm_90 bf16 channels_last odd C=7 5x5 sigma train-bwd: "
        "refused: PTXASError: ptxas failed"
    )
    grouped = aot.table([row])
    assert grouped[0]["failed"] == 1 and grouped[0]["regs"] == "-"

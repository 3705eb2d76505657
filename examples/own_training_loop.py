"""σN-Ens in your own training loop: plain PyTorch, on the CPU, on the benchmark's digits.

    python examples/own_training_loop.py [--members 4] [--epochs 8] [--tau 0.1] [--lam 0.01]

A model of your own (any nn.Module with BatchNorm, LayerNorm or GroupNorm) becomes an implicit
ensemble of M members; the loop adds σN-Ens's diversity loss to the task loss and prints k_eff,
the number of members sharing a feature (1: each feature owned by one member, M: all share).
The data is the harness's own (``harness.api.data``): the built-in ``digits`` benchmark's
training and test splits, normalised and batched as its cells get them, so the numbers sit
beside theirs. Only ``harness.api`` is imported from the harness.
"""

import argparse
import math
from pathlib import Path
from typing import NoReturn

import torch
import torch.nn.functional as F
from torch import nn

import harness.api as h


def my_model(num_classes: int = 10) -> nn.Module:
    """Your model, unchanged: nothing in it knows about ensembles."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Train σN-Ens on the digits, printing test accuracy, NLL and k_eff after each epoch."""
    args = arguments(argv)
    torch.manual_seed(0)
    # The benchmark's splits of digits 0–7 (K = 8): x float32 (N, 1, 8, 8) normalised, y (N,).
    train, test = h.data("digits", "train"), h.data("digits", "test")
    x_test, y_test = test.tensors()
    # The harness's own training batches: shuffled by (seed, epoch), as a cell of seed 0 gets
    # them (a torch DataLoader(train, batch_size=64, shuffle=True) works as well).
    batches = train.loader(64, train=True, seed=0)

    # γ starts at 0, where the sigmoid is steep, folded so the model keeps its scale at init.
    net = h.sigma_ensemble(my_model(train.num_classes), args.members, gamma_init_mean=0.0,
                           gate_fold="constant")  # fmt: skip
    opt = torch.optim.SGD(net.param_groups(weight_decay=5e-4), lr=0.05, momentum=0.9)
    m = args.members
    for epoch in range(1, args.epochs + 1):
        net.train()
        batches.set_epoch(epoch - 1)
        for x, y in batches:  # (B, 1, 8, 8), (B,)
            logits = net(x)  # (M, B, K): x repeated M times member-major, one row block each
            task = F.cross_entropy(logits.flatten(0, 1), y.repeat(m))  # targets member-major
            loss = task + net.diversity_loss(tau=args.tau, lam=args.lam)
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        probs = net.predict_proba(x_test)  # (N, K): mean of the members' softmax
        acc = (probs.argmax(1) == y_test).float().mean().item()
        nll = F.nll_loss(probs.clamp_min(1e-12).log(), y_test).item()
        print(f"epoch {epoch}: test acc {acc:.3f}  NLL {nll:.3f}  k_eff {net.k_eff():.2f} of {m}")


# --- the command line: every value checked before anything trains -----------------------------


class Parser(argparse.ArgumentParser):
    """argparse whose error is one line, ``<prog>: error: <message> (see <prog> --help)``, exit
    status 2 (argparse prints the usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type of ``--members`` and ``--epochs``: a whole number ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type of ``--tau``: a finite number > 0 (the softmax over members divides by τ)."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type of ``--lam``: a finite number ≥ 0 (λ < 0 would reward sharing)."""
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _number(text: str) -> float:
    """``text`` as a finite float, else the argparse error naming it."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def arguments(argv: list[str] | None = None, prog: str = Path(__file__).name,
              description: str = __doc__.splitlines()[0]) -> argparse.Namespace:  # fmt: skip
    """``--members --epochs --tau --lam`` (this example's and lightning_module.py's), each
    checked before anything trains: a mistake is one line on stderr and exit status 2."""
    parser = Parser(prog=prog, description=description)
    parser.add_argument("--members", type=positive_int, default=4, help="M ≥ 1")
    parser.add_argument("--epochs", type=positive_int, default=8)
    parser.add_argument("--tau", type=positive_float, default=0.1,
                        help="τ > 0; low τ: members specialise")  # fmt: skip
    parser.add_argument("--lam", type=non_negative_float, default=0.01, help="λ ≥ 0")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()

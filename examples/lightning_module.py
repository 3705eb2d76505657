"""σN-Ens in a Lightning module: the loop of own_training_loop.py as a LightningModule.

python examples/lightning_module.py [--members 4] [--epochs 8] [--tau 0.1] [--lam 0.01]
"""

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from harness.api import sigma_ensemble


class SigmaEnsModule(L.LightningModule):
    def __init__(self, model: torch.nn.Module, members: int, tau: float, lam: float) -> None:
        super().__init__()
        self.net = sigma_ensemble(model, members, gamma_init_mean=0.0, gate_fold="constant")
        self.members, self.tau, self.lam = members, tau, lam

    def training_step(self, batch, batch_idx):
        x, y = batch  # (B, 1, 8, 8), (B,)
        logits = self.net(x)  # (M, B, K), members member-major
        task = F.cross_entropy(logits.flatten(0, 1), y.repeat(self.members))
        return task + self.net.diversity_loss(tau=self.tau, lam=self.lam)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        probs = self.net.predict_proba(x)  # (B, K): mean of the members' softmax
        self.log("val_acc", (probs.argmax(1) == y).float().mean(), prog_bar=True)

    def on_validation_epoch_end(self):
        print(f"epoch {self.current_epoch + 1}: k_eff {self.net.k_eff():.2f} of {self.members}")

    def configure_optimizers(self):
        groups = self.net.param_groups(weight_decay=5e-4)  # no decay on the gates γ
        return torch.optim.SGD(groups, lr=0.05, momentum=0.9)


def main(argv: list[str] | None = None) -> None:
    """Train :class:`SigmaEnsModule` on the digits with a CPU ``Trainer``."""
    # the plain model of the other example, and its arguments (checked before anything trains)
    from own_training_loop import arguments, my_model

    args = arguments(argv, Path(__file__).name, __doc__.splitlines()[0])
    L.seed_everything(0, verbose=False)
    images, labels = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0,
                         torch.tensor(labels))  # fmt: skip
    train, test = torch.utils.data.random_split(data, [1400, len(data) - 1400])
    module = SigmaEnsModule(my_model(), args.members, args.tau, args.lam)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(module, DataLoader(train, batch_size=64, shuffle=True), DataLoader(test, 512))


if __name__ == "__main__":
    main()

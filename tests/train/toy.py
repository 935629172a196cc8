"""A toy task, model and objective for the training tests, and a runner for subprocess tests.

Task: sequences of numeric channels (variable length); the class is whether channel 0 has a
positive sum. Model: linear embedding, dropout, masked mean pooling, a hinted "ssm" gain, head.

Runner (used by test_resume.py and test_ddp.py, also under torchrun)::

    python tests/train/toy.py RUN_DIR --config '{"epochs": 2}' [--resume] [--kill-at-step N]
        [--signal-at-step N [--signal TERM|USR1|INT] [--signals K]]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from longrange.data.batch import collate, padding_mask
from longrange.layers.base import set_optim_hint
from longrange.objectives.base import StepOutput


class ToyDataset(Dataset):
    def __init__(self, n: int, seed: int = 0, channels: int = 3, min_len: int = 4, max_len: int = 9):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
        self.inputs = [torch.randn(int(l), channels, generator=g) for l in lengths]
        self.targets = torch.tensor([int(x[:, 0].sum() > 0) for x in self.inputs])
        self.epochs_seen: list[int] = []

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> dict:
        return {"inputs": self.inputs[i], "target": self.targets[i]}

    def set_epoch(self, epoch: int) -> None:
        self.epochs_seen.append(epoch)


class ToyModel(nn.Module):
    #: Read by ToyObjective through the (possibly DDP-wrapped) model, as real objectives read
    #: ``model.causal``.
    kind = "toy"

    def __init__(self, channels: int = 3, d: int = 16, classes: int = 2, dropout: float = 0.0):
        super().__init__()
        self.embed = nn.Linear(channels, d)
        self.drop = nn.Dropout(dropout)
        self.gain = set_optim_hint(nn.Parameter(torch.ones(d)), "ssm")
        self.norm_bias = set_optim_hint(nn.Parameter(torch.zeros(d)), "no_decay")
        self.head = nn.Linear(d, classes)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = inputs.to(self.embed.weight.dtype)
        h = torch.tanh(self.embed(x)) * self.gain + self.norm_bias
        h = self.drop(h)
        mask = padding_mask(lengths, x.shape[1]).unsqueeze(-1).to(h.dtype)
        pooled = (h * mask).sum(1) / lengths.unsqueeze(-1).to(h.dtype)
        return self.head(pooled)


class ToyObjective:
    """Cross-entropy classification; ``noise`` adds input noise in training (draws global RNG)."""

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, noise: float = 0.0):
        self.noise = noise

    def __call__(self, model: nn.Module, batch: dict) -> StepOutput:
        if model.kind != "toy":
            raise AssertionError("model attributes must be readable through the training wrapper")
        inputs = batch["inputs"]
        if self.noise and model.training:
            inputs = inputs + self.noise * torch.randn_like(inputs)
        logits = model(inputs, batch["lengths"])
        losses = nn.functional.cross_entropy(logits, batch["targets"], reduction="none")
        correct = (logits.argmax(-1) == batch["targets"]).sum()
        sums = {
            "loss_sum": losses.detach().sum().to(torch.float64),
            "count": torch.tensor(float(len(losses)), dtype=torch.float64),
            "correct": correct.to(torch.float64),
        }
        return StepOutput(losses.mean(), sums)

    def summarize(self, sums: dict) -> dict:
        count = float(sums["count"])
        return {"loss": float(sums["loss_sum"]) / count, "accuracy": float(sums["correct"]) / count}


def toy_setup(
    dropout: float = 0.0, dtype: torch.dtype = torch.float32, n_train: int = 48, n_val: int = 20, model_seed: int = 0
):
    """(model, train_set, val_set, test_set) with a fixed initialisation."""
    torch.manual_seed(model_seed)
    model = ToyModel(dropout=dropout).to(dtype)
    return model, ToyDataset(n_train, seed=1), ToyDataset(n_val, seed=2), ToyDataset(n_val, seed=3)


class SignalAt:
    """The objective, sending ``signum`` to this process ``times`` times during training step ``step``."""

    def __init__(self, objective, step: int, signum: int, times: int = 1):
        self.objective, self.step, self.signum, self.times = objective, step, signum, times
        self.metric, self.higher_is_better, self.summarize = (
            objective.metric,
            objective.higher_is_better,
            objective.summarize,
        )
        self.trainer = None
        self.sent = False

    def __call__(self, model, batch):
        if not self.sent and model.training and self.trainer is not None and self.trainer.state.step == self.step - 1:
            self.sent = True
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)
        return self.objective(model, batch)


def main(argv: list[str] | None = None) -> int:
    from longrange.train import Trainer

    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--config", default="{}")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at-step", type=int, default=0)
    parser.add_argument("--signal-at-step", type=int, default=0, help="send --signal to itself during this step")
    parser.add_argument("--signal", default="TERM")
    parser.add_argument("--signals", type=int, default=1, help="how many times")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--float64", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # identical float reductions in every process

    model, train_set, val_set, test_set = toy_setup(args.dropout, torch.float64 if args.float64 else torch.float32)
    cfg = {"progress": False, **json.loads(args.config)}
    objective = ToyObjective(args.noise)
    if args.signal == "INT":  # Ctrl-C's handler, even where this process was started with SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.signal_at_step:  # as a scheduler would, in the middle of a step
        signalling = SignalAt(objective, args.signal_at_step, getattr(signal, f"SIG{args.signal}"), args.signals)
        objective = signalling
    trainer = Trainer(
        model,
        objective,
        train_set,
        val_set,
        collate,
        cfg,
        args.run_dir,
        test_set=test_set,
        resume=args.resume,
        tensorboard=False,
    )
    if args.signal_at_step:
        signalling.trainer = trainer
    if args.kill_at_step:

        def kill(step: int, path: Path) -> None:
            if step == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)

        trainer.on_checkpoint = kill
    from longrange.errors import Preempted

    try:
        summary = trainer.fit()
    except Preempted as err:
        print(err, file=sys.stderr)
        return err.exit_code
    if trainer.is_main:
        Path(args.run_dir, "summary.json").write_text(json.dumps(summary))
    from longrange.train.distributed import cleanup

    cleanup(trainer.env)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training: the loop, optimiser groups, schedules, checkpoints, distributed data parallelism.

    from longrange.train import Trainer, TrainConfig
    summary = Trainer(model, objective, train_set, val_set, collate, TrainConfig(lr=1e-3), "runs/x").fit()

The trainer (``loop.py``) is one loop over components, each in its own module with a narrow interface:

    rundir.py      the run directory: its files, lock, and the fresh / resume / reuse decision
    checkpoint.py  Checkpointer: last.pt (model, optimiser, schedule, RNG, every component's state)
                   and best.safetensors, written atomically
    sampler.py     BatchPlan: the micro-batches of each step, a pure function of the data position
    evaluation.py  Evaluator: when to validate, and a dataset's metrics over all ranks
    precision.py   Precision: autocast and the fp16 gradient scaler
    meter.py       MetricMeter: training metrics between log lines
    selection.py   BestSelector: the best evaluation, its weights, early stopping
    progress.py    Progress: what a person watching sees
    preemption.py  StopOnSignal: SIGTERM / SIGUSR1 stop the run after a step, with a checkpoint
    state.py       TrainState: where the run is (step, epoch, data position, time)
    environment.py the run's device, precision and kernels (fit returns them), determinism
    logging.py     metrics.jsonl and the loggers of train.loggers (TensorBoard, W&B)
    entry.py       train(): the one-call entry point on a task's loaded data

Using a finished run (below the experiment and report layers, which both read runs):

    trained.py     load_run / load_model: a run's model with its vocabulary, task and objective;
                   predict on new inputs, evaluate on a split at its own or other task options
    memory.py      what an evaluation needs at a length (measured), and the memory budget
"""
from longrange.train.checkpoint import load_checkpoint, load_weights, save_checkpoint
from longrange.train.config import TrainConfig
from longrange.train.entry import train
from longrange.train.loop import Trainer
from longrange.train.optim import build_optimizer, group_report, param_groups
from longrange.train.rundir import RunDir, RunPaths
from longrange.train.schedules import LRSchedule, build_schedule

__all__ = [
    "LRSchedule",
    "RunDir",
    "RunPaths",
    "TrainConfig",
    "Trainer",
    "build_optimizer",
    "build_schedule",
    "group_report",
    "load_checkpoint",
    "load_weights",
    "param_groups",
    "save_checkpoint",
    "train",
]

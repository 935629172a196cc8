"""Training: the loop, optimiser groups, schedules, checkpoints, distributed data parallelism.

    from longrange.train import Trainer, TrainConfig
    summary = Trainer(model, objective, train_set, val_set, collate, TrainConfig(lr=1e-3), "runs/x").fit()

The trainer (``loop.py``) is one loop over components, each in its own module with a narrow interface:

    rundir/        the run directory: its files, lock, state, and the fresh / resume / reuse decision
    checkpoint.py  Checkpointer: last.pt (model, optimiser, schedule, RNG, every component's state)
                   and best.safetensors, written atomically
    sampler.py     BatchPlan: the micro-batches of each step, a pure function of the data position
    evaluation.py  Evaluator: when to validate, and a dataset's metrics over all ranks
    precision.py   Precision: autocast and the fp16 gradient scaler
    compile.py     Compilation: the model compiled with torch.compile, in place (train.compile)
    meter.py       MetricMeter: training metrics between log lines
    selection.py   BestSelector: the best evaluation, its weights, early stopping
    progress.py    Progress: what a person watching sees
    preemption.py  StopOnSignal: SIGTERM / SIGUSR1 stop the run after a step, with a checkpoint
    state.py       TrainState: where the run is (step, epoch, data position, time)
    environment.py the run's device, precision and kernels (fit returns them), determinism
    allocator.py   the C allocator's thresholds raised on a CPU: a step's freed memory reused by the next
    denormals.py   subnormal floats flushed to zero on a CPU while a run trains (LONGRANGE_DENORMALS)
    logging.py     metrics.jsonl and the loggers of train.loggers (TensorBoard, W&B)
    entry.py       train(): the one-call entry point on a task's loaded data

Using a finished run (below the experiment and report layers, which both read runs):

    trained.py     load_run / load_model: a run's model with its vocabulary, task and objective;
                   predict on new inputs, evaluate on a split at its own or other task options
    memory.py      what an evaluation needs at a length (measured), and the memory budget
"""

from longrange._exports import lazy_exports

# Imported on first use, so that ``import longrange.train.rundir`` (a SLURM job's first step, the
# report) does not import torch and the trainer.
_EXPORTS = {
    **dict.fromkeys(("load_checkpoint", "load_weights", "save_checkpoint"), "longrange.train.checkpoint"),
    "TrainConfig": "longrange.train.config",
    "train": "longrange.train.entry",
    **dict.fromkeys(("FitResult", "Trainer"), "longrange.train.loop"),
    **dict.fromkeys(("build_optimizer", "group_report", "param_groups"), "longrange.train.optim"),
    "RunDir": "longrange.train.rundir",
    **dict.fromkeys(("LRSchedule", "build_schedule"), "longrange.train.schedules"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Experiments: presets and configs, the stages (train / pretrain / finetune), the comparison of
scratch against self-pretraining, and the demo.

    from longrange.experiment import compare, resolve, resolve_stage, run_stage
    compare([resolve("spt/listops/transformer")], "runs/listops", seeds=[0, 1, 2])
    run_stage(resolve_stage(resolve("demo/s4d"), "train", seed=0), "runs/s4d")   # one stage

Modules: ``config`` (presets, config files, dotted overrides), ``stage`` (a stage's resolved
settings), ``execute`` (a stage's steps: build and run it in its run directory), ``weights`` (pretrained-weight
transfer), ``record`` (a run's record and summary), ``plan`` (the comparison's
stages), ``scheduler`` and ``backends`` (running the plan in process, on local workers or on
SLURM), ``compare``, ``demo``, and the command modules ``cli`` and ``params_cli``. The names below are imported on first use, so that the command
line starts without importing the whole stack.
"""

from longrange._exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ("ExperimentConfig", "ObjectiveConfig", "TaskConfig", "list_presets", "load_preset", "resolve"),
        "longrange.experiment.config",
    ),
    "load_model": "longrange.train.trained",  # below the experiment layer, where the report also reads runs
    "load_run": "longrange.train.trained",
    "resolve_stage": "longrange.experiment.stage",
    "run_stage": "longrange.experiment.execute",
    "compare": "longrange.experiment.compare",
    "run_demo": "longrange.experiment.demo",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

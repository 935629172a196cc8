"""The in-process backend: one stage after another in this process (``compare`` without ``--jobs``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange.experiment.plan import Plan, Stage
from longrange.experiment.scheduler import Outcome, run_here, say
from longrange.train.rundir import Intent


@dataclass
class InProcess:
    """Runs each submitted stage at once, in this process. ``threads``: torch's threads while the
    comparison runs (0: as they are)."""

    threads: int = 0
    submits_ahead = False
    wait = True
    poll_interval = 0.0

    def begin(self, plan: Plan, out_dir: Path, intent: Intent) -> None:
        self.plan, self.out_dir, self.intent = plan, out_dir, intent

    def slots(self) -> int | None:
        return 1

    def submit(self, stages: Sequence[Stage], after: dict[str, Any]) -> dict[str, Any]:
        return {stage.id: self._run(stage) for stage in stages}

    def _run(self, stage: Stage) -> Outcome:
        import torch

        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            result = run_here(self.plan, stage, self.out_dir, self.intent)
        finally:
            torch.set_num_threads(before)
        if result is Outcome.HELD:
            say(f"{stage.id} is running in another process; leaving it")
        return result

    def poll(self, handle: Outcome) -> Outcome:
        return handle

    def cancel(self, handle: Any) -> None:
        pass

    def stop(self, handles: dict[str, Any], interrupted: bool) -> None:
        pass

    def end(self, handles: dict[str, Any]) -> None:
        pass

"""Plan every published preset on a GPU (``longrange plan``, predicted, not measured) and write the
table of docs/performance.md, "The published presets planned".

    python benchmarks/plan_presets.py                    # spt/*, s4/*, thesis/* on an H100 SXM 80GB
    python benchmarks/plan_presets.py --only spt/path-x  # some presets (substring of the name)

For each preset: supervised training at ``train.batch_size`` and, where the preset pretrains, its
pretraining stage at the pretraining batch (the objective it compares). Then the plans that sit
beside the papers' statements: the S4 paper's Path-X on an A100 40GB and a 24 GB card, the thesis'
overhead models (Cifar10-numerical, batch 64) on an A100 80GB, the GPU of its measurements.

Raw results go to ``benchmarks/results/plan_presets.json`` (every plan as ``longrange plan --json``
writes it, with the command, the versions and the date), written after each plan, so that an
interrupted run continues where it stopped; the tables to ``benchmarks/results/plan_presets.md``.
Token tasks whose vocabulary comes from their data (text, retrieval) take the sizes of their
character vocabularies (116 and 100; the embedding is a negligible part of the memory); the
Pythia presets are built from Pythia-70M's published configuration (no download).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "plan_presets"
GROUPS = ("spt", "s4", "thesis")
VOCAB = {"text": 116, "retrieval": 100}
#: Pythia-70M's published configuration (EleutherAI/pythia-70m-deduped, config.json).
PYTHIA_70M = dict(
    vocab_size=50304,
    hidden_size=512,
    num_hidden_layers=6,
    num_attention_heads=8,
    intermediate_size=2048,
    max_position_embeddings=2048,
    rotary_pct=0.25,
    rotary_emb_base=10000,
    use_parallel_residual=True,
    layer_norm_eps=1e-5,
    hidden_act="gelu",
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=0,
)
#: The plans beside the papers: (preset, stage, GPU).
PAPERS = [("s4/path-x/s4", "train", "a100-40gb"), ("s4/path-x/s4", "train", "rtx-4090")] + [
    (f"{group}/scifar/{model}", "train", "a100-80gb")
    for group, models in (
        ("thesis", ("mamba-s6", "mamba-s4d", "mamba-s4", "simple-s4d", "simple-s4")),
        ("thesis-bi", ("mamba-s6-bi", "mamba-s4d-bi", "mamba-s6-placebo")),
        ("thesis-rope", ("mamba-s6-rope-bc", "mamba-s4d-rope", "mamba-s4d-rope-trainable")),
    )
    for model in models
]


def pythia_config(directory: Path) -> Path:
    path = directory / "pythia-70m-config"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(
        json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], **PYTHIA_70M})
    )
    return path


def load(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"command": " ".join(sys.argv), "plans": []}


def key(plan: dict) -> tuple:
    return plan["preset"], plan["stage"], plan["gpu"]


def plan_one(name: str, stage: str, gpu_key: str, pythia: Path) -> dict:
    from longrange.bench.gpus import find_gpu
    from longrange.bench.plan import plan_stage
    from longrange.experiment.config import resolve

    exp = resolve(name)
    if exp.model.block == "hf":
        exp = resolve(name, overrides=[f"model.hf.model={pythia}", "model.hf.pretrained=false"])
    start = time.time()
    plan = plan_stage(
        exp, find_gpu(gpu_key), name=name, stage=stage, vocab=VOCAB.get(exp.task.name), find_max_batch=False
    )
    out = plan.to_dict()
    out["seconds"] = round(time.time() - start, 1)
    if exp.model.block == "hf":
        out["note"] = "Pythia-70M's published configuration, random weights (the shapes of the pretrained model)"
    return out


def jobs(only: str | None, gpu: str) -> list[tuple[str, str, str]]:
    from longrange.experiment.config import list_presets, resolve
    from longrange.experiment.dryrun import dry_stages

    out = []
    for name in list_presets():
        if name.split("/")[0] not in GROUPS or (only and only not in name):
            continue
        stages = {stage for stage, _ in dry_stages(resolve(name))}
        out += [(name, stage, gpu) for stage in ("train", "pretrain") if stage in stages]
    out += [job for job in PAPERS if not only or only in job[0]]
    return out


# ------------------------------------------------------------------------------------------------
# The tables
# ------------------------------------------------------------------------------------------------
def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def table(plans: list[dict], gpu: str) -> str:
    rows = [p for p in plans if p["gpu"] == gpu and p["preset"].split("/")[0] in GROUPS]
    rows.sort(key=lambda p: (GROUPS.index(p["preset"].split("/")[0]), p["preset"], p["stage"] != "train"))
    lines = [
        "| preset | stage | batch x length | params | peak memory (GiB) | fits on 80 GB | accumulation on H100 | "
        "step time ≥ on H100 |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    for p in rows:
        stage = "train" if p["stage"] == "train" else f"pretrain ({p['objective']})"
        accumulation = "none fits" if p["accumulation"] is None else str(p["accumulation"])
        lines.append(
            f"| {p['preset']} | {stage} | {p['batch']} x {p['seq_len']} | {p['params']:,} | "
            f"{gib(p['peak_bytes']['total'])} | {'yes' if p['fits'] else '**no**'} | {accumulation} | "
            f"{seconds(p['step_time_lower_bound_s'])} |"
        )
    return "\n".join(lines)


def papers_table(plans: list[dict]) -> str:
    wanted = {(n, s, g) for n, s, g in PAPERS}
    rows = [p for p in plans if key(p) in wanted]
    rows.sort(key=lambda p: PAPERS.index(key(p)))
    lines = [
        "| preset | GPU | batch x length | params | peak memory (GiB) | fits | accumulation | step time ≥ |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    for p in rows:
        lines.append(
            f"| {p['preset']} | {p['gpu_spec']['name']} | {p['batch']} x {p['seq_len']} | {p['params']:,} | "
            f"{gib(p['peak_bytes']['total'])} | {'yes' if p['fits'] else 'no'} | {p['accumulation']} | "
            f"{seconds(p['step_time_lower_bound_s'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="h100-sxm", help="the GPU of the main table (default h100-sxm)")
    parser.add_argument("--only", default=None, help="only the presets whose name contains this")
    parser.add_argument(
        "--out", default=str(OUT), help="results path without suffix (default benchmarks/results/plan_presets)"
    )
    args = parser.parse_args(argv)

    import torch

    import longrange

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = load(out.with_suffix(".json"))
    results.update(torch=torch.__version__, longrange=longrange.__version__)
    done = {key(p) for p in results["plans"]}
    todo = [job for job in jobs(args.only, args.gpu) if job not in done]
    with tempfile.TemporaryDirectory() as tmp:
        pythia = pythia_config(Path(tmp))
        for i, (name, stage, gpu) in enumerate(todo, 1):
            plan = plan_one(name, stage, gpu, pythia)
            results["plans"].append(plan)
            results["date"] = datetime.date.today().isoformat()
            out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
            print(
                f"[{i}/{len(todo)}] {name} {stage} on {gpu}: {gib(plan['peak_bytes']['total'])} GiB, "
                f"fits {plan['fits']}, accumulation {plan['accumulation']} ({plan['seconds']} s)",
                flush=True,
            )
    text = (
        f"Predicted, not measured: `python benchmarks/plan_presets.py` (longrange {results['longrange']}, "
        f"torch {results['torch']}, {results.get('date', '')}).\n\n## Every preset on the {args.gpu}\n\n"
        f"{table(results['plans'], args.gpu)}\n\n## Beside the papers\n\n{papers_table(results['plans'])}\n"
    )
    out.with_suffix(".md").write_text(text)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

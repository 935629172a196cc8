"""No source file deserialises with a loader that could run code (docs/reliability.md's audit)."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "longrange"
UNSAFE = {
    r"\bpickle\.loads?\(": "pickle.load",
    r"weights_only\s*=\s*False": "torch.load(weights_only=False)",
    r"allow_pickle\s*=\s*True": "np.load(allow_pickle=True)",
    r"\byaml\.(?:unsafe_)?load\((?!.*\bLoader=YAML_LOADER\b)": "yaml.load without the safe loader",
    r"\byaml\.full_load\(|\byaml\.unsafe_load\(": "yaml.full_load / unsafe_load",
}


def test_no_source_file_loads_with_a_loader_that_could_run_code():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what in UNSAFE.items():
                if re.search(pattern, code):
                    found.append(f"{path.relative_to(SRC)}:{number}: {what}")
    assert found == []


def test_the_yaml_loader_of_run_directories_is_a_safe_one():
    import yaml

    from longrange.train.rundir import YAML_LOADER

    assert issubclass(YAML_LOADER, (yaml.SafeLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    assert YAML_LOADER in (yaml.SafeLoader, getattr(yaml, "CSafeLoader", None))


def _flagged(line: str) -> list[str]:
    return [what for pattern, what in UNSAFE.items() if re.search(pattern, line.split("#", 1)[0])]


def test_the_audit_flags_each_unsafe_loader_and_passes_the_safe_ones():
    unsafe = [
        "data = pickle.load(f)",
        "torch.load(p, weights_only=False)",
        "np.load(p, allow_pickle=True)",
        "yaml.load(f.read())",
        "yaml.load(f, Loader=yaml.Loader)",
        "yaml.unsafe_load(text)",
        "yaml.full_load(text)",
    ]
    safe = [
        "yaml.load(self.config.read_text(), Loader=YAML_LOADER)",
        "yaml.safe_load(text)",
        "torch.load(p, map_location='cpu', weights_only=True)",
        "np.load(p, allow_pickle=False)",
        "x = 1  # pickle.load(f) in a comment",
    ]
    assert all(_flagged(line) for line in unsafe), [line for line in unsafe if not _flagged(line)]
    assert not any(_flagged(line) for line in safe), [line for line in safe if _flagged(line)]

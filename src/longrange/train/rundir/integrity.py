"""Whether a run's checkpoint files are whole, without loading them.

A file system without atomic renames, a full disk or a copy cut short can leave a prefix of a
checkpoint. Each check reads only what tells a whole file from a cut one (a zip archive's central
directory at its end; a safetensors file's header and size), so that reading a run's state stays
cheap for a grid of thousands of runs. Each returns why the file cannot be read, or None.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def zip_problem(path: Path) -> str | None:
    """Why the checkpoint ``path`` (a zip archive, as ``torch.save`` writes) cannot be loaded, or
    None. Reads only its central directory at the end: a cut-off file has none."""
    import zipfile

    try:
        with zipfile.ZipFile(path):
            return None
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"{path}: damaged or cut off ({err})"


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be read whole, or None: its header must parse and
    its size must be the header's length plus the end of its last tensor."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path}: damaged or cut off (no header)"
            n = int.from_bytes(head, "little")
            size = os.fstat(f.fileno()).st_size
            if n > size - 8:
                return f"{path}: damaged or cut off (header of {n} bytes in a file of {size})"
            header = json.loads(f.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        return f"{path}: damaged ({err})"
    if size != 8 + n + end:
        return f"{path}: damaged or cut off ({size} bytes where its header says {8 + n + end})"
    return None

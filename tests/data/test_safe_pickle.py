"""The restricted unpickler of data files: published structures load, anything that could run code
is refused before it runs."""

from __future__ import annotations

import os
import pickle
import struct

import numpy as np
import pytest

from longrange.data.image import read_cifar_batch
from longrange.data.safe_pickle import load_data_pickle, loads_data_pickle
from longrange.errors import DataFormatError


def _s(text: bytes) -> bytes:
    """SHORT_BINSTRING: a Python 2 ``str`` (read as bytes with encoding="bytes")."""
    return b"U" + bytes([len(text)]) + text


def _binstring(data: bytes) -> bytes:
    return b"T" + struct.pack("<i", len(data)) + data


def py2_cifar_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR-10 batch as Python 2's cPickle wrote the published files (protocol 2): str keys,
    a numpy array by ``numpy.core.multiarray._reconstruct`` and ``ndarray.__setstate__``."""
    assert data.dtype == np.uint8 and data.ndim == 2
    dtype = (
        b"cnumpy\ndtype\n"
        + _s(b"u1")
        + b"K\x00K\x01\x87R"
        + b"(K\x03"
        + _s(b"|")
        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    )
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85"
        + _s(b"b")
        + b"\x87R"
        + b"(K\x01K"
        + bytes([data.shape[0]])
        + b"M"
        + struct.pack("<H", data.shape[1])
        + b"\x86"
        + dtype
        + b"\x89"
        + _binstring(data.tobytes())
        + b"tb"
    )
    label_list = b"](" + b"".join(b"K" + bytes([v]) for v in labels) + b"e"
    body = (
        b"}("
        + _s(b"batch_label")
        + _s(b"training batch 1 of 5")
        + _s(b"labels")
        + label_list
        + _s(b"data")
        + array
        + _s(b"filenames")
        + b"]("
        + b"".join(_s(b"img%d.png" % i) for i in range(len(labels)))
        + b"eu."
    )
    return b"\x80\x02" + body


class RunsCommand:
    """An object whose pickle asks to run a shell command when loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_python2_cifar_batch_loads(tmp_path):
    data = np.arange(2 * 3072, dtype=np.int64).reshape(2, 3072).astype(np.uint8)
    path = tmp_path / "data_batch_1"
    path.write_bytes(py2_cifar_batch(data, [3, 9]))
    # the fixture is what plain pickle reads too (the published format)
    plain = pickle.loads(path.read_bytes(), encoding="bytes")
    assert np.array_equal(plain[b"data"], data)
    batch = load_data_pickle(path)
    assert set(batch) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert batch[b"data"].dtype == np.uint8 and np.array_equal(batch[b"data"], data)
    got, labels, skipped = read_cifar_batch(path)
    assert np.array_equal(got, data) and labels.tolist() == [3, 9] and skipped == 0


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_python3_numpy_pickles_load(tmp_path, protocol):
    obj = {
        b"data": np.arange(12, dtype=np.uint8).reshape(3, 4),
        b"labels": [1, 2, 3],
        "name": "x",
        b"scalar": np.float32(1.5),
        b"t": (1, 2.0, None, True),
    }
    back = loads_data_pickle(pickle.dumps(obj, protocol=protocol))
    assert np.array_equal(back[b"data"], obj[b"data"]) and back[b"labels"] == [1, 2, 3]
    assert back["name"] == "x" and back[b"scalar"] == np.float32(1.5) and back[b"t"] == (1, 2.0, None, True)


def test_planted_command_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "data_batch_1"
    data = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": RunsCommand(marker)}
    path.write_bytes(pickle.dumps(data, protocol=2))
    with pytest.raises(DataFormatError) as err:
        read_cifar_batch(path)
    message = str(err.value)
    assert str(path) in message and "refusing" in message
    assert "posix.system" in message or "os.system" in message or "nt.system" in message
    assert not marker.exists()


@pytest.mark.parametrize(
    "global_name",
    [b"builtins\neval\n", b"subprocess\nPopen\n", b"numpy\nload\n", b"numpy.core.multiarray\nfromstring\n"],
)
def test_any_other_global_is_refused(tmp_path, global_name):
    payload = b"\x80\x02c" + global_name + b"X\x01\x00\x00\x001\x85R."
    with pytest.raises(DataFormatError, match=global_name.split(b"\n")[1].decode()):
        loads_data_pickle(payload, tmp_path / "f")


def test_truncated_pickle_names_file(tmp_path):
    path = tmp_path / "test_batch"
    path.write_bytes(py2_cifar_batch(np.zeros((1, 3072), np.uint8), [1])[:500])
    with pytest.raises(DataFormatError, match="test_batch.*not a readable pickle"):
        read_cifar_batch(path)

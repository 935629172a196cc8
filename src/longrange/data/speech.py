"""Speech Commands v0.02, 35-way (or SC10, 10-way) keyword classification from raw 1 s waveforms or MFCCs.

Layout (the released archive, extracted)::

    <data_dir>/speech_commands/<word>/<speaker>_nohash_<n>.wav      16 kHz mono 16-bit PCM
    <data_dir>/speech_commands/validation_list.txt                  "<word>/<file>.wav" per line
    <data_dir>/speech_commands/testing_list.txt

Validation and test are the files the two lists name; training is every other file of the 35
word directories (``_background_noise_`` is not a class and is ignored). Class ids follow
:data:`WORDS` (the order of the S4 code's 35-class list). A list entry naming a missing file is
an error (file and line).

Waveforms are scaled to [-1, 1) by ``/ 2**15``, zero-padded at the end (or cropped at the end)
to 16000 samples, as the S4 code does.

Option ``features``:
  ``raw``  (default) inputs float (16000, 1);
  ``mfcc`` inputs float (161, 20): S4's setting (torchaudio ``MFCC(n_mfcc=20, log_mels=True,
           melkwargs=dict(n_fft=200, n_mels=64))``), reimplemented in :func:`mfcc`: periodic Hann
           window of 200 samples (12.5 ms), hop 100 (6.25 ms), centred frames with reflect
           padding, power spectrum, 64 HTK-mel triangular filters on 0..8 kHz, ``log(x + 1e-6)``,
           orthonormal DCT-II keeping 20 coefficients; 16000 samples give 161 frames.
Normalisation (as S4): each channel (the waveform, or each MFCC coefficient) is standardised with
the mean and standard deviation over all training samples and positions: ``(x - mean) / (std + 1e-5)``.

Option ``classes``:
  ``35`` (default) the 35 words, split by the archive's lists (as above);
  ``10``  SC10, the 10-class subset of the S4 paper, built as the S4 code (tag v1,
          ``src/dataloaders/sc.py``) builds it: the words of :data:`SC10_WORDS` in that class-id
          order, the other 25 words dropped (not mapped to an "unknown" class), clips shorter than
          16000 samples dropped, and a random split stratified by class, 70% train, then the rest
          halved into validation and test (sklearn's ``train_test_split`` twice). Per class, the
          first floor(0.7 n) clips of a permutation seeded with the loader's ``seed`` train, then
          floor(rest / 2) validate and the remainder test. The lists are not used. The S4 code's own
          draw (random_state 0 and 1 over the clips in ``os.listdir`` order, which depends on the
          file system) cannot be reproduced, so which clips land in which split differs from it;
          the sizes are the same up to one clip per class.

mask_ratio 0.15: the SPT public configuration has no masked-pretraining setting for Speech
Commands (its ``sc-lm`` default ``mlm_prob`` is 0), so the non-visual default applies.

WAVs are read with the standard-library ``wave`` module; any other format than 16 kHz mono 16-bit
PCM is an error naming the file. The decoded waveforms (int16) and MFCCs are cached.
"""

from __future__ import annotations

import math
import sys
import wave
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from longrange.errors import ConfigError, DataFormatError, DataMissingError

SAMPLE_RATE = 16000
LENGTH = 16000
#: The 35 keywords of v0.02, in class-id order.
WORDS = (
    "bed",
    "cat",
    "down",
    "five",
    "forward",
    "go",
    "house",
    "left",
    "marvin",
    "no",
    "on",
    "right",
    "sheila",
    "tree",
    "up",
    "visual",
    "yes",
    "backward",
    "bird",
    "dog",
    "eight",
    "follow",
    "four",
    "happy",
    "learn",
    "nine",
    "off",
    "one",
    "seven",
    "six",
    "stop",
    "three",
    "two",
    "wow",
    "zero",
)
#: SC10: the S4 code's ``SUBSET_CLASSES``, in its class-id order.
SC10_WORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
#: The values of the ``classes`` option: all 35 words, or SC10.
CLASS_SETS = (35, 10)
#: MFCC settings (S4's Speech Commands MFCC variant).
N_MFCC, N_FFT, HOP, N_MELS, LOG_OFFSET = 20, 200, 100, 64, 1e-6
NORM_EPS = 1e-5
OBTAIN = (
    "download speech_commands_v0.02.tar.gz from http://download.tensorflow.org/data/speech_commands_v0.02.tar.gz "
    "and extract it into <data_dir>/speech_commands/"
)


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
def read_wav(path: str | Path) -> np.ndarray:
    """int16 samples of a 16 kHz mono 16-bit PCM WAV; DataFormatError naming the file otherwise."""
    path = Path(path)
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            if (channels, width, rate) != (1, 2, SAMPLE_RATE):
                raise DataFormatError(
                    f"unsupported WAV format: {channels} channel(s), {8 * width}-bit, {rate} Hz "
                    f"(expected mono 16-bit PCM at {SAMPLE_RATE} Hz)",
                    path,
                )
            frames = w.readframes(w.getnframes())
    except DataFormatError:
        raise
    except (wave.Error, EOFError, OSError) as exc:
        raise DataFormatError(f"unreadable WAV ({type(exc).__name__}: {exc})", path) from exc
    return np.frombuffer(frames, dtype="<i2").copy()


def fit_length(samples: np.ndarray, length: int = LENGTH) -> np.ndarray:
    """Zero-pad at the end or crop at the end to ``length`` samples."""
    if samples.shape[0] >= length:
        return samples[:length]
    return np.concatenate([samples, np.zeros(length - samples.shape[0], dtype=samples.dtype)])


def read_split_list(path: Path, root: Path) -> dict[str, int]:
    """Entries of validation_list.txt / testing_list.txt -> {relative path: line number}."""
    if not path.is_file():
        raise DataMissingError(f"missing {path}; {OBTAIN}")
    entries: dict[str, int] = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        rel = line.strip()
        if not rel:
            continue
        word = rel.split("/", 1)[0]
        if "/" not in rel or word not in WORDS:
            raise DataFormatError(f"entry {rel!r} is not <word>/<file>.wav with one of the 35 words", path, line_no)
        if not (root / rel).is_file():
            raise DataFormatError(f"listed file {root / rel} does not exist", path, line_no)
        entries[rel] = line_no
    return entries


def word_files(root: Path, words: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(word, path) of every WAV in the word directories, in word order then file-name order;
    DataMissingError naming the missing directories."""
    missing = [w for w in words if not (root / w).is_dir()]
    if missing:
        raise DataMissingError(f"missing word directories under {root}: {', '.join(missing)}; {OBTAIN}")
    return [(w, p) for w in words for p in sorted((root / w).glob("*.wav"))]


def decode_files(files, skip_bad: bool, skipped: dict[str, int], progress: bool | None, desc: str):
    """Yield (word, path, int16 samples) per file; with ``skip_bad`` an unreadable file is counted in
    ``skipped`` and left out, otherwise its DataFormatError propagates."""
    from tqdm import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    for word, path in tqdm(files, desc=desc, unit="wav", disable=not show):
        try:
            samples = read_wav(path)
        except DataFormatError:
            if skip_bad:
                skipped[str(path)] = 1
                continue
            raise
        yield word, path, samples


def read_speech_commands(root: str | Path, skip_bad: bool = False, progress: bool | None = None) -> dict:
    """Decode every word file under ``root``.

    Returns ``{"waves": int16 tensor (N, 16000), "labels": int64 (N,), "split": int64 (N,)
    (0 train, 1 val, 2 test), "skipped": {file: 1}}``.
    """
    root = Path(root)
    files = word_files(root, WORDS)
    val = read_split_list(root / "validation_list.txt", root)
    test = read_split_list(root / "testing_list.txt", root)
    both = sorted(set(val) & set(test))
    if both:
        raise DataFormatError(
            f"{both[0]} is listed for validation (line {val[both[0]]}) and for testing",
            root / "testing_list.txt",
            test[both[0]],
        )
    waves = np.zeros((len(files), LENGTH), dtype=np.int16)
    labels = np.zeros(len(files), dtype=np.int64)
    split = np.zeros(len(files), dtype=np.int64)
    skipped: dict[str, int] = {}
    n = 0
    for word, path, samples in decode_files(files, skip_bad, skipped, progress, "decoding speech_commands"):
        rel = f"{word}/{path.name}"
        waves[n] = fit_length(samples)
        labels[n] = WORDS.index(word)
        split[n] = 1 if rel in val else 2 if rel in test else 0
        n += 1
    return {
        "waves": torch.from_numpy(waves[:n]),
        "labels": torch.from_numpy(labels[:n]),
        "split": torch.from_numpy(split[:n]),
        "skipped": skipped,
    }


def read_sc10(root: str | Path, skip_bad: bool = False, progress: bool | None = None) -> dict:
    """Decode the SC10 words under ``root``, keeping the clips of exactly 16000 samples (as the S4 code).

    Returns ``{"waves": int16 (N, 16000), "labels": int64 (N,) indices into SC10_WORDS, "short":
    {word: clips dropped for being shorter}, "skipped": {file: 1}}``, clips in word order, then
    file-name order.
    """
    files = word_files(Path(root), SC10_WORDS)
    waves, labels = [], []
    short: dict[str, int] = {w: 0 for w in SC10_WORDS}
    skipped: dict[str, int] = {}
    for word, _, samples in decode_files(files, skip_bad, skipped, progress, "decoding speech_commands (SC10)"):
        if samples.shape[0] != LENGTH:
            short[word] += 1
            continue
        waves.append(samples)
        labels.append(SC10_WORDS.index(word))
    stacked = np.stack(waves) if waves else np.zeros((0, LENGTH), dtype=np.int16)
    return {
        "waves": torch.from_numpy(stacked),
        "labels": torch.tensor(labels, dtype=torch.int64),
        "short": short,
        "skipped": skipped,
    }


def stratified_split(labels: Tensor, seed: int) -> Tensor:
    """Split ids (0 train, 1 validation, 2 test) of a class-stratified 70/15/15 random split.

    Per class (in class order, one generator seeded with ``seed``): a permutation of its items,
    the first floor(0.7 n) train, the next floor((n - that) / 2) validate, the rest test.
    """
    gen = torch.Generator().manual_seed(int(seed))
    split = torch.zeros(labels.shape[0], dtype=torch.int64)
    for c in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(idx.numel(), generator=gen)]
        n_train = (7 * idx.numel()) // 10
        n_val = (idx.numel() - n_train) // 2
        split[idx[n_train : n_train + n_val]] = 1
        split[idx[n_train + n_val :]] = 2
    return split


# ------------------------------------------------------------------------------------------------
# MFCC (torch)
# ------------------------------------------------------------------------------------------------
def hz_to_mel(f):
    """HTK mel scale."""
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def mel_to_hz(m):
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_filterbank(
    n_freqs: int,
    n_mels: int,
    sample_rate: int,
    f_min: float = 0.0,
    f_max: float | None = None,
    dtype=torch.float64,
    device=None,
) -> Tensor:
    """Triangular HTK-mel filters, (n_freqs, n_mels), unnormalised (peak 1), on linear FFT bins.

    Filter m rises from mel point m to m+1 and falls to m+2, the n_mels + 2 points being evenly
    spaced in mel between f_min and f_max (torchaudio's ``melscale_fbanks`` with norm=None, htk).
    """
    f_max = sample_rate / 2 if f_max is None else f_max
    freqs = np.linspace(0.0, sample_rate // 2, n_freqs)
    pts = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    diff = np.diff(pts)
    slopes = pts[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    return torch.as_tensor(fb, dtype=dtype, device=device)


def dct_matrix(n_mfcc: int, n_mels: int, dtype=torch.float64, device=None) -> Tensor:
    """Orthonormal DCT-II basis, (n_mels, n_mfcc): ``mfcc = log_mel @ D``."""
    n = torch.arange(n_mels, dtype=dtype, device=device)
    k = torch.arange(n_mfcc, dtype=dtype, device=device)
    d = torch.cos(math.pi / n_mels * (n[:, None] + 0.5) * k[None, :]) * math.sqrt(2.0 / n_mels)
    d[:, 0] = d[:, 0] / math.sqrt(2.0)
    return d


def mel_spectrogram(
    waves: Tensor, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, hop: int = HOP, n_mels: int = N_MELS
) -> Tensor:
    """Power mel spectrogram of (..., T) waveforms -> (..., frames, n_mels), frames = T // hop + 1."""
    shape = waves.shape
    x = waves.reshape(-1, shape[-1])
    window = torch.hann_window(n_fft, periodic=True, dtype=x.dtype, device=x.device)
    spec = torch.stft(
        x,
        n_fft=n_fft,
        hop_length=hop,
        win_length=n_fft,
        window=window,
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )
    power = spec.real**2 + spec.imag**2  # (B, n_freqs, frames)
    fb = mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate, dtype=x.dtype, device=x.device)
    mel = torch.einsum("bft,fm->btm", power, fb)
    return mel.reshape(*shape[:-1], mel.shape[1], n_mels)


def mfcc(
    waves: Tensor,
    sample_rate: int = SAMPLE_RATE,
    n_mfcc: int = N_MFCC,
    n_fft: int = N_FFT,
    hop: int = HOP,
    n_mels: int = N_MELS,
) -> Tensor:
    """MFCCs of (..., T) waveforms -> (..., frames, n_mfcc) (settings in the module docstring)."""
    log_mel = torch.log(mel_spectrogram(waves, sample_rate, n_fft, hop, n_mels) + LOG_OFFSET)
    return log_mel @ dct_matrix(n_mfcc, n_mels, dtype=log_mel.dtype, device=log_mel.device)


# ------------------------------------------------------------------------------------------------
# dataset and task
# ------------------------------------------------------------------------------------------------
class StandardisedDataset(Dataset):
    """Items ``{"inputs": float32 (L, C) (x - mean) / (std + eps), "target"}`` from a stored array.

    ``store`` is (N, L) or (N, L, C) (int16 waveforms are scaled by 2**-15 first).
    """

    def __init__(self, store: Tensor, labels: Tensor, index: Tensor, mean: Tensor, std: Tensor):
        self.store, self.labels, self.index = store, labels, index
        self.mean, self.std = mean.float(), std.float()

    def __len__(self) -> int:
        return int(self.index.numel())

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        row = int(self.index[i])
        x = self.store[row]
        x = x.float() / 32768.0 if x.dtype == torch.int16 else x.float()
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        return {"inputs": (x - self.mean) / (self.std + NORM_EPS), "target": self.labels[row]}


def channel_stats(store: Tensor, index: Tensor, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """Per-channel mean and (unbiased) std over the rows ``index`` of a (N, L[, C]) store, in float64."""
    total = sq = None
    count = 0
    for start in range(0, index.numel(), chunk):
        x = store[index[start : start + chunk]].double()
        if store.dtype == torch.int16:
            x = x / 32768.0
        if x.dim() == 2:
            x = x.unsqueeze(-1)
        x = x.reshape(-1, x.shape[-1])
        s, q = x.sum(0), (x * x).sum(0)
        total = s if total is None else total + s
        sq = q if sq is None else sq + q
        count += x.shape[0]
    if count < 2:
        raise DataFormatError("the training split needs at least one sample to normalise the inputs")
    mean = total / count
    var = (sq - count * mean * mean) / (count - 1)
    return mean, var.clamp_min(0.0).sqrt()


def _check_features(features: str) -> str:
    if features not in ("raw", "mfcc"):
        raise ConfigError(f"features: must be 'raw' or 'mfcc', got {features!r}")
    return features


def _check_classes(classes: object) -> int:
    if classes not in CLASS_SETS or isinstance(classes, bool):
        raise ConfigError(f"classes: must be 35 (all words) or 10 (SC10, the S4 code's subset), got {classes!r}")
    return int(classes)


def speech_spec(features: str = "raw", classes: int = 35):
    from longrange.data.spec import TaskSpec

    _check_features(features)
    classes = _check_classes(classes)
    raw = features == "raw"
    words = "35 words" if classes == 35 else "SC10 (10 words, the S4 code's subset and split)"
    layout = (
        "speech_commands/<word>/<speaker>_nohash_<n>.wav, speech_commands/{validation_list,testing_list}.txt"
        if classes == 35
        else f"speech_commands/<word>/<speaker>_nohash_<n>.wav for {', '.join(SC10_WORDS)}"
    )
    return TaskSpec(
        name="speech-commands",
        input_kind="numeric",
        seq_len=LENGTH if raw else LENGTH // HOP + 1,
        n_classes=classes,
        metric="accuracy",
        mask_ratio=0.15,
        d_input=1 if raw else N_MFCC,
        description=f"Speech Commands v0.02, {words}; "
        + ("raw 16 kHz waveform (16000, 1)" if raw else "MFCC (161, 20)"),
        layout=layout,
        obtain=OBTAIN,
    )


def speech_sources(root: Path, classes: int) -> list[Path]:
    """The files and directories the task reads (35 classes: the lists and every word; SC10: its words)."""
    if classes == 10:
        return [root / w for w in SC10_WORDS]
    return [root / "validation_list.txt", root / "testing_list.txt"] + [root / w for w in WORDS]


def load_speech(data_dir: Path, spec, seed: int = 0, skip_bad: bool = False, features: str = "raw", classes: int = 35):
    """Load Speech Commands as TaskData (decoded once into the cache; MFCCs cached separately)."""
    from longrange.data.cache import cached
    from longrange.data.dataset import TaskData

    _check_features(features)
    classes = _check_classes(classes)
    root = Path(data_dir) / "speech_commands"
    if not root.is_dir():
        raise DataMissingError(f"missing Speech Commands directory {root}; {OBTAIN}")
    sources = speech_sources(root, classes)
    for s in sources:
        if not s.exists():
            raise DataMissingError(f"missing {s}; {OBTAIN}")
    opts = {"skip_bad": bool(skip_bad), "length": LENGTH}
    name = "speech-commands" if classes == 35 else "speech-commands-sc10"
    if classes == 35:
        raw = cached(data_dir, name, sources, opts, lambda: read_speech_commands(root, skip_bad))
        split = raw["split"]
    else:
        raw = cached(data_dir, name, sources, opts, lambda: read_sc10(root, skip_bad))
        split = stratified_split(raw["labels"], seed)
    store = raw["waves"]
    if features == "mfcc":

        def build_mfcc() -> dict:
            feats = torch.cat(
                [
                    mfcc(raw["waves"][i : i + 512].double() / 32768.0).float()
                    for i in range(0, raw["waves"].shape[0], 512)
                ]
            )
            return {"mfcc": feats}

        store = cached(
            data_dir,
            f"{name}-mfcc",
            sources,
            {**opts, "n_mfcc": N_MFCC, "n_fft": N_FFT, "hop": HOP, "n_mels": N_MELS},
            build_mfcc,
        )["mfcc"]
    parts = [torch.nonzero(split == s).flatten() for s in range(3)]
    for name, idx in zip(("train", "validation", "test"), parts):
        if idx.numel() == 0:
            raise DataFormatError(f"the {name} split of {root} is empty (check validation_list.txt / testing_list.txt)")
    mean, std = channel_stats(store, parts[0])
    datasets = [StandardisedDataset(store, raw["labels"], idx, mean, std) for idx in parts]
    info = {"source": str(root), "mean": mean.tolist(), "std": std.tolist(), "sizes": [len(d) for d in datasets]}
    if classes == 10:
        info["short_dropped"] = dict(raw["short"])
    return TaskData(
        spec=spec,
        train=datasets[0],
        val=datasets[1],
        test=datasets[2],
        vocab=None,
        skipped=dict(raw["skipped"]),
        info=info,
    )


def expected_paths(data_dir: Path, classes: int = 35, **_) -> list[Path]:
    return speech_sources(Path(data_dir) / "speech_commands", _check_classes(classes))


def _register() -> None:
    from longrange.data.registry import register_task

    register_task(
        "speech-commands",
        speech_spec,
        lambda data_dir, spec, seed=0, skip_bad=False, **o: load_speech(data_dir, spec, seed, skip_bad, **o),
        {"features": "raw", "classes": 35},
        expected=expected_paths,
    )


_register()

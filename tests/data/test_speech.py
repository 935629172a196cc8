"""Speech Commands: WAV reading, splits from the lists, normalisation, MFCC against a naive reference."""

from __future__ import annotations

import math
import wave

import numpy as np
import pytest
import torch

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data import get_spec, load_task
from longrange.data.speech import (
    SC10_WORDS,
    WORDS,
    dct_matrix,
    fit_length,
    hz_to_mel,
    mel_filterbank,
    mel_spectrogram,
    mfcc,
    read_wav,
)
from longrange.errors import ConfigError, DataFormatError, DataMissingError


def write_wav(path, samples, rate=16000, channels=1, width=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples).astype("<i2" if width == 2 else "u1").tobytes())


def make_speech(tmp_path, length=16000, seed=0):
    """Two files per word (first -> train, second -> val for even words, test for odd words)."""
    root = tmp_path / "speech_commands"
    rng = np.random.default_rng(seed)
    val, test = [], []
    for i, word in enumerate(WORDS):
        for j in range(2):
            n = length if (i + j) % 3 else length - 500  # some short clips
            write_wav(root / word / f"spk{j}_nohash_0.wav", rng.integers(-3000, 3000, size=n))
        (val if i % 2 == 0 else test).append(f"{word}/spk1_nohash_0.wav")
    write_wav(root / "_background_noise_" / "noise.wav", rng.integers(-100, 100, size=50))
    (root / "validation_list.txt").write_text("\n".join(val) + "\n")
    (root / "testing_list.txt").write_text("\n".join(test) + "\n")
    return root


def make_sc10(tmp_path, per_word=12, seed=0):
    """The real layout with every word: ``per_word`` clips for each SC10 word, of which the words at
    even positions of SC10_WORDS have 2 short clips (< 16000 samples); 3 clips for each other word."""
    root = tmp_path / "speech_commands"
    rng = np.random.default_rng(seed)
    for word in WORDS:
        n = per_word if word in SC10_WORDS else 3
        short = 2 if word in SC10_WORDS and SC10_WORDS.index(word) % 2 == 0 else 0
        for j in range(n):
            write_wav(
                root / word / f"spk{j:02d}_nohash_0.wav", rng.integers(-3000, 3000, size=16000 - 700 * (j < short))
            )
    (root / "validation_list.txt").write_text("")
    (root / "testing_list.txt").write_text("")
    return root


def test_sc10_label_set_and_counts(tmp_path):
    """SC10 as the S4 code builds it: its 10 words in its class order, the other 25 words dropped,
    clips shorter than 1 s dropped, and a 70/15/15 random split stratified by class."""
    make_sc10(tmp_path)
    assert SC10_WORDS == ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
    spec = get_spec("speech-commands", classes=10)
    assert spec.n_classes == 10 and spec.seq_len == 16000
    data = load_task("speech-commands", tmp_path, classes=10)
    kept = {w: 12 - (2 if i % 2 == 0 else 0) for i, w in enumerate(SC10_WORDS)}  # 10 or 12 clips per word
    assert data.info["short_dropped"] == {w: 12 - k for w, k in kept.items()}
    splits = {
        name: [int(d[i]["target"]) for i in range(len(d))]
        for name, d in (("train", data.train), ("val", data.val), ("test", data.test))
    }
    assert sorted(set(splits["train"])) == list(range(10))
    for c, word in enumerate(SC10_WORDS):
        n = kept[word]
        n_train = 7 * n // 10
        n_val = (n - n_train) // 2
        counts = [splits[s].count(c) for s in ("train", "val", "test")]
        assert counts == [n_train, n_val, n - n_train - n_val], word  # 10 clips: 7/1/2; 12: 8/2/2
    assert len(data.train) + len(data.val) + len(data.test) == sum(kept.values()) == 110
    # Which clip is which class: the label of a training item is its word's index in SC10_WORDS.
    yes = read_wav(tmp_path / "speech_commands" / "yes" / "spk05_nohash_0.wav")
    x = (torch.from_numpy(yes.astype(np.float64)) / 32768.0 - data.info["mean"][0]) / (data.info["std"][0] + 1e-5)
    found = [
        s
        for s in ("train", "val", "test")
        for i in range(len(getattr(data, s)))
        if torch.allclose(getattr(data, s)[i]["inputs"][:, 0].double(), x, atol=1e-5)
    ]
    assert len(found) == 1
    # The split is the loader's seeded draw (another seed, another split of the same sizes).
    other = load_task("speech-commands", tmp_path, classes=10, seed=1)
    assert [len(d) for d in (other.train, other.val, other.test)] == [len(d) for d in (data.train, data.val, data.test)]
    # The MFCC variant reads the same clips.
    mfcc_data = load_task("speech-commands", tmp_path, classes=10, features="mfcc")
    assert mfcc_data.train[0]["inputs"].shape == (161, 20) and len(mfcc_data.train) == len(data.train)


def test_sc10_needs_only_its_words_and_checks_the_option(tmp_path):
    root = make_sc10(tmp_path, per_word=4)
    (root / "validation_list.txt").unlink()
    for word in set(WORDS) - set(SC10_WORDS):
        for f in (root / word).iterdir():
            f.unlink()
        (root / word).rmdir()
    assert len(load_task("speech-commands", tmp_path, classes=10).train) > 0
    with pytest.raises(DataMissingError, match="validation_list.txt"):
        load_task("speech-commands", tmp_path)  # the 35 classes need the lists
    for bad in (12, "10", True):
        with pytest.raises(ConfigError, match="classes: must be 35 .* or 10"):
            get_spec("speech-commands", classes=bad)
    with pytest.raises(ConfigError, match="classes"):
        load_task("speech-commands", tmp_path, classes=0)


def test_read_wav_and_fit_length(tmp_path):
    write_wav(tmp_path / "a.wav", [0, 1, -2, 32767, -32768])
    assert read_wav(tmp_path / "a.wav").tolist() == [0, 1, -2, 32767, -32768]
    assert fit_length(np.arange(5, dtype=np.int16), 8).tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert fit_length(np.arange(10, dtype=np.int16), 8).tolist() == list(range(8))


@pytest.mark.parametrize(
    "kwargs, what",
    [
        (dict(channels=2), "2 channel"),
        (dict(width=1), "8-bit"),
        (dict(rate=8000), "8000 Hz"),
    ],
)
def test_unsupported_wav_formats_name_the_file(tmp_path, kwargs, what):
    write_wav(tmp_path / "bad.wav", [0] * 8, **kwargs)
    with pytest.raises(DataFormatError, match=rf"bad\.wav: unsupported WAV format.*{what}"):
        read_wav(tmp_path / "bad.wav")


def test_corrupt_wav(tmp_path):
    (tmp_path / "x.wav").write_bytes(b"RIFF....garbage")
    with pytest.raises(DataFormatError, match=r"x\.wav: unreadable WAV"):
        read_wav(tmp_path / "x.wav")


def test_raw_end_to_end(tmp_path):
    make_speech(tmp_path)
    data = load_task("speech-commands", tmp_path)
    assert data.spec.n_classes == 35 and data.spec.seq_len == 16000 and data.spec.mask_ratio == 0.15
    assert (len(data.train), len(data.val), len(data.test)) == (35, 18, 17)
    item = data.val[0]
    assert item["inputs"].shape == (16000, 1) and item["inputs"].dtype == torch.float32
    assert int(item["target"]) == WORDS.index("bed")
    assert sorted(int(data.train[i]["target"]) for i in range(35)) == list(range(35))
    train = torch.stack([data.train[i]["inputs"] for i in range(len(data.train))]).double()
    assert abs(train.mean().item()) < 1e-4 and abs(train.std().item() - 1.0) < 1e-3
    # the value is (x / 2**15 - mean) / (std + 1e-5) with the training statistics
    raw = read_wav(tmp_path / "speech_commands" / "bed" / "spk1_nohash_0.wav")
    x = torch.from_numpy(fit_length(raw).astype(np.float64) / 32768.0)
    mean, std = data.info["mean"][0], data.info["std"][0]
    assert torch.allclose(item["inputs"][:, 0].double(), (x - mean) / (std + 1e-5), atol=1e-5)


def test_mfcc_features_task(tmp_path):
    make_speech(tmp_path)
    assert get_spec("speech-commands", features="mfcc").seq_len == 161
    data = load_task("speech-commands", tmp_path, features="mfcc")
    x = data.train[0]["inputs"]
    assert x.shape == (161, 20) and data.spec.d_input == 20
    train = torch.stack([data.train[i]["inputs"] for i in range(len(data.train))]).double()
    assert torch.allclose(train.mean(dim=(0, 1)), torch.zeros(20, dtype=torch.float64), atol=1e-4)
    with pytest.raises(ConfigError, match="features"):
        get_spec("speech-commands", features="spectrogram")


def test_bad_wav_in_dataset_raises_or_skips(tmp_path):
    root = make_speech(tmp_path)
    write_wav(root / "cat" / "spk0_nohash_0.wav", [0] * 10, channels=2)
    with pytest.raises(DataFormatError, match=r"cat/spk0_nohash_0\.wav: unsupported WAV format"):
        load_task("speech-commands", tmp_path)
    data = load_task("speech-commands", tmp_path, skip_bad=True)
    assert data.skipped == {str(root / "cat" / "spk0_nohash_0.wav"): 1}
    assert len(data.train) == 34


def test_list_errors_and_missing_data(tmp_path):
    with pytest.raises(DataMissingError, match="speech_commands.*speech_commands_v0.02"):
        load_task("speech-commands", tmp_path)
    root = make_speech(tmp_path)
    with open(root / "testing_list.txt", "a") as f:
        f.write("dog/nobody_nohash_9.wav\n")
    with pytest.raises(
        DataFormatError, match=r"testing_list\.txt, line 18: listed file .*nobody_nohash_9\.wav does not exist"
    ):
        load_task("speech-commands", tmp_path)
    (root / "testing_list.txt").write_text("notaword/x.wav\n")
    with pytest.raises(DataFormatError, match=r"testing_list\.txt, line 1: entry 'notaword/x.wav'"):
        load_task("speech-commands", tmp_path)


def test_decoded_once_then_cached(tmp_path, monkeypatch):
    make_speech(tmp_path)
    first = load_task("speech-commands", tmp_path)
    import longrange.data.speech as sp

    def fail(*_):
        raise AssertionError("decoded again")

    monkeypatch.setattr(sp, "read_wav", fail)
    again = load_task("speech-commands", tmp_path)
    assert torch.equal(first.test[3]["inputs"], again.test[3]["inputs"])


# ------------------------------------------------------------------------------------------------
# MFCC
# ------------------------------------------------------------------------------------------------
def _naive_mfcc(x: np.ndarray, n_fft=200, hop=100, n_mels=64, n_mfcc=20, sr=16000) -> np.ndarray:
    """Frame-by-frame reference: reflect-pad, periodic Hann, explicit DFT sums, mel, log, DCT-II."""
    pad = n_fft // 2
    xp = np.concatenate([x[1 : pad + 1][::-1], x, x[-pad - 1 : -1][::-1]])
    n = np.arange(n_fft)
    win = 0.5 - 0.5 * np.cos(2 * math.pi * n / n_fft)
    k = np.arange(n_fft // 2 + 1)
    basis = np.exp(-2j * math.pi * np.outer(n, k) / n_fft)
    frames = 1 + len(x) // hop
    power = np.stack([np.abs((xp[t * hop : t * hop + n_fft] * win) @ basis) ** 2 for t in range(frames)])
    # triangular filters from their definition
    mel_pts = np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2)
    hz = 700.0 * (10 ** (mel_pts / 2595.0) - 1)
    freqs = np.linspace(0, sr // 2, n_fft // 2 + 1)
    fb = np.zeros((len(freqs), n_mels))
    for m in range(n_mels):
        lo, c, hi = hz[m], hz[m + 1], hz[m + 2]
        for i, f in enumerate(freqs):
            if lo <= f <= c:
                fb[i, m] = (f - lo) / (c - lo)
            elif c < f <= hi:
                fb[i, m] = (hi - f) / (hi - c)
    logmel = np.log(power @ fb + 1e-6)
    out = np.zeros((frames, n_mfcc))
    for q in range(n_mfcc):
        scale = math.sqrt(1.0 / n_mels) if q == 0 else math.sqrt(2.0 / n_mels)
        out[:, q] = scale * (logmel * np.cos(math.pi / n_mels * (np.arange(n_mels) + 0.5) * q)).sum(1)
    return out


def test_mfcc_matches_naive_reference():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1600)
    got = mfcc(torch.from_numpy(x)).numpy()
    ref = _naive_mfcc(x)
    assert got.shape == ref.shape == (17, 20)
    assert np.allclose(got, ref, atol=1e-8, rtol=1e-8)
    assert mfcc(torch.zeros(3, 16000, dtype=torch.float64)).shape == (3, 161, 20)


def test_dct_is_orthonormal():
    d = dct_matrix(64, 64)
    assert torch.allclose(d.T @ d, torch.eye(64, dtype=torch.float64), atol=1e-12)


def test_pure_tone_energy_in_its_mel_band():
    sr = 16000
    fb = mel_filterbank(101, 64, sr)
    t = torch.arange(16000, dtype=torch.float64) / sr
    for f0 in (480.0, 1040.0, 3040.0):  # on FFT bin centres (80 Hz bins)
        mel = mel_spectrogram(torch.sin(2 * math.pi * f0 * t))
        band = int(mel[10:-10].mean(0).argmax())
        # the band whose filter peaks closest to the tone's FFT bin
        bin_ = round(f0 / (sr / 200))
        assert band == int(fb[bin_].argmax()), (f0, band)
        centre_hz = float(700 * (10 ** (np.linspace(hz_to_mel(0), hz_to_mel(8000), 66)[band + 1] / 2595) - 1))
        assert abs(centre_hz - f0) < 200.0

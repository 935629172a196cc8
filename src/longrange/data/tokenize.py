"""Token vocabularies shared by every token task.

Every vocabulary starts with the same five special tokens at ids 0..4 (:data:`SPECIALS`), so a
model pretrained on a task finetunes on it without remapping ids: ``<pad>`` is always
:data:`longrange.data.batch.PAD_ID`, and :data:`UNK_ID`, :data:`EOS_ID`, :data:`CLS_ID`,
:data:`MASK_ID` name the others. The task's own tokens follow from :data:`FIRST_TOKEN_ID` (5) on.

A vocabulary is saved as JSON next to the prepared data::

    {"format": "longrange-vocabulary", "version": 1, "specials": [...], "tokens": [...], "strict": false}
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from longrange.data.batch import PAD_ID
from longrange.errors import DataFormatError

#: Special tokens, ids 0..4 in every vocabulary.
SPECIALS: tuple[str, ...] = ("<pad>", "<unk>", "<eos>", "<cls>", "<mask>")
#: Ids of the special tokens other than ``<pad>`` (:data:`~longrange.data.batch.PAD_ID`).
UNK_ID, EOS_ID, CLS_ID, MASK_ID = (SPECIALS.index(token) for token in ("<unk>", "<eos>", "<cls>", "<mask>"))
#: Id of a task's first own token: the specials come first.
FIRST_TOKEN_ID = len(SPECIALS)

_FORMAT = "longrange-vocabulary"
_VERSION = 1

assert SPECIALS.index("<pad>") == PAD_ID


class Vocabulary:
    """A fixed mapping between tokens (strings) and integer ids.

    Args:
        tokens: the task's tokens, in id order; they get ids ``FIRST_TOKEN_ID`` onwards. They must
            be distinct and must not repeat a special token.
        strict: if True, encoding a token outside the vocabulary raises :class:`DataFormatError`
            (for tasks whose alphabet is closed, e.g. ListOps); otherwise it maps to ``<unk>``.
    """

    def __init__(self, tokens: Sequence[str], strict: bool = False):
        tokens = list(tokens)
        for tok in tokens:
            if not isinstance(tok, str):
                raise TypeError(f"vocabulary tokens must be strings, got {tok!r} ({type(tok).__name__})")
        clashes = sorted(set(tokens) & set(SPECIALS))
        if clashes:
            raise ValueError(f"tokens {clashes} are reserved special tokens")
        if len(set(tokens)) != len(tokens):
            dup = sorted(t for t, c in Counter(tokens).items() if c > 1)
            raise ValueError(f"duplicate vocabulary tokens: {dup[:10]}")
        self._itos: list[str] = list(SPECIALS) + tokens
        self._stoi: dict[str, int] = {t: i for i, t in enumerate(self._itos)}
        self.strict = bool(strict)

    # ids of the specials -------------------------------------------------------------------------
    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def cls_id(self) -> int:
        return CLS_ID

    @property
    def mask_id(self) -> int:
        return MASK_ID

    @property
    def tokens(self) -> tuple[str, ...]:
        """The task's tokens (without the specials), in id order."""
        return tuple(self._itos[FIRST_TOKEN_ID:])

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self._itos == other._itos and self.strict == other.strict

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} ids, strict={self.strict})"

    def token_to_id(self, token: str) -> int:
        return self._stoi.get(token, self.unk_id)

    def id_to_token(self, idx: int) -> str:
        return self._itos[idx]

    # encoding ------------------------------------------------------------------------------------
    def encode(
        self, tokens: Iterable[str], *, where: str = "", path: object = None, line: int | None = None
    ) -> list[int]:
        """Ids of ``tokens``.

        In strict mode a token outside the vocabulary (or a special token's string) raises
        :class:`DataFormatError` located by ``path``/``line`` or else by ``where`` (e.g.
        ``"data/x.tsv, line 7"``).
        """
        stoi = self._stoi
        if not self.strict:
            unk = self.unk_id
            return [stoi.get(t, unk) for t in tokens]
        tokens = tokens if isinstance(tokens, (list, tuple, str)) else list(tokens)
        ids = [stoi.get(t, -1) for t in tokens]
        if ids and min(ids) < FIRST_TOKEN_ID:
            pos = next(i for i, idx in enumerate(ids) if idx < FIRST_TOKEN_ID)
            raise DataFormatError(
                f"token {tokens[pos]!r} (position {pos}) is not in the vocabulary "
                f"(expected one of {list(self.tokens)[:20]})",
                path if path is not None else (where or None),
                line if path is not None else None,
            )
        return ids

    def _char_table(self) -> np.ndarray:
        """Id of every Unicode code point (``<unk>`` for code points without a one-character token)."""
        table = getattr(self, "_table", None)
        if table is None:
            table = np.full(0x110000, self.unk_id, dtype=np.int32)
            for tok, idx in self._stoi.items():
                if len(tok) == 1 and idx >= FIRST_TOKEN_ID:
                    table[ord(tok)] = idx
            self._table = table
        return table

    def encode_chars(self, text: str, *, path: object = None, line: int | None = None) -> np.ndarray:
        """Ids of the characters of ``text`` as an int32 array: the fast path of ``encode(list(text))``.

        Character-level tasks encode billions of characters; a code-point lookup table avoids one
        Python dictionary lookup per character.
        """
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ids = self._char_table()[points]
        if self.strict and ids.size and int(ids.min()) < FIRST_TOKEN_ID:
            self.encode(list(text), path=path, line=line)  # raises, locating the first bad character
        return ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` (a sequence of ints or a 1-D tensor)."""
        out = []
        for idx in ids:
            idx = int(idx)
            if not 0 <= idx < len(self._itos):
                raise ValueError(f"id {idx} outside the vocabulary of {len(self._itos)} ids")
            out.append(self._itos[idx])
        return out

    # persistence ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "specials": list(SPECIALS),
            "tokens": list(self.tokens),
            "strict": self.strict,
        }

    @classmethod
    def from_dict(cls, obj: object, path: object = None) -> Vocabulary:
        if not isinstance(obj, dict) or obj.get("format") != _FORMAT:
            raise DataFormatError(f"not a {_FORMAT} file", path)
        if obj.get("version") != _VERSION:
            raise DataFormatError(f"unsupported vocabulary version {obj.get('version')!r} (expected {_VERSION})", path)
        if list(obj.get("specials", [])) != list(SPECIALS):
            raise DataFormatError(f"special tokens {obj.get('specials')!r} differ from {list(SPECIALS)}", path)
        tokens = obj.get("tokens")
        if not isinstance(tokens, list):
            raise DataFormatError("field 'tokens' must be a list of strings", path)
        try:
            return cls(tokens, strict=bool(obj.get("strict", False)))
        except (TypeError, ValueError) as err:
            raise DataFormatError(f"bad field 'tokens': {err}", path) from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON (atomically)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        path = Path(path)
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataFormatError(f"unreadable vocabulary: {err}", path) from None
        return cls.from_dict(obj, path)

    @classmethod
    def build_chars(cls, texts: Iterable[str], min_count: int = 1, strict: bool = False) -> Vocabulary:
        """``build(texts, ...)`` for character-level vocabularies, counting code points with numpy."""
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counts = np.zeros(0x110000, dtype=np.int64)

        def add(chunk: list[str]) -> None:
            points = np.frombuffer("".join(chunk).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
            np.add(counts, np.bincount(points, minlength=0x110000), out=counts)

        chunk: list[str] = []
        size = 0
        for text in texts:  # count in chunks of ~16M characters: one bincount per chunk
            chunk.append(text)
            size += len(text)
            if size >= 1 << 24:
                add(chunk)
                chunk, size = [], 0
        if chunk:
            add(chunk)
        kept = [(-int(counts[p]), chr(p)) for p in np.flatnonzero(counts >= min_count).tolist()]
        tokens = [tok for _, tok in sorted(kept) if tok not in SPECIALS]
        return cls(tokens, strict=strict)

    @classmethod
    def build(cls, token_iter: Iterable[Iterable[str]], min_count: int = 1, strict: bool = False) -> Vocabulary:
        """Vocabulary of the tokens seen at least ``min_count`` times.

        Args:
            token_iter: an iterable of token sequences, e.g. lists of tokens, or strings (whose
                characters are then the tokens, for character-level tasks).
            min_count: minimum number of occurrences to keep a token.
            strict: see the class docstring.

        Tokens are ordered by decreasing count, ties by the token string, so the result does not
        depend on the order of the data. Special-token strings in the data are not counted.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        counts: Counter[str] = Counter()
        for seq in token_iter:
            counts.update(seq)
        for special in SPECIALS:
            counts.pop(special, None)
        kept = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
        return cls(kept, strict=strict)

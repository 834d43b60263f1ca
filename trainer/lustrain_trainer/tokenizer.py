"""Tokenizers: the byte tokenizer (every byte a token, plus end-of-document), or a Hugging Face tokenizer.json.

The byte tokenizer needs nothing to download or train, represents every input and has a vocabulary of 257. A
byte-level BPE (trained on the corpus by `prepare --tokenizer bpe:VOCAB`) or an existing tokenizer.json (the GPT-2 or
Llama 3 tokenizer a team already uses: `--tokenizer PATH`) compresses text several times better, so a model of the
same context sees more of it. Those are run by Hugging Face `tokenizers`, imported only when one is used: the
training process reads token ids and never needs it (SageMaker's PyTorch image need not have it).

What a data set, a model and a checkpoint record is the tokenizer's `info`:
{"kind": "bytes" | "bpe" | "file", "vocab_size", "eos", "sha256" of tokenizer.json's bytes, "file": its name}, the
file lying beside the index (or the model's config). Two tokenizers are the same when their infos agree on kind,
vocabulary, EOS and sha256 (same_tokenizer): the file's name does not matter.
"""

from __future__ import annotations

import bisect
import codecs
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .layout import TOKENIZER_FILE

BYTE_TOKENS = 256
EOS = BYTE_TOKENS
VOCAB_SIZE = BYTE_TOKENS + 1
KINDS = ("bytes", "bpe", "file")
TOKENIZER_INFO: dict[str, Any] = {"kind": "bytes", "vocab_size": VOCAB_SIZE, "eos": EOS, "sha256": None,
                                  "file": None}
#: what a tokenizer.json calls its end-of-document token, tried in this order: the name `prepare` gives it (and
#: GPT-2's), Llama 3's, Llama 2's and most SentencePiece models'
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
#: the most token ids whose shards fit uint16 (ids 0 .. 65535); a larger vocabulary needs uint32
U16_TOKENS = 1 << 16
IDENTITY = ("kind", "vocab_size", "eos", "sha256")
#: a document streamed in chunks (encode_stream) is encoded about this many characters at a time, cut at a
#: pre-token boundary at least STREAM_MARGIN characters before the end of what has been read: far enough that what
#: follows cannot change how the text before it is split (a pre-tokenizer's regex looks a few characters ahead)
STREAM_CHARS = 4 << 20
STREAM_MARGIN = 1 << 10
#: the text before a cut whose splitting is checked: more than any lookahead of a pre-tokenizer's regex
STREAM_LOOK = 64
#: pieces of a streamed chunk encoded at once (encode_batch runs them on all cores)
STREAM_PIECES = 16
#: the pre-tokenizers whose splits a cut at one of their boundaries leaves alone (with no normalizer: one that
#: prepends to a text, as SentencePiece's Metaspace and ByteLevel's add_prefix_space do, would prepend to each chunk)
CHUNKABLE_PRE_TOKENIZERS = frozenset({"ByteLevel", "Split", "Sequence", "Digits", "Punctuation", "Whitespace",
                                      "WhitespaceSplit"})


class TokenizerError(ValueError):
    """A tokenizer cannot be loaded or does not match what it is recorded as."""


class Tokenizer(Protocol):
    vocab_size: int
    eos: int | None
    info: dict[str, Any]

    def encode_document(self, data: bytes) -> np.ndarray: ...

    def encode_documents(self, documents: list[bytes]) -> list[np.ndarray]: ...

    def encode_stream(self, chunks: Iterable[bytes]) -> Iterator[np.ndarray]: ...

    def decode(self, tokens: list[int]) -> str: ...


def dtype_for(vocab_size: int) -> str:
    """The shards' dtype: uint16 while every id fits in 16 bits, else uint32."""
    return "<u2" if vocab_size <= U16_TOKENS else "<u4"


def normalized(info: dict[str, Any] | None) -> dict[str, Any]:
    """A tokenizer info in the current form: none (an index of version 1, a model or checkpoint written before
    tokenizers were recorded) or one without sha256/file is the byte tokenizer's."""
    if not info:
        return dict(TOKENIZER_INFO)
    return {"sha256": None, "file": None, **info}


def same_tokenizer(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    na, nb = normalized(a), normalized(b)
    return all(na.get(key) == nb.get(key) for key in IDENTITY)


def describe(info: dict[str, Any] | None) -> str:
    """A tokenizer info in a few words, for a message that names two of them."""
    n = normalized(info)
    sha = f", sha256 {str(n['sha256'])[:12]}" if n.get("sha256") else ""
    return f"{n['kind']} (vocab_size {n['vocab_size']}, eos {n['eos']}{sha})"


# -- the byte tokenizer ------------------------------------------------------------------------------------


def encode(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype("<u2")


def encode_document(data: bytes) -> np.ndarray:
    """A document's tokens followed by EOS, so a model sees where one file ends and the next begins."""
    tokens = np.empty(len(data) + 1, dtype="<u2")
    tokens[:-1] = np.frombuffer(data, dtype=np.uint8)
    tokens[-1] = EOS
    return tokens


def decode(tokens: list[int]) -> str:
    # EOS marks a document boundary; in sampled text it reads best as a blank line.
    out = bytearray()
    for token in tokens:
        if token == EOS:
            out += b"\n\n"
        elif 0 <= token < BYTE_TOKENS:
            out.append(token)
    return out.decode("utf-8", errors="replace")


class ByteTokenizer:
    vocab_size = VOCAB_SIZE
    eos: int | None = EOS

    def __init__(self) -> None:
        self.info = dict(TOKENIZER_INFO)

    def encode(self, text: str) -> list[int]:
        return encode(text.encode("utf-8")).tolist()  # type: ignore[no-any-return]

    def encode_document(self, data: bytes) -> np.ndarray:
        return encode_document(data)

    def encode_documents(self, documents: list[bytes]) -> list[np.ndarray]:
        return [encode_document(data) for data in documents]

    def encode_stream(self, chunks: Iterable[bytes]) -> Iterator[np.ndarray]:
        """One document given in chunks, its tokens a chunk at a time: those of encode_document, EOS last."""
        for chunk in chunks:
            yield encode(chunk)
        yield np.array([EOS], dtype="<u2")

    def decode(self, tokens: list[int]) -> str:
        return decode(tokens)


# -- Hugging Face tokenizers -------------------------------------------------------------------------------


class HFTokenizer:
    """A tokenizer.json run by Hugging Face `tokenizers`. A document is its text's ids (no special tokens added
    by the tokenizer's own template, such as Llama 3's <|begin_of_text|>) followed by EOS, when it has one."""

    def __init__(self, hf: Any, info: dict[str, Any], chunkable: bool = False) -> None:
        # a special token's text in a document (a corpus about tokenizers holds "<|endoftext|>") is text: encoded
        # as its characters, never as the token, which only the pipeline puts where a document ends
        hf.encode_special_tokens = True
        self.hf, self.info = hf, info
        self.vocab_size: int = int(info["vocab_size"])
        self.eos: int | None = info["eos"]
        self.dtype = dtype_for(self.vocab_size)
        #: whether a document may be encoded a piece at a time (encode_stream), and the added tokens' texts (the
        #: special ones are text here), which the tokenizer takes out of a text before it pre-tokenizes the rest
        self.chunkable = chunkable
        added = sorted((t.content for t in hf.get_added_tokens_decoder().values() if not t.special), key=len,
                       reverse=True)
        #: leftmost, longest first: as `tokenizers` finds them
        self._added = re.compile("|".join(map(re.escape, added))) if added else None

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False).ids)

    def encode_document(self, data: bytes) -> np.ndarray:
        return self.encode_documents([data])[0]

    def encode_documents(self, documents: list[bytes]) -> list[np.ndarray]:
        """Several documents at once: `tokenizers` encodes a batch on all cores."""
        encodings = self.hf.encode_batch([d.decode("utf-8") for d in documents], add_special_tokens=False)
        tail = [] if self.eos is None else [self.eos]
        return [np.array([*e.ids, *tail], dtype=self.dtype) for e in encodings]

    def encode_stream(self, chunks: Iterable[bytes]) -> Iterator[np.ndarray]:
        """One document given in chunks, encoded about STREAM_CHARS at a time: the same tokens as encode_document
        of the whole, with memory for a chunk, not the document. The text is cut where the tokenizer's own
        pre-tokenizer splits it (BPE merges never cross those boundaries), STREAM_MARGIN characters or more before
        the end of what has been read, and never inside an added token's text. A tokenizer whose splits a cut could
        change (a normalizer, a pre-tokenizer that prepends) is given the document whole, as encode_document."""
        tail = [] if self.eos is None else [self.eos]
        if not self.chunkable:
            yield self.encode_documents([b"".join(chunks)])[0]
            return
        decoder = codecs.getincrementaldecoder("utf-8")()  # strict, as encode_documents' decode
        text = ""
        for chunk in chunks:
            text += decoder.decode(chunk)
            if len(text) >= STREAM_CHARS + STREAM_MARGIN:
                cuts = self._cuts(text)
                if cuts:
                    yield self._encode_pieces(text, cuts)
                    text = text[cuts[-1] :]
        text += decoder.decode(b"", final=True)
        yield np.array([*self.hf.encode(text, add_special_tokens=False).ids, *tail], dtype=self.dtype)

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of `text`'s pre-tokens as the tokenizer splits it: its added tokens, and the pre-tokens of
        each segment between them."""
        spans: list[tuple[int, int]] = []
        at = 0
        for found in [*(self._added.finditer(text) if self._added else ()), None]:
            end = len(text) if found is None else found.start()
            spans += [(at + a, at + b) for _, (a, b) in self.hf.pre_tokenizer.pre_tokenize_str(text[at:end])]
            if found is not None:
                spans.append(found.span())
                at = found.end()
        return spans

    def _cuts(self, text: str) -> list[int]:
        """Where `text` (which begins at a boundary) may be cut, ascending, about len/STREAM_PIECES apart; [] if
        nowhere. A cut is a pre-token boundary STREAM_MARGIN or more before the end of the text (what follows the
        text cannot change how it is split there), where the text before it, encoded on its own, is split as the
        whole is (a regex that looks ahead, as GPT-2's \\s+(?!\\S), may split a piece's end otherwise): checked on
        the STREAM_LOOK characters before the cut."""
        limit = len(text) - STREAM_MARGIN
        spans = [span for span in self._spans(text) if span[1] <= limit]
        ends = [end for _, end in spans]
        cuts: list[int] = []
        step = max(1, limit // STREAM_PIECES)
        for k in range(len(spans) - 1, 0, -1):  # the last cut first: where the next chunk begins
            cut = ends[k - 1]
            if cuts and cuts[-1] - cut < step:
                continue
            first = bisect.bisect_right(ends, cut - STREAM_LOOK)  # the pre-tokens from STREAM_LOOK before the cut
            window = spans[first:k]
            start = window[0][0] if window else cut
            alone = [(start + a, start + b) for a, b in self._spans(text[start:cut])]
            if alone == window:
                cuts.append(cut)
        return cuts[::-1]

    def _encode_pieces(self, text: str, cuts: list[int]) -> np.ndarray:
        pieces = [text[a:b] for a, b in zip([0, *cuts[:-1]], cuts, strict=True)]
        encodings = self.hf.encode_batch(pieces, add_special_tokens=False)
        return np.array([token for e in encodings for token in e.ids], dtype=self.dtype)

    def decode(self, tokens: list[int]) -> str:
        # EOS reads best as a blank line between documents, as with the byte tokenizer
        pieces, run = [], []
        for token in tokens:
            if token == self.eos:
                pieces.append(self.hf.decode(run, skip_special_tokens=True))
                run = []
            elif 0 <= token < self.vocab_size:
                run.append(token)
        pieces.append(self.hf.decode(run, skip_special_tokens=True))
        return "\n\n".join(pieces)


def _hf() -> Any:
    try:
        import tokenizers
    except ImportError as exc:  # the training image may lack it: only prepare and generate need it
        raise TokenizerError(
            "this tokenizer needs Hugging Face `tokenizers` (pip install tokenizers); the byte tokenizer does not"
        ) from exc
    return tokenizers


def info_of(hf: Any, kind: str, text: bytes) -> dict[str, Any]:
    """The info of a loaded tokenizer.json: vocabulary = the highest id + 1 (ids may have holes), EOS by name."""
    vocab: dict[str, int] = hf.get_vocab(with_added_tokens=True)
    if not vocab:
        raise TokenizerError("the tokenizer has an empty vocabulary")
    eos = next((vocab[name] for name in EOS_NAMES if name in vocab), None)
    return {"kind": kind, "vocab_size": max(vocab.values()) + 1, "eos": eos,
            "sha256": hashlib.sha256(text).hexdigest(), "file": TOKENIZER_FILE}


def from_json(text: bytes, kind: str = "file", where: str = TOKENIZER_FILE) -> HFTokenizer:
    """A tokenizer from the bytes of a tokenizer.json; TokenizerError naming `where` if they are not one."""
    tokenizers = _hf()
    try:
        hf = tokenizers.Tokenizer.from_str(text.decode("utf-8"))
    except (UnicodeDecodeError, Exception) as exc:  # tokenizers raises a bare Exception on a bad file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenizerError(f"{where} is not a Hugging Face tokenizer.json ({first})") from exc
    return HFTokenizer(hf, info_of(hf, kind, text), chunkable=chunkable(text))


def chunkable(text: bytes) -> bool:
    """Whether a document may be encoded a piece at a time, cut at the pre-tokenizer's boundaries, to the same
    tokens (HFTokenizer.encode_stream): no normalizer, a pre-tokenizer of CHUNKABLE_PRE_TOKENIZERS that prepends
    nothing, and added tokens matched as plain text (none that strips the space around it or needs a word)."""
    try:
        spec = json.loads(text)
    except ValueError:
        return False
    if not isinstance(spec, dict) or spec.get("normalizer") is not None or spec.get("pre_tokenizer") is None:
        return False
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in spec.get("added_tokens") or []):
        return False

    def plain(node: Any) -> bool:
        if not isinstance(node, dict) or node.get("type") not in CHUNKABLE_PRE_TOKENIZERS:
            return False
        if node.get("add_prefix_space") or node.get("prepend_scheme") not in (None, "never"):
            return False
        return all(plain(child) for child in node.get("pretokenizers") or [])

    return plain(spec["pre_tokenizer"])


def train_bpe(texts: Iterable[str], vocab_size: int) -> bytes:
    """A byte-level BPE (GPT-2's scheme: every byte representable, no unknown token) trained on `texts`, as the
    bytes of its tokenizer.json, with <|endoftext|> as its EOS. The same texts give the same bytes: the trainer
    breaks ties between equally frequent pairs by the pair itself, and the file lists vocabulary and merges in id
    order. A corpus with fewer distinct pairs than asked for gives a smaller vocabulary (the info says which)."""
    tokenizers = _hf()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_NAMES[0]], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(texts, trainer=trainer)
    return (hf.to_str(pretty=True) + "\n").encode("utf-8")  # type: ignore[no-any-return]


def load(info: dict[str, Any] | None, root: Path | None = None) -> ByteTokenizer | HFTokenizer:
    """The tokenizer an index, a model config or a manifest records: its tokenizer.json is read from `root` (the
    directory beside which it lies) and must have the sha256 recorded."""
    info = normalized(info)
    kind = info.get("kind")
    if kind == "bytes":
        if info["vocab_size"] != VOCAB_SIZE or info["eos"] != EOS:
            raise TokenizerError(f"a bytes tokenizer has vocab_size {VOCAB_SIZE} and eos {EOS}, not {describe(info)}")
        return ByteTokenizer()
    if kind not in KINDS:
        raise TokenizerError(f"tokenizer kind {kind!r} is not one of {' | '.join(KINDS)}")
    if root is None or not info.get("file"):
        raise TokenizerError(f"a {kind} tokenizer needs its file ({TOKENIZER_FILE}) and the directory it lies in")
    path = root / str(info["file"])
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read the tokenizer the data was made with ({exc.strerror})") from exc
    sha = hashlib.sha256(text).hexdigest()
    if sha != info.get("sha256"):
        raise TokenizerError(f"{path} has sha256 {sha}, not the {info.get('sha256')} recorded: another tokenizer")
    tokenizer = from_json(text, kind=kind, where=str(path))
    tokenizer.info = {**tokenizer.info, "file": info["file"]}
    return tokenizer

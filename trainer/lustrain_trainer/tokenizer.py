"""A byte-level tokenizer: every byte is a token, plus one end-of-document token.

Nothing to download or train, every input is representable, and the vocabulary (257) fits in uint16 shards.
"""

from __future__ import annotations

import numpy as np

BYTE_TOKENS = 256
EOS = BYTE_TOKENS
VOCAB_SIZE = BYTE_TOKENS + 1
TOKENIZER_INFO = {"kind": "bytes", "vocab_size": VOCAB_SIZE, "eos": EOS}


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

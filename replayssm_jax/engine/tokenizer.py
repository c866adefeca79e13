"""`ByteTokenizer`: UTF-8 bytes as token ids, plus two special tokens.

Token ``b`` (``0 <= b < 256``) is the byte ``b``; ``BOS = 256`` and ``EOS = 257`` are the
specials, so a model needs ``vocab_size >= 258`` for the specials (a smaller vocabulary
can still encode text whose bytes fit, e.g. ASCII in 128 tokens, without specials).
"""

from __future__ import annotations

from collections.abc import Sequence

BYTE_VOCAB = 256
BOS, EOS = 256, 257
VOCAB_SIZE = 258

__all__ = ["BOS", "EOS", "VOCAB_SIZE", "ByteTokenizer"]


class ByteTokenizer:
  """Byte-level tokenizer for models of any vocabulary that covers the bytes used.

  Args:
    vocab_size: the model's vocabulary; encoded bytes must be below it.

  >>> tok = ByteTokenizer()
  >>> tok.encode("hé")
  [104, 195, 169]
  >>> tok.decode([104, 195, 169, EOS])
  'hé'
  """

  name = "bytes"

  def __init__(self, vocab_size: int = VOCAB_SIZE):
    self.vocab_size = vocab_size

  @property
  def eos_token_id(self) -> int | None:
    """EOS when the vocabulary has room for it, else None."""
    return EOS if self.vocab_size > EOS else None

  def encode(self, text: str) -> list[int]:
    """The UTF-8 bytes of ``text``.

    Raises:
      ValueError: a byte that is not below ``vocab_size``.
    """
    ids = list(text.encode("utf-8"))
    too_big = [b for b in ids if b >= self.vocab_size]
    if too_big:
      raise ValueError(f"ByteTokenizer: byte {too_big[0]} of the text is outside the model's "
                       f"vocabulary of {self.vocab_size} tokens (use ASCII text, or a model with "
                       f"vocab_size >= {VOCAB_SIZE}).")
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    """Bytes back to text (specials dropped, invalid UTF-8 replaced)."""
    return bytes(int(t) for t in ids if 0 <= int(t) < BYTE_VOCAB).decode("utf-8", errors="replace")

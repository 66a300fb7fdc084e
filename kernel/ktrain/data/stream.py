"""``pretraining_dataset``: raw text read lazily, tokenized as it comes, and packed into full rows on the fly.

Documents (one per row of the files, text in ``field``, default ``text``) are taken in turn from each
entry, each ending with EOS, and laid end to end into rows of exactly ``sequence_len`` tokens; a document
that does not fit is continued in the next row. Every token is trained, attention stays within a
document piece (the rows are packed rows), and when the files run out they are read again. The stream
has no state beyond its position, so the rows of a step are a function of the step: a resumed run reads
up to its step again and continues exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from ktrain.data.examples import Example
from ktrain.data.formats import encode, text_field
from ktrain.data.reading import DataError, iter_rows


class TextStream:
    """Packed rows of ``sequence_len`` tokens from the ``pretraining_dataset`` entries, endlessly."""

    def __init__(self, config: Any, tokenizer: Any):
        self.config, self.tokenizer = config, tokenizer

    def _documents(self, entry: Any, where: str) -> Iterator[list[int]]:
        tok = self.tokenizer
        for index, row in enumerate(iter_rows(entry, where)):
            field = entry.field or entry.text_column or "text"
            try:
                text = text_field(row.fields, field)
            except KeyError:
                raise DataError(f"{where}: sample {index} ({row.place}) has no field '{field}' of text") from None
            except TypeError as e:
                raise DataError(f"{where}: sample {index} ({row.place}): {e}") from None
            if text:
                bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
                yield [*bos, *encode(tok, text), tok.eos_token_id]

    def _epoch(self) -> Iterator[list[int]]:
        """One pass over every entry, a document from each in turn."""
        entries = self.config.pretraining_dataset
        streams = [self._documents(e, f"pretraining_dataset[{i}]") for i, e in enumerate(entries)]
        for batch in itertools.zip_longest(*streams):
            yield from (doc for doc in batch if doc is not None)

    def rows(self) -> Iterator[list[Example]]:
        """Rows of samples (document pieces) filling ``sequence_len`` exactly, without end."""
        length = self.config.sequence_len
        row: list[Example] = []
        space = length
        while True:
            empty = True
            for doc in self._epoch():
                empty = False
                while doc:
                    piece, doc = doc[:space], doc[space:]
                    row.append(Example(piece, piece))
                    space -= len(piece)
                    if space == 0:
                        yield row
                        row, space = [], length
            if empty:
                raise DataError("pretraining_dataset: the files hold no text")


class StreamRows:
    """The stream cut into steps of ``micro × accum × dp`` rows, laid out across ranks as ``BatchPlan`` does."""

    def __init__(self, stream: TextStream, micro: int, accum: int, dp_size: int, total_steps: int):
        self.micro, self.accum, self.dp_size = micro, accum, dp_size
        self.rows_per_step = micro * accum * dp_size
        self.steps_per_epoch = total_steps  # a stream has no epochs: the run is one
        self.n = self.rows_per_step * total_steps
        self._rows = stream.rows()
        self._next = 0

    def step(self, step: int) -> list[list[list[list[Example]]]]:
        """The rows of global ``step`` (steps come in order; the first call skips the steps before it)."""
        if step < self._next:
            raise ValueError(f"the stream is past step {step}")
        for _ in range((step - self._next) * self.rows_per_step):
            next(self._rows)
        rows = [next(self._rows) for _ in range(self.rows_per_step)]
        self._next = step + 1
        m, dp = self.micro, self.dp_size
        return [[rows[(k * dp + r) * m : (k * dp + r + 1) * m] for k in range(self.accum)] for r in range(self.dp_size)]

"""The rows ``ktrain bench`` times: random tokens of one length or of log-normal lengths, or a stream's first steps.

Every source has the shape of ``PlannedRows`` for one rank: ``step(i)`` gives ``[rank][micro] -> rows``,
each row a list of samples (one, or several when packed); every token of a synthetic sample is trained.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from ktrain.config.report import ConfigError
from ktrain.data.batches import row_tokens
from ktrain.data.examples import Example
from ktrain.data.formats import IGNORE
from ktrain.data.packing import pack
from ktrain.data.stream import StreamRows

LENGTH_SIGMA = 1.0
"""The spread of ``--lengths``: the natural log of a sample's length has this standard deviation."""
MIN_LENGTH = 2
Lengths = tuple[int, int, int]
"""``--lengths``: the median and the longest sample, and the peer's micro batch."""
Pairs = tuple[int, int]
"""``--pairs``: the tokens of each pair's prompt and of each of its two answers."""


class SyntheticRows:
    """Random-token rows of ``sequence_len`` tokens, each row one sample: two global batches used in turn,
    each with rows of its own for every one of ``dp_size`` data-parallel ranks."""

    def __init__(self, vocab_size: int, config: Any, dp_size: int = 1):
        micro, accum, seq = config.micro_batch_size, config.gradient_accumulation_steps, config.sequence_len
        shape = (2, dp_size, accum, micro, seq)
        ids = np.random.default_rng(config.seed).integers(0, vocab_size, size=shape, dtype=np.int32)
        self.batches = [
            [[[[Example(row, row)] for row in micro_rows] for micro_rows in rank] for rank in batch] for batch in ids
        ]
        self.dp_size = dp_size
        self.rows_per_step = dp_size * micro * accum
        self.steps_per_epoch = 2
        self.n = 2 * self.rows_per_step

    def step(self, step: int) -> list[list[list[list[Example]]]]:
        return self.batches[step % 2]


class PairRows:
    """Random-token preference pairs of stated lengths: each sample is a pair as a preference format writes it,
    ``prompt + chosen + prompt + rejected`` with only the answers labelled, one sample a row; two global batches
    used in turn, as ``SyntheticRows``. ``columns`` gives the same pairs as TRL's tokenized columns."""

    dp_size = 1

    def __init__(self, vocab_size: int, config: Any, prompt: int, answer: int):
        micro, accum = config.micro_batch_size, config.gradient_accumulation_steps
        rng = np.random.default_rng(config.seed)
        self.pairs = [
            [rng.integers(0, vocab_size, size=n, dtype=np.int64).tolist() for n in (prompt, answer, answer)]
            for _ in range(2 * micro * accum)
        ]
        samples = [self._sample(p, c, r) for p, c, r in self.pairs]
        self.batches = [
            [[[[samples[(b * accum + k) * micro + m]] for m in range(micro)] for k in range(accum)]] for b in range(2)
        ]
        self.rows_per_step = micro * accum
        self.tokens_per_step = self.rows_per_step * 2 * (prompt + answer)
        self.steps_per_epoch = 2
        self.n = 2 * self.rows_per_step

    @staticmethod
    def _sample(prompt: list[int], chosen: list[int], rejected: list[int]) -> Example:
        ignored = [IGNORE] * len(prompt)
        return Example(prompt + chosen + prompt + rejected, ignored + chosen + ignored + rejected)

    def step(self, step: int) -> list[list[list[list[Example]]]]:
        return self.batches[step % 2]

    def samples(self) -> list[Example]:
        """Every pair once, as its sample (both global batches)."""
        return [self._sample(p, c, r) for p, c, r in self.pairs]

    def columns(self, steps: int) -> dict[str, list[list[int]]]:
        """The pairs of ``steps`` steps as TRL's ``prompt_ids``, ``chosen_ids`` and ``rejected_ids``."""
        per_step = self.rows_per_step
        picked = [self.pairs[(i % 2) * per_step + k] for i in range(steps) for k in range(per_step)]
        names = ("prompt_ids", "chosen_ids", "rejected_ids")
        return {name: [pair[j] for pair in picked] for j, name in enumerate(names)}


class FetchedRows:
    """The rows of a streamed dataset's first ``steps`` steps, read once: a stream cannot be read twice (the
    peer's pass, then ktrain's), so both sides time the step, not the tokenization."""

    def __init__(self, stream: StreamRows, steps: int):
        self.rows = [stream.step(i) for i in range(steps)]
        self.dp_size, self.rows_per_step = stream.dp_size, stream.rows_per_step
        self.steps_per_epoch, self.n = steps, steps * stream.rows_per_step

    def step(self, step: int) -> list[list[list[list[Example]]]]:
        return self.rows[step]


def lognormal_lengths(count: int, median: int, cap: int, seed: int) -> np.ndarray:
    """``count`` sample lengths, log-normal around ``median`` (``LENGTH_SIGMA``), clipped to [2, ``cap``]."""
    drawn = np.random.default_rng(seed).lognormal(math.log(median), LENGTH_SIGMA, size=count)
    return np.clip(np.rint(drawn), MIN_LENGTH, cap).astype(np.int64)


class SampleRows:
    """Samples in rows (several to a row when packed), ``micro`` rows a micro-batch, in a seeded order; the
    rows repeat when the steps outrun them."""

    dp_size = 1

    def __init__(self, samples: list[Example], rows: list[list[int]], micro: int, accum: int, seed: int):
        self.samples, self.micro, self.accum = samples, micro, accum
        self.rows = rows[:]
        random.Random(f"ktrain-bench:{seed}").shuffle(self.rows)
        self.rows_per_step = micro * accum
        self.steps_per_epoch = max(1, len(self.rows) // self.rows_per_step)
        self.n = len(self.rows)

    def step(self, step: int) -> list[list[list[list[Example]]]]:
        start = step * self.rows_per_step
        picked = [self.rows[(start + k) % len(self.rows)] for k in range(self.rows_per_step)]
        rows = [[self.samples[i] for i in row] for row in picked]
        return [[rows[k * self.micro : (k + 1) * self.micro] for k in range(self.accum)]]


def padding(rows: Any, steps: range, pad_to: int | None) -> float:
    """The share of the positions a model computes over ``steps`` of ``rows`` (one rank's) that are padding:
    each micro-batch is padded to its longest row, or to ``pad_to``."""
    real = computed = 0
    for i in steps:
        for micro in rows.step(i)[0]:
            lengths = [row_tokens(row) for row in micro]
            real += sum(lengths)
            computed += len(micro) * (pad_to or max(lengths))
    return 1 - real / max(computed, 1)


def variable_length_rows(
    vocab_size: int, config: Any, median: int, cap: int, peer_micro: int, steps: int
) -> tuple[SampleRows, SampleRows]:
    """Random-token samples of log-normal lengths for ``steps`` steps of each side: the ktrain side's rows
    (packed into rows of ``sequence_len`` under ``sample_packing``, else one sample a row) and the peer's
    (one sample a row, ``peer_micro`` rows a micro-batch)."""
    if cap > config.sequence_len:
        raise ConfigError.single(
            "--lengths", f"the longest sample ({cap}) exceeds sequence_len ({config.sequence_len}); lower MAX"
        )
    micro, accum = config.micro_batch_size, config.gradient_accumulation_steps
    mean = min(cap, median * math.exp(LENGTH_SIGMA**2 / 2))
    per_row = max(1, math.ceil(config.sequence_len / mean)) if config.sample_packing else 1
    count = steps * accum * max(peer_micro, micro * per_row)
    lengths = lognormal_lengths(count, median, cap, config.seed)
    ids = np.random.default_rng(config.seed + 1).integers(0, vocab_size, size=int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    samples = [Example(ids[end - n : end], ids[end - n : end]) for n, end in zip(lengths, ends, strict=True)]
    single = [[i] for i in range(count)]
    packed = pack(lengths, config.sequence_len, config.sample_packing_method, config.seed)
    ours = SampleRows(samples, packed if config.sample_packing else single, micro, accum, config.seed)
    return ours, SampleRows(samples, single, peer_micro, accum, config.seed)


def pad_tokenizer(pad_id: int) -> Any:
    """A tokenizer that only knows its pad token, for rows that are token ids already: TRL wants one, and so does
    the preprocessing cache that ``--pairs`` writes under ``precompute_ref_log_probs``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<pad{i}>": i for i in range(pad_id + 1)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token=f"<pad{pad_id}>")))
    tokenizer.pad_token = tokenizer.eos_token = f"<pad{pad_id}>"
    return tokenizer

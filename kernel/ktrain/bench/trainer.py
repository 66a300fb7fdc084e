"""The kernel's trainer as ``ktrain bench`` drives it: built in two stages, stepped one step at a time, timed."""

from __future__ import annotations

import shutil
from typing import Any

import torch

from ktrain.bench.rows import (
    FetchedRows,
    Lengths,
    PairRows,
    Pairs,
    SampleRows,
    SyntheticRows,
    pad_tokenizer,
    variable_length_rows,
)
from ktrain.bench.timing import Timeline
from ktrain.config.report import ConfigError
from ktrain.data import cache, pipeline, templates
from ktrain.data.examples import Example, TableBuilder
from ktrain.data.pipeline import TrainData
from ktrain.data.stream import StreamRows
from ktrain.run import distributed
from ktrain.run.context import Run
from ktrain.run.trainer import Trainer


class TimedEngine:
    """The run's engine, unchanged, with timeline marks after each backward and after the optimizer step."""

    def __init__(self, engine: Any, timeline: Timeline):
        self.engine = engine
        self.timeline = timeline

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)
        self.timeline.mark("forward_backward")

    def step(self) -> torch.Tensor | float:
        norm = self.engine.step()
        self.timeline.mark("optimizer")
        return norm


class BenchTrainer(Trainer):
    """The kernel's trainer, built in two stages (data, then the model and engine) and driven step by step.

    The stages are ``Trainer._load`` and the start of ``Trainer.fit`` cut apart, so that the peer can run
    on the data before the ktrain model exists, and so that synthetic rows need no tokenizer.
    """

    def __init__(self, run: Run):
        super().__init__(run)
        self.timeline = Timeline(run.device)
        self.peer_rows: SampleRows | None = None

    def load_data(
        self, synthetic: bool, steps: int, lengths: Lengths | None = None, pairs: Pairs | None = None
    ) -> TrainData:
        """Synthetic rows (of ``lengths`` when given, the peer's then in ``self.peer_rows``; preference pairs of
        ``pairs``' lengths), or the config's data (for ``steps`` steps) through the tokenizer and the data pipeline."""
        run, config = self.run, self.config
        if synthetic or lengths or pairs:
            import transformers

            source = config.base_model_config or config.base_model
            vocab = transformers.AutoConfig.from_pretrained(source, trust_remote_code=config.trust_remote_code)
            if pairs:
                rows = PairRows(vocab.vocab_size, config, *pairs)
                if getattr(config, "precompute_ref_log_probs", False):  # the preference plugin's key
                    self._cache_pairs(rows)
                return TrainData(rows, [], False, False, [])
            if lengths:
                ours, self.peer_rows = variable_length_rows(vocab.vocab_size, config, *lengths, steps=steps)
                return TrainData(ours, [], config.sample_packing, False, [])
            return TrainData(SyntheticRows(vocab.vocab_size, config, run.mesh.dp_size), [], False, False, [])
        run.tokenizer = run.hook.ktrain_load_tokenizer(run=run)
        if config.chat_template or config.chat_template_jinja:
            name = templates.template_name(None, config)
            run.tokenizer.chat_template = templates.resolve(name, config, run.tokenizer, "chat_template")
        data = pipeline.load(run, distributed.barrier)
        print("\n".join(data.summary), flush=True)
        if data.train.steps_per_epoch == 0:
            raise ConfigError.single("datasets", "fewer training rows than one global batch: nothing to time")
        if isinstance(data.train, StreamRows):  # one step more: the last step run queues the next one's batch
            data.train = FetchedRows(data.train, steps + 1)
        return data

    def _cache_pairs(self, rows: PairRows) -> None:
        """The pairs as the run's preprocessing cache, which a pass before the first step reads as in a run
        (``precompute_ref_log_probs``); written afresh, so that the pass runs, and is timed, every time."""
        run = self.run
        run.tokenizer = pad_tokenizer(run.pad_id)
        folder = pipeline.cache_folder(run.config, run.output_dir, run.tokenizer, run.plan.formats)
        if run.local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
            builder = TableBuilder()
            for sample in rows.samples():
                builder.add(sample.input_ids, sample.labels)
            cache.write(folder, cache.Prepared(builder.table(), None, []))
        distributed.barrier()

    def build(self, data: TrainData, total_steps: int) -> None:
        """Load, wrap, parallelize and shard the model through the plugins, as a run does."""
        model = self.load_model()
        self.dp_rank = self.run.dp_rank()
        self.plan = data.train
        self.build_engine(model, total_steps)
        self.total_steps = total_steps + 1  # each step run queues the next one's batch, as in a run but its last
        self.engine = TimedEngine(self.engine, self.timeline)
        self.engine.train(True)

    def _to_device(self, rows: list[list[Example]], packed: bool) -> dict[str, Any]:
        batch = super()._to_device(rows, packed)
        self.timeline.mark("data")
        return batch

    def bench_step(self, step: int, data: TrainData) -> tuple[float, int]:
        """One optimizer step of the loop; returns (this rank's share of the token-mean loss, global input tokens)."""
        loss_sum, trained, inputs = self._train_step(step, data)
        return loss_sum / max(trained, 1), inputs

"""The training loop: load, wrap, parallelize, shard, then steps of accumulated micro-batches.

The loss handed to ``engine.backward`` is each rank's token sum divided by the trained tokens of the
whole global batch (all micro-batches, all data-parallel ranks) times the number of ranks whose
gradients are averaged (data-parallel and context-parallel ranks), so the averaged gradient is that of
the token-mean loss of the step: the same for any split of one global batch into ranks, sequence shards
and micro-batches, and never multiplied by accumulation. What is counted (trained tokens by default, pairs
for a preference objective), how rows are collated and the loss itself belong to the owner of the role
``objective`` (``ktrain_build_objective``).
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from ktrain.config.report import ConfigError
from ktrain.data import pipeline
from ktrain.data.batches import PlannedRows, row_tokens, to_device
from ktrain.data.examples import Example
from ktrain.data.pipeline import TrainData
from ktrain.data.preprocess import chat_ready
from ktrain.data.stream import StreamRows
from ktrain.run import checkpoints, distributed, host_gc, libraries, nonfinite, stop
from ktrain.run.context import Run, compute_dtype
from ktrain.run.early_stop import EarlyStop
from ktrain.run.faults import maybe_fault
from ktrain.run.host_loss import HostLoss
from ktrain.run.metrics import MetricsLog, flops_per_token, open_sinks, peak_flops, peak_memory_gib


class Trainer:
    """One rank's training: built from a ``Run``, driven by ``fit``."""

    def __init__(self, run: Run):
        self.run = run
        self.config = run.config
        self.tokens_seen = 0
        self.total_steps = 0
        self._ahead: tuple[int, list, dict[str, Any]] | None = None  # the next step's rows and first micro-batch
        self._settled = False  # whether the objects alive after the first step are out of the collector's passes

    # ---------------------------------------------------------------- setup

    def _load(self) -> tuple[Any, TrainData]:
        run, config = self.run, self.config
        run.tokenizer = chat_ready(run.hook.ktrain_load_tokenizer(run=run), config)  # exported, it chats as trained
        data = pipeline.load(run, distributed.barrier)
        if run.is_main:
            print("\n".join(data.summary), flush=True)
        return self.load_model(), data

    def load_model(self) -> Any:
        """Load the model and pass it through ``wrap_model`` and ``parallelize``."""
        run = self.run
        model_kwargs = run.plan.plugins.collect("ktrain_collect_model_kwargs", "model argument", run=run)
        model = run.hook.ktrain_load_model(run=run, model_kwargs=model_kwargs)
        model = run.plan.plugins.transform("ktrain_wrap_model", "model", model, run=run)
        model = run.plan.plugins.transform("ktrain_parallelize", "model", model, run=run)
        run.model = model
        self.attention = getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"
        return model

    def build_engine(self, model: Any, total_steps: int) -> None:
        """``shard`` the model into ``self.engine`` (optimizer and schedule for ``total_steps``), then the step."""
        run = self.run
        self.total_steps = total_steps

        def build_optimizer(params: Any) -> Any:
            return run.hook.ktrain_build_optimizer(params=params, run=run)

        def build_lr_scheduler(optimizer: Any) -> Any:
            return run.hook.ktrain_build_lr_scheduler(optimizer=optimizer, run=run, total_steps=total_steps)

        self.engine = run.hook.ktrain_shard(
            model=model, run=run, build_optimizer=build_optimizer, build_lr_scheduler=build_lr_scheduler
        )
        if run.compute_dtype == torch.float16 and not self.engine.owns_backward:
            self.engine.scaler = torch.amp.GradScaler(run.device.type)
        self.objective = run.hook.ktrain_build_objective(run=run, engine=self.engine)
        self.step_fn = run.plan.plugins.transform("ktrain_wrap_train_step", "step", self._forward, run=run)

    def _total_steps(self, plan: PlannedRows | StreamRows) -> int:
        if self.config.max_steps:
            return self.config.max_steps
        if plan.steps_per_epoch == 0:
            raise ConfigError.single(
                "datasets",
                f"{plan.n} training rows are fewer than one global batch of {plan.rows_per_step} "
                f"(micro_batch_size x gradient_accumulation_steps x {plan.dp_size} data-parallel ranks)",
            )
        return max(1, math.ceil(self.config.num_epochs * plan.steps_per_epoch))

    def _every(self, steps: int | None, per_epoch: int | None, steps_per_epoch: int) -> int | None:
        if steps:
            return steps
        if per_epoch:
            return max(1, math.ceil(steps_per_epoch / per_epoch))
        return None

    # ---------------------------------------------------------------- steps

    def _forward(self, batch: dict[str, torch.Tensor], num_items: float) -> torch.Tensor:
        return self.objective.loss(self.engine.module, batch, num_items)

    def _autocast(self) -> Any:
        dtype = self.run.compute_dtype
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.run.device.type, dtype=dtype)

    def _to_device(self, rows: list[list[Example]], packed: bool) -> dict[str, Any]:
        pad_to = self.config.sequence_len if self.config.pad_to_sequence_len else None
        attention = self.attention if packed else None
        batch = self.objective.collate(rows, self.run.pad_id, pad_to, attention, self.run.device)
        return {
            k: to_device(v, self.run.device) if isinstance(v, torch.Tensor) else v.to(self.run.device)
            for k, v in batch.items()
        }

    def _step_rows(self, step: int, data: TrainData) -> tuple[list, dict[str, Any] | None]:
        """The rows of ``step``, and its first micro-batch on the device where the step before queued it."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == step:
            return ahead[1], ahead[2]
        return data.train.step(step), None

    def _queue_next(self, step: int, data: TrainData) -> None:
        """Fetch, collate and copy the first micro-batch of the step after ``step``, while the device runs this
        step's backward: the host would otherwise do it after the update is queued, the device idle meanwhile."""
        if step + 1 >= self.total_steps:
            return
        rows = data.train.step(step + 1)
        self._ahead = (step + 1, rows, self._to_device(rows[self.dp_rank][0], data.train_packed))

    def _train_step(self, step: int, data: TrainData) -> tuple[float, int, int]:
        """One optimizer step; returns (local loss sum, global trained tokens, global input tokens)."""
        rows, first = self._step_rows(step, data)
        global_tokens = sum(self.objective.items(row) for rank in rows for micro in rank for row in micro)
        input_tokens = sum(row_tokens(row) for rank in rows for micro in rank for row in micro)
        num_items = max(global_tokens, 1) / self.run.mesh.gradient_ranks
        mine = rows[self.dp_rank]
        losses = []  # each copied to the host once its forward is queued, read after the last backward is
        for k, micro in enumerate(mine):
            batch = first if k == 0 and first is not None else self._to_device(micro, data.train_packed)
            with self.engine.accumulate(last=k == len(mine) - 1):
                maybe_fault("forward", step + 1, self.run.rank)
                with self._autocast():
                    loss = self.step_fn(batch, num_items)
                losses.append(HostLoss(loss))
                maybe_fault("backward", step + 1, self.run.rank)
                self.engine.backward(loss)
        self._queue_next(step, data)
        loss_sum = sum(loss.read() for loss in losses) * num_items
        maybe_fault("optimizer", step + 1, self.run.rank)
        if nonfinite.skipped(self.run, self.engine, step + 1, loss_sum):  # NaN/inf on a rank: stop, or all skip
            self.grad_norm = math.nan
            return loss_sum, global_tokens, input_tokens
        self.grad_norm = self.engine.step()
        if not self._settled:  # the first step has built what stays (compiled graphs, optimizer states)
            host_gc.settle()
            self._settled = True
        return loss_sum, global_tokens, input_tokens

    @torch.no_grad()
    def evaluate(self, eval_set: list[list[Example]], packed: bool) -> float:
        """Token-mean loss over the held-out rows, shared out over the data-parallel ranks."""
        self.engine.train(False)
        mine = eval_set[self.dp_rank :: self.plan.dp_size]
        size = self.config.eval_batch_size or self.config.micro_batch_size
        batches = math.ceil(math.ceil(len(eval_set) / self.plan.dp_size) / size)
        loss_sum = tokens = 0.0
        for b in range(batches):  # every rank runs as many forwards: sharded forwards are collective
            rows = mine[b * size : (b + 1) * size]
            batch = self._to_device(rows or eval_set[:1], packed)
            with self._autocast():
                loss = self.step_fn(batch, 1.0)
            if rows:
                loss_sum += float(loss)
                tokens += sum(self.objective.items(row) for row in rows)
        self.engine.train(True)
        total_loss, total_tokens = distributed.all_reduce_sum([loss_sum, tokens])
        mesh = self.run.mesh
        return (total_loss / mesh.copies) / max(total_tokens / (mesh.world_size // mesh.dp_size), 1)

    # ---------------------------------------------------------------- the run

    def fit(self, resume: bool) -> dict[str, float]:
        """Train to the end (or from the latest checkpoint with ``resume``); return the final metrics."""
        run, config = self.run, self.config
        model, data = self._load()
        self.dp_rank = run.dp_rank()
        self.plan = data.train
        total = self._total_steps(self.plan)
        self.build_engine(model, total)
        start, state = 0, {}
        point = (
            checkpoints.find_resume_point(
                run, config.resume_from_checkpoint, required=resume and not config.auto_resume_from_checkpoints
            )
            if (resume or config.resume_from_checkpoint or config.auto_resume_from_checkpoints)
            else None
        )
        if point is not None:
            state = checkpoints.load(run, self.engine, point)
            start, self.tokens_seen = state["step"], state.get("tokens_seen", 0)
            if run.is_main:
                print(f"resumed from {point} at step {start}", flush=True)
        self.early = EarlyStop(config.early_stopping_patience, config.load_best_model_at_end, state.get("early_stop"))
        sinks = open_sinks(run) if run.is_main else []
        run.log = MetricsLog(run.output_dir / "metrics.jsonl", start, total, sinks, enabled=run.is_main)
        try:
            return self._loop(start, total, data)
        finally:
            run.log.close()
            host_gc.release()

    def _loop(self, start: int, total: int, data: TrainData) -> dict[str, float]:
        run, config = self.run, self.config
        save_every = (
            None
            if config.save_strategy == "no"
            else self._every(
                config.save_steps,
                config.saves_per_epoch or (1 if config.save_strategy == "epoch" else None),
                self.plan.steps_per_epoch,
            )
        )
        eval_every = self._every(config.eval_steps, config.evals_per_epoch, self.plan.steps_per_epoch)
        seq_flops = flops_per_token(self.engine.model, config.sequence_len)
        peak = peak_flops(run.device)
        run.step = start  # 0 in a fresh run: what ktrain_on_train_start tells a resumed run by
        run.hook.ktrain_on_train_start(run=run, engine=self.engine)
        self.engine.train(True)
        with stop.deferred():  # a signal: every rank stops at the next step's check (SIGTERM, SIGUSR1: after its save)
            metrics = self._steps(start, total, data, save_every, eval_every, seq_flops, peak)
            self._restore_best()
            self._export()
        run.hook.ktrain_on_train_end(run=run, engine=self.engine, metrics=metrics)
        return metrics

    def _steps(
        self,
        start: int,
        total: int,
        data: TrainData,
        save_every: int | None,
        eval_every: int | None,
        seq_flops: float,
        peak: float | None,
    ) -> dict[str, float]:
        """Steps ``start`` to ``total``: train, log, evaluate and save; return the last logged metrics."""
        run, config = self.run, self.config
        window_loss = window_tokens = window_inputs = 0.0
        window_start, last_saved, metrics = time.perf_counter(), start, {}
        watchdog = nonfinite.LossWatchdog(config.loss_watchdog_threshold, config.loss_watchdog_patience)
        for step in range(start, total):
            run.step = step + 1
            loss_sum, tokens, inputs = self._train_step(step, data)
            window_loss += loss_sum
            window_tokens += tokens
            window_inputs += inputs
            self.tokens_seen += inputs
            if run.step % config.logging_steps == 0 or run.step == total:
                (reduced,) = distributed.all_reduce_sum([window_loss])
                elapsed = time.perf_counter() - window_start
                metrics = {
                    "loss": reduced / run.mesh.copies / max(window_tokens, 1),
                    "lr": self.engine.lr(),
                    "grad_norm": float(self.grad_norm),
                    "tokens_per_s": window_inputs / elapsed,
                    "epoch": round(run.step / max(self.plan.steps_per_epoch, 1), 4),
                }
                if peak:
                    metrics["mfu"] = window_inputs * seq_flops / elapsed / (peak * run.world_size)
                metrics["peak_mem_gib"] = peak_memory_gib(run.device)
                metrics.update(run.plan.plugins.collect("ktrain_collect_metrics", "metric", run=run, step=run.step))
                run.log.write(run.step, metrics)
                watchdog.observe(run.step, metrics["loss"])
                window_loss = window_tokens = window_inputs = 0.0
                window_start = time.perf_counter()
            else:  # the loss and the gradient norm are read from the device on logged steps only
                metrics = {"lr": self.engine.lr()}
            run.hook.ktrain_on_step_end(run=run, step=run.step, metrics=metrics)
            run.log.tick(run.step)
            save_now = bool(save_every) and (run.step % save_every == 0 or run.step == total) and run.step != last_saved
            stopping = False
            if data.eval_rows and (
                (eval_every and run.step % eval_every == 0) or run.step == total or (save_now and self.early.on)
            ):  # tracking the best checkpoint, every save has its eval loss
                eval_metrics = {"eval_loss": self.evaluate(data.eval_rows, data.eval_packed)}
                run.log.write(run.step, eval_metrics)
                run.hook.ktrain_on_eval_end(run=run, step=run.step, metrics=eval_metrics)
                stopping = self.early.on and self.early.observe(run.step, eval_metrics["eval_loss"])
            if save_now:
                self._save()
                last_saved = run.step
            if stop.agreed():  # pre-empted (SIGTERM, SIGUSR1): the step is done; save it, then every rank stops
                if config.save_strategy != "no" and run.step != last_saved:
                    self._save()
                raise stop.Interrupted(stop.agreed())
            if stopping:
                if run.is_main:
                    print(
                        f"stopped early at step {run.step}: eval_loss has not improved on {self.early.best_loss:.4g} "
                        f"for {self.early.since_best} evaluations (early_stopping_patience)",
                        flush=True,
                    )
                break
        return metrics

    def _save(self) -> None:
        """Save the checkpoint of the step just finished (collectively) and tell the plugins."""
        run = self.run
        state: dict[str, Any] = {"step": run.step, "tokens_seen": self.tokens_seen}
        if self.early.on:
            self.early.saving(run.step)
            state["early_stop"] = self.early.state_dict()
        path = checkpoints.save(run, self.engine, run.step, state, keep=self.early.best_step())
        run.hook.ktrain_on_checkpoint_saved(run=run, step=run.step, path=path)

    def _restore_best(self) -> None:
        """Where the run ranks its checkpoints by eval loss: the best one's weights loaded back to be exported."""
        best = self.early.best_step()
        if best is None:
            return
        path = checkpoints.path_of(self.run.output_dir, best)
        if best != self.run.step:
            checkpoints.load(self.run, self.engine, path)
        if self.run.is_main:
            loss = self.early.best_checkpoint[1]
            print(f"final model: the weights of step {best}, the best checkpoint's eval_loss {loss:.4g} ({path})")

    def _export(self) -> None:
        run = self.run
        staging, final = run.output_dir / ".tmp-final", run.output_dir / "final"
        if run.is_main and staging.exists():
            shutil.rmtree(staging)
        distributed.barrier()
        run.hook.ktrain_export_model(engine=self.engine, run=run, path=staging)
        distributed.barrier()
        if run.is_main:
            old = run.output_dir / ".old-final"
            if final.exists():
                final.rename(old)
            staging.rename(final)
            if old.exists():
                shutil.rmtree(old)
            print(f"model written to {final}", flush=True)
        distributed.barrier()


def rank_run(run_dir: Path, extra_plugins: tuple = ()) -> Run:
    """This rank's run of the plan in ``run_dir``: seeds set, the process group started (torchrun's env)."""
    from ktrain.config.plan import prepare

    rank, local_rank, world = distributed.rank_env()
    plan = prepare(run_dir / "config.yaml", world_size=world, with_defaults=True, extra_plugins=extra_plugins)
    libraries.no_unused_deepspeed()
    device = distributed.pick_device(local_rank)
    random.seed(plan.config.seed)  # Python's generator too: its state is part of every checkpoint
    torch.manual_seed(plan.config.seed)
    if plan.config.tf32 and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return Run(
        plan=plan,
        output_dir=run_dir,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        device=device,
        device_mesh=distributed.init(plan.mesh, device),
        compute_dtype=compute_dtype(plan.config, device),
    )


def rank_main(run_dir: Path, resume: bool, extra_plugins: tuple = ()) -> dict[str, float]:
    """Everything one rank does: read the plan, start the process group, train, shut down.

    ``extra_plugins`` are ``(name, object)`` pairs registered as if installed (benchmarks, tests).
    Returns the final metrics.
    """
    from ktrain.run.directory import lock_workers

    lock = lock_workers(run_dir)
    try:
        run = rank_run(run_dir, extra_plugins)
        try:
            return Trainer(run).fit(resume)
        except BaseException as e:
            run.hook.ktrain_on_exception(run=run, error=e)
            raise
    finally:
        distributed.shutdown()
        lock.close()

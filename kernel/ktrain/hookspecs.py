"""The hook contract: the one file a plugin author reads.

Hooks are grouped by the phase of a run in which they are called. Every hook takes keyword arguments
only; an implementation may accept any subset of them, and new arguments may be added (hooks only
grow). Names say how a hook is called:

- ``ktrain_register_*``: every plugin answers by calling ``register(...)`` once per thing it adds; the
  kernel keeps the policy (names, collisions, who gave what).
- ``ktrain_collect_*``: every plugin answers with a mapping; the kernel merges them and a key given by
  two plugins is an error naming both.
- ``ktrain_load_*``, ``ktrain_build_*``, ``ktrain_shard(_frozen)``, checkpoint and export hooks: *stops at the
  first non-None result*. Each belongs to an exclusive **role**; the kernel activates exactly one
  owner per role (a plugin that claims it, or else the kernel's default), so the first result is
  never a silent pick between two plugins.
- ``ktrain_wrap_model``, ``ktrain_parallelize``, ``ktrain_wrap_train_step``: transforms applied in
  turn; each returns a replacement or None to keep what it got.
- ``ktrain_on_*``: observers; results are ignored.

Two kinds of object implement hooks. A plugin's *entry module* (named by its entry point) is loaded by
every command, so it must import nothing heavy: it declares config keys, checks and, when its keys are
present, activates a *runtime object* in ``ktrain_activate``. The runtime object implements the run
hooks and may import torch, deepspeed, peft and the rest.

Roles used by the kernel (a plugin may define more, e.g. ``op:rms_norm`` for a patched kernel op):

===================== =========================================== ==================================
role                  hooks                                       default owner
===================== =========================================== ==================================
``model_loader``      load_model, load_tokenizer                  ``ktrain.builtin.hf_model``
``sharding``          shard, shard_frozen                         ``ktrain.builtin.data_parallel``
``optimizer``         build_optimizer                             ``ktrain.builtin.optimizers``
``lr_scheduler``      build_lr_scheduler                          ``ktrain.builtin.schedulers``
``checkpoint_format`` save_checkpoint, load_checkpoint            ``ktrain.builtin.local_checkpoint``
``export``            export_model                                ``ktrain.builtin.hf_model``
``objective``         build_objective                             ``ktrain.builtin.causal_lm``
``mesh:<dim>``        parallelize over a mesh dimension           none: a size > 1 needs an owner
===================== =========================================== ==================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from ktrain import PROJECT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from torch import nn
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler

    from ktrain.config.launch import Launch
    from ktrain.config.mesh import MeshPlan
    from ktrain.config.model import Config
    from ktrain.config.report import Report
    from ktrain.engine import Engine
    from ktrain.memory.shape import ModelShape
    from ktrain.run.context import Run
    from ktrain.run.objective import Objective

hookspec = pluggy.HookspecMarker(PROJECT)


# --------------------------------------------------------------------------------------------------
# Configuration: called by every command, before torch is imported. Entry modules answer these.
# --------------------------------------------------------------------------------------------------


@hookspec
def ktrain_register_config(register: Callable[..., None]) -> None:
    """Declare the config keys this plugin owns.

    Called once per command, on the launching process only, before any YAML is read.

    ``register(section, *, docs_url=None)`` takes an attrs class whose fields are top-level YAML keys
    (flat, as users write them). Every field needs a default; ``attrs.field(metadata={"help": ...})``
    documents it for ``ktrain check`` and docs/config.md. A key registered by two plugins is an error
    naming both. A plugin is *present* in a run when the YAML sets one of its keys.
    """


@hookspec
def ktrain_activate(config: Config, activate: Callable[..., None]) -> None:
    """Decide whether this plugin takes part in the run, and register its runtime object.

    Called once per command on the launching process, after the config is structured, and again on
    every rank before the run starts. ``activate(obj, *, roles=(), keys=())`` registers ``obj`` (any
    object with hook implementations) and claims the exclusive ``roles`` for it; ``keys`` names the
    config keys that enabled it, for error messages. Two plugins claiming one role stop the run before
    any rank starts, with both named. ``obj`` may be the string ``"module:attribute"`` of a callable
    taking the config and returning the runtime object: the kernel imports that module and calls it only
    on the ranks, so the config phase (``ktrain check``) imports no runtime module; every first-party
    plugin activates so.
    """


@hookspec
def ktrain_validate_config(config: Config, report: Report, launch: Launch | None) -> None:
    """Check relations between keys (one key alone is checked by its attrs type).

    Called on the launching process after activation, on entry modules and runtime objects. Add
    problems with ``report.error(path, message)`` and notes with ``report.warn(path, message)``; a
    message says what to do. Must not import torch or touch a device. Every plugin answers.

    ``launch`` says where the run will happen: under ``ktrain run`` a ``Launch`` with the world size and
    the device type of the ranks (``"cuda"`` or ``"cpu"``) and on GPUs their lowest compute capability
    (``capability``), so a check that depends on them can refuse the run before any rank starts; under
    ``ktrain check --world-size N`` a ``Launch`` with that world size and no device; otherwise (``ktrain
    check``, on the ranks) None: warn instead of refusing. Under ``ktrain plan``, trying a layout, a
    ``Launch`` with ``planned`` true: leave out a check that imports the run's libraries or reads this machine.
    """


@hookspec
def ktrain_collect_mesh_dims(config: Config) -> dict[str, int] | None:
    """Return extra named device-mesh dimensions and their sizes, e.g. ``{"ep": 2}``.

    The kernel's own dimensions (``dp_replicate``, ``dp_shard``, ``cp``, ``tp``) come from its keys; a
    plugin may size one of them when its key is unset (``sequence_parallel_degree`` sizes ``cp``).
    Every plugin answers; a name given twice is an error. A dimension of size > 1 must be owned by an
    active plugin through the role ``mesh:<name>``.

    Ranks along ``dp_replicate``, ``dp_shard`` and ``cp`` hold the same parameters and train on
    different tokens (``cp`` splits each row's sequence): a sharding plugin averages gradients over all
    three (``run.mesh.gradient_ranks`` of them). Ranks along any other dimension (``tp``, a plugin's)
    compute on the same tokens.
    """


@hookspec
def ktrain_collect_memory(config: Config, mesh: MeshPlan, model_shape: ModelShape) -> dict[str, Any] | None:
    """Return this plugin's part of the memory model of one rank (``ktrain plan``, ``ktrain check``).

    Names and their values are those of ``ktrain.memory.parts``: ``"weights"`` (rewrite the parameter
    tensors: adapters, quantized bases), ``"sharding"`` (what a rank holds of parameters, gradients and
    optimizer states), ``"optimizer"`` (states per trained element), ``"parallel"`` (tensor and context
    parallel sizes), ``"loss"`` (``"fused"``: no whole-sequence logits), ``"checkpointing"``. Called on the
    launching process with the resolved mesh and the shape from the model's config.json; must not import
    torch. Every plugin answers; a name given twice is an error. An active plugin that owns a role and gives
    nothing is reported as not modelled.
    """


@hookspec
def ktrain_register_optimizers(register: Callable[..., None]) -> None:
    """Add optimizers by name: ``register(name, factory)``.

    ``factory(params, config)`` returns a ``torch.optim.Optimizer`` for the parameter groups
    ``params``. The ``optimizer`` key chooses among all registered names. Every plugin answers; a
    name registered twice is an error.
    """


@hookspec
def ktrain_register_lr_schedulers(register: Callable[..., None]) -> None:
    """Add learning-rate schedules by name: ``register(name, factory)``.

    ``factory(optimizer, config, total_steps, warmup_steps)`` returns a
    ``torch.optim.lr_scheduler.LRScheduler`` stepped once per optimizer step. The ``lr_scheduler`` key
    chooses among all registered names. Every plugin answers.
    """


@hookspec
def ktrain_register_dataset_formats(register: Callable[..., None]) -> None:
    """Add dataset row formats by name: ``register(name, tokenize)``.

    ``tokenize(row, tokenizer, entry, config)`` turns one row (a dict) of a dataset whose ``type`` is
    ``name`` into ``{"input_ids": [...], "labels": [...]}`` with label -100 on tokens not trained on,
    or returns None to skip the row, or a list of such samples when the row makes several (each then
    a sample of its own). ``entry`` is the ``datasets:`` item. Every plugin answers.
    A format whose sample holds several sequences end to end (a preference pair, read back by the
    plugin's ``ktrain_build_objective``) sets the attribute ``tokenize.sequences``: the sample is then
    cut at ``sequence_len`` times that.
    """


@hookspec
def ktrain_register_commands(register: Callable[..., None]) -> None:
    """Add ``ktrain`` sub-commands: ``register(name, help, configure, run)``.

    ``configure(parser)`` adds arguments to an ``argparse`` parser; ``run(args)`` executes and returns
    an exit code. Called when the CLI starts, so keep imports inside ``run``. Every plugin answers.
    """


@hookspec
def ktrain_register_checkpoint_formats(register: Callable[..., None]) -> None:
    """Add readers of checkpoint formats for ``ktrain export``: ``register(name, read_state_dict)``.

    ``read_state_dict(path, manifest)`` returns the whole model's state dict (CPU tensors, the names
    ``transformers`` uses) from the committed checkpoint folder ``path`` whose manifest says
    ``"format": name``, without starting a run or a process group. Every plugin answers.
    """


@hookspec
def ktrain_register_metric_sinks(register: Callable[..., None]) -> None:
    """Add places logged metrics go: ``register(name, factory)``.

    ``factory(run)`` is called on rank 0 at the start of training and returns an object with
    ``write(step: int, metrics: dict)`` and ``close()``, or None when the config does not ask for it.
    Every plugin answers; metrics.jsonl is always written by the kernel.
    """


# --------------------------------------------------------------------------------------------------
# Model: called on every rank, in this order, inside the run.
# --------------------------------------------------------------------------------------------------


@hookspec
def ktrain_collect_model_kwargs(run: Run) -> dict[str, Any] | None:
    """Return keyword arguments for ``from_pretrained`` (e.g. ``quantization_config``, ``attn_implementation``).

    Every plugin answers; the kernel merges them and a key given by two plugins is an error.
    """


@hookspec(firstresult=True)
def ktrain_load_tokenizer(run: Run) -> Any:
    """Load the tokenizer of ``run.config``.

    Role ``model_loader``; stops at the first non-None result. Called on every rank.
    """


@hookspec(firstresult=True)
def ktrain_load_model(run: Run, model_kwargs: dict[str, Any]) -> nn.Module:
    """Load the model (an ``nn.Module`` whose forward takes ``input_ids``, ``labels`` and returns ``.loss``).

    Called on every rank with the merged ``model_kwargs``. Role ``model_loader``; stops at the first
    non-None result. The model is on CPU or ``run.device``, in fp32 unless the loader says otherwise.
    """


@hookspec
def ktrain_wrap_model(model: nn.Module, run: Run) -> nn.Module | None:
    """Transform the loaded model: adapters (LoRA), patched kernels (Liger), and the like.

    Called on every rank after loading. Each implementation returns a replacement model or None to
    keep ``model``; they run in plugin order, each getting the previous result.
    """


@hookspec
def ktrain_parallelize(model: nn.Module, run: Run) -> nn.Module | None:
    """Apply tensor/context/sequence parallelism on ``run.mesh``, then activation checkpointing, then compile.

    Called on every rank after ``ktrain_wrap_model`` and before ``ktrain_shard``. Returns a
    replacement or None. A plugin that parallelizes over a mesh dimension claims ``mesh:<name>``.
    """


@hookspec(firstresult=True)
def ktrain_shard(
    model: nn.Module,
    run: Run,
    build_optimizer: Callable[[Iterable[Any]], Optimizer],
    build_lr_scheduler: Callable[[Optimizer], LRScheduler],
) -> Engine:
    """Wrap the model for data parallelism and return a ``ktrain.engine.Engine``.

    Called on every rank after ``ktrain_parallelize``. The optimizer and scheduler arrive as factories
    because a sharding plugin must build them after sharding (FSDP2) or hand them to its own engine
    (DeepSpeed). The engine says which of backward, accumulation, clipping and the scheduler step it
    owns. Role ``sharding``; stops at the first non-None result. Default: one process or DDP.
    """


@hookspec(firstresult=True)
def ktrain_shard_frozen(module: nn.Module, run: Run) -> nn.Module | None:
    """Place a frozen module beside the policy (a preference run's reference model), sharded as the policy is.

    Called on every rank, collectively, after ``ktrain_shard``, by a plugin that keeps a frozen model (a copy
    of the model as loaded, whole, with ``requires_grad`` off). The answer is the module to call in its place:
    no gradients, no optimizer, forward only (under ``torch.no_grad``), on the policy's mesh with the policy's
    mixed-precision policy, so its outputs are those of the policy as loaded. None keeps ``module`` whole on
    every rank. Role ``sharding``; stops at the first non-None result. Default: ``module`` moved to the device.
    """


@hookspec
def ktrain_collect_ddp_options(run: Run) -> dict[str, Any] | None:
    """Return options of the kernel's default DDP: constructor keywords, and a comm hook with its state.

    Called on every rank by the default ``sharding`` owner, once, when it wraps the model in DDP (more
    than one gradient rank); not called in a one-process run or when a plugin owns ``sharding``.
    Keywords of ``DistributedDataParallel`` (``bucket_cap_mb``, ``gradient_as_bucket_view``,
    ``static_graph``, ...; not ``module``, ``device_ids`` or ``process_group``, which the kernel sets),
    plus ``comm_hook`` and ``comm_state``, given to ``register_comm_hook(comm_state, comm_hook)``
    after wrapping. Every plugin answers; an option given by two plugins is an error naming both.
    """


@hookspec(firstresult=True)
def ktrain_build_optimizer(params: Iterable[Any], run: Run) -> Optimizer:
    """Build the optimizer for ``params`` (parameter groups). Role ``optimizer``; first result wins.

    The default builds the optimizer registered under ``config.optimizer``, with decay applied to
    matrices only.
    """


@hookspec(firstresult=True)
def ktrain_build_lr_scheduler(optimizer: Optimizer, run: Run, total_steps: int) -> LRScheduler:
    """Build the learning-rate scheduler for ``optimizer``. Role ``lr_scheduler``; first result wins."""


# --------------------------------------------------------------------------------------------------
# The loop.
# --------------------------------------------------------------------------------------------------


@hookspec
def ktrain_wrap_train_step(step: Callable[..., Any], run: Run) -> Callable[..., Any] | None:
    """Wrap the micro-step ``step(batch, num_items) -> loss``; e.g. to enter a context-parallel region.

    ``batch`` holds ``input_ids``, ``labels`` and ``attention_mask`` (and ``position_ids`` for packed
    rows) on the device; ``num_items`` is the divisor of this rank's token-sum loss (trained tokens of
    the global batch / ``run.mesh.gradient_ranks``).

    Called once on every rank before the loop; each returns a replacement or None. The returned
    callable must call the one it got. Evaluation goes through it too (``num_items`` 1, no gradients).
    """


@hookspec(firstresult=True)
def ktrain_build_objective(run: Run, engine: Engine) -> Objective:
    """Return the training objective: what a row counts for, how rows are collated, and the loss.

    Called on every rank once, after ``ktrain_shard`` (``engine.module`` is what the loss calls;
    ``run.model`` the model before data parallelism, e.g. to switch an adapter off for a reference).
    The answer is a ``ktrain.run.objective.Objective``: ``items(row)`` (what a row adds to the divisor of
    the loss: trained tokens, pairs), ``collate(rows, pad_id, pad_to, packed_attention, device)`` and
    ``loss(model, batch, num_items)`` (the items' loss sum over ``num_items``, the items of the global
    batch divided by ``run.mesh.gradient_ranks``), so the loss is that of the whole global batch for any
    split into ranks and micro-batches. ``ktrain_wrap_train_step`` wraps the call of ``loss``; evaluation
    goes through it too. Role ``objective``; first result wins. Default: the causal-LM loss.
    """


@hookspec
def ktrain_collect_metrics(run: Run, step: int) -> dict[str, float] | None:
    """Return extra metrics for the logged step ``step`` (rank 0 logs them). Names must not clash."""


@hookspec
def ktrain_collect_checkpoint_state(run: Run) -> dict[str, Any] | None:
    """Return objects with ``state_dict()``/``load_state_dict()`` to save with every checkpoint.

    Called on every rank when saving (after ``ktrain_save_checkpoint``) and when resuming (after
    ``ktrain_shard`` and ``ktrain_load_checkpoint``, before ``ktrain_on_train_start``); keys name the
    objects and must not clash. Rank R's states are saved in the checkpoint's ``rank-R.pt`` beside the
    kernel's own (RNG, grad scaler) and read back with ``torch.load(weights_only=True)``: tensors,
    numbers, strings, None, and lists, tuples and dicts of them. On resume, ``load_state_dict`` is called
    only on a rank whose file exists and holds the name: at a larger world size the new ranks keep their
    fresh state, at a smaller one the extra files are not read.
    """


# --------------------------------------------------------------------------------------------------
# Checkpoints and export.
# --------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def ktrain_save_checkpoint(engine: Engine, run: Run, path: Path) -> dict[str, Any] | None:
    """Write the model and optimizer state of ``engine`` into the staging folder ``path``.

    Called on every rank, collectively. ``path`` exists and is shared by all ranks; the kernel
    commits it (manifest, rename) only after every rank returned. Return a dict of facts for the
    manifest, at least ``{"format": NAME}``. Role ``checkpoint_format``; first result wins.
    """


@hookspec(firstresult=True)
def ktrain_load_checkpoint(engine: Engine, run: Run, path: Path, manifest: dict[str, Any]) -> bool | None:
    """Restore the model and optimizer state of ``engine`` from the committed checkpoint ``path``.

    Called on every rank. ``manifest`` is what the save returned plus the kernel's facts; refuse a
    format that is not yours with a clear error. Return True. Role ``checkpoint_format``.
    """


@hookspec(firstresult=True)
def ktrain_export_model(engine: Engine, run: Run, path: Path) -> bool | None:
    """Write the trained model to ``path`` as HF safetensors that ``transformers`` loads.

    Called on every rank, collectively, at the end of training; only rank 0 writes. Return True.
    Role ``export``; first result wins.
    """


# --------------------------------------------------------------------------------------------------
# Observers: every plugin is called; results are ignored.
# --------------------------------------------------------------------------------------------------


@hookspec
def ktrain_on_train_start(run: Run, engine: Engine) -> None:
    """Called on every rank after resume, before the first step."""


@hookspec
def ktrain_on_step_end(run: Run, step: int, metrics: dict[str, float]) -> None:
    """Called on every rank after each optimizer step.

    ``metrics`` holds ``lr`` of the step; on logged steps (``logging_steps``) also its ``grad_norm``, the
    loss over the window and the rest of what metrics.jsonl gets (reading those waits for the device, so
    the other steps leave them there).
    """


@hookspec
def ktrain_on_eval_end(run: Run, step: int, metrics: dict[str, float]) -> None:
    """Called on every rank after each evaluation, with ``eval_loss`` and the like."""


@hookspec
def ktrain_on_checkpoint_saved(run: Run, step: int, path: Path) -> None:
    """Called on every rank after the checkpoint of ``step`` was committed at ``path``."""


@hookspec
def ktrain_on_exception(run: Run, error: BaseException) -> None:
    """Called on the rank where training raised, before the error propagates."""


@hookspec
def ktrain_on_train_end(run: Run, engine: Engine, metrics: dict[str, float]) -> None:
    """Called on every rank after the last step and the export, with the final metrics."""

"""The runtime object of a run with ``deepspeed:``: DeepSpeed's check, ZeRO-3 loading, the engine, checkpoints.

Activated on the launching process (where it lets DeepSpeed check the JSON before any rank starts) and on
every rank. Importing this module imports DeepSpeed, on its CPU accelerator where there is no GPU.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import attrs
import torch

from ktrain import hookimpl
from ktrain.config.report import ConfigError, Report
from ktrain_deepspeed import build_ops, checkpoint, links, zero
from ktrain_deepspeed.accelerator import load_deepspeed
from ktrain_deepspeed.engine import DeepSpeedEngine
from ktrain_deepspeed.source import read

deepspeed = load_deepspeed()
# DeepSpeed calls collectives torch has renamed; the warning, printed on every call, is not the user's to act on.
warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)

HIDDEN_LINKS = tuple(link.path for link in links.LINKS if link.source == links.HIDDEN_SIZE)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay on matrices only, as the kernel does, judged by the full shape (ZeRO-3 partitions are flat)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if len(getattr(p, "ds_shape", p.shape)) >= 2]
    rest = [p for p in params if len(getattr(p, "ds_shape", p.shape)) < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def hidden_size(config: Any) -> int:
    """The model's hidden size, from its config (the bucket sizes written as "auto" follow it)."""
    import transformers

    source = config.base_model_config or config.base_model
    model_config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=config.trust_remote_code)
    size = getattr(model_config.get_text_config(), "hidden_size", None)
    if not isinstance(size, int):
        raise ConfigError.single(
            "deepspeed", f'{source} has no hidden_size for the bucket sizes written as "auto"; write numbers'
        )
    return size


def describe_zero3_load(model: torch.nn.Module) -> str:
    """Whether the model was built partitioned (inside ``zero.Init``), and how much of it this rank holds."""
    parts = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not parts:
        return "the model was loaded whole on every rank (its loader did not use zero.Init); ZeRO-3 partitions it now"
    held, total = sum(p.ds_tensor.numel() for p in parts), sum(p.ds_numel for p in parts)
    return f"ZeRO-3 built the model inside zero.Init: this rank holds {held:,} of its {total:,} parameters"


def optimizer_ops(settings: dict[str, Any], cpu_adam: bool) -> tuple[str, ...]:
    """The op DeepSpeed compiles for the optimizer: CPU Adam when ktrain hands it (``cpu_adam``) or an offloaded
    JSON Adam asks for it, FusedAdam for a JSON Adam on the device (without ``torch_adam``); else none."""
    named = settings.get("optimizer", {})
    adam = str(named.get("type", "")).lower() in ("adam", "adamw")
    if cpu_adam or (adam and zero.offloads_optimizer(settings)):
        return ("CPUAdamBuilder",)
    if adam and not named.get("params", {}).get("torch_adam", False):
        return ("FusedAdamBuilder",)
    return ()


def join_process_group(run: Any) -> None:
    """Hand DeepSpeed the run's process group (a one-rank group in a one-process run, which has none)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        for name, value in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)):  # DeepSpeed reads them
            os.environ.setdefault(name, str(value))
        backend = "nccl" if run.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    build_ops.announce(run, ("ShareMemCommBuilder",))  # built at the start of DeepSpeed's communication on CPUs
    deepspeed.init_distributed(auto_mpi_discovery=False, verbose=False)


def zero3_frozen(module: torch.nn.Module, settings: dict[str, Any]) -> Any:
    """``module`` (whole, frozen) partitioned by ZeRO-3 over the policy's ranks with the policy's JSON, less its
    optimizer and scheduler: each parameter is moved to the device and partitioned in turn (``zero.Init`` of an
    existing module), so the device never holds the whole module; ``deepspeed.initialize`` then gives the engine
    that gathers each block's parameters for its forward and releases them after it."""
    frozen = {name: value for name, value in settings.items() if name not in ("optimizer", "scheduler")}
    module.requires_grad_(False)
    with torch.no_grad():
        deepspeed.zero.Init(module=module, config_dict_or_path=frozen)
    ds, *_ = deepspeed.initialize(model=module, config=frozen, dist_init_required=False)
    ds.eval()
    return ds


class DeepSpeedRuntime:
    """Implements the run hooks for ``deepspeed:``; claims ``sharding`` and ``checkpoint_format``."""

    def __init__(self, config: Any):
        self.config = config
        self._settings: dict[str, Any] | None = None
        self._hf_deepspeed_config: Any = None
        self._compile: zero.LegacyCompile | None = None

    def settings(self, run: Any) -> dict[str, Any]:
        """The JSON with every "auto" filled for this run (the same on every rank), checked against the config."""
        if self._settings is None:
            source = read(self.config.deepspeed)
            needs_hidden = any(links.get(source.settings, path) == links.AUTO for path in HIDDEN_LINKS)
            facts = links.Facts(
                dp_size=run.mesh.dp_size,
                hidden_size=hidden_size(self.config) if needs_hidden else None,
                bf16=run.compute_dtype == torch.bfloat16,
                total_steps=self.config.max_steps,
            )
            report = Report(self.config.source)
            checked = attrs.evolve(facts, bf16=None)  # bf16 against the config was checked before the ranks
            for path, message in links.check(source.settings, self.config, checked, source.origin):
                report.error(f"deepspeed.{path}", message)
            if report.errors:
                raise ConfigError(report)
            self._settings = links.fill(zero.for_deepspeed(source.settings), self.config, facts)
            self._compile = zero.legacy_compile(source.settings)
        return self._settings

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> None:
        """Under ZeRO-3, keep transformers' DeepSpeed config alive so the model is built inside ``zero.Init``.

        Each rank then materialises only its partition of the weights, so a model larger than one rank's
        memory loads. Contributes no keyword argument.
        """
        join_process_group(run)  # before zero.Init, which reads the world size from DeepSpeed's comm
        settings = self.settings(run)
        if zero.stage(settings) == 3:
            from transformers.integrations import HfDeepSpeedConfig

            self._hf_deepspeed_config = HfDeepSpeedConfig(settings)  # transformers holds only a weak reference
        return None

    def _cpu_adam(self, params: Any) -> Any:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        c = self.config
        betas = (c.adam_beta1, c.adam_beta2)
        return DeepSpeedCPUAdam(params, lr=c.learning_rate, betas=betas, eps=c.adam_epsilon, adamw_mode=True)

    def _optimizer(self, run: Any, settings: dict[str, Any], build_optimizer: Any) -> Any:
        """The optimizer factory for DeepSpeed: None when the JSON names one; DeepSpeed's CPU Adam when offloaded."""
        if "optimizer" in settings:
            return None
        owner = run.plan.plugins.role_owners()["optimizer"]
        if zero.offloads_optimizer(settings) and zero.forces_ds_cpu_optimizer(settings) and owner.default:
            return self._cpu_adam
        return build_optimizer

    @hookimpl
    def ktrain_shard(self, model: Any, run: Any, build_optimizer: Any, build_lr_scheduler: Any) -> DeepSpeedEngine:
        """``deepspeed.initialize`` with ktrain's optimizer and scheduler (unless the JSON names its own)."""
        settings = self.settings(run)
        if zero.stage(settings) == 3 and run.is_main:
            print(f"deepspeed: {describe_zero3_load(model)}", flush=True)
        optimizer = self._optimizer(run, settings, build_optimizer)
        build_ops.announce(run, optimizer_ops(settings, optimizer == self._cpu_adam))
        ds, *_ = deepspeed.initialize(
            model=model,
            model_parameters=param_groups(model, self.config.weight_decay),
            optimizer=optimizer,
            lr_scheduler=None if "scheduler" in settings else build_lr_scheduler,
            config=settings,
            dist_init_required=False,
        )
        if self._compile is not None and self._compile.enabled:
            if run.is_main:
                print(f"deepspeed: torch.compile(backend={self._compile.backend!r}) from the JSON's compile section")
            ds.compile(backend=self._compile.backend, compile_kwargs=self._compile.kwargs)
        return DeepSpeedEngine(ds, stage=zero.stage(settings), gather_16bit=zero.gathers_16bit(settings))

    @hookimpl
    def ktrain_shard_frozen(self, module: Any, run: Any) -> Any:
        """ZeRO-3: a frozen module partitioned as the policy is, in an engine without optimizer (forward only); the
        other stages keep it whole on every rank (None)."""
        settings = self.settings(run)
        if zero.stage(settings) != 3:
            return None
        return zero3_frozen(module, settings)

    @hookimpl
    def ktrain_save_checkpoint(self, engine: Any, run: Any, path: Path) -> dict[str, Any]:
        """DeepSpeed's checkpoint of every rank's partition (see ``ktrain_deepspeed.checkpoint``)."""
        return checkpoint.save(engine, path)

    @hookimpl
    def ktrain_load_checkpoint(self, engine: Any, run: Any, path: Path, manifest: dict[str, Any]) -> bool:
        """Resume from a DeepSpeed checkpoint of the same number of ranks and ZeRO stage."""
        return checkpoint.load(engine, run, path, manifest)

"""Which Liger ops an architecture has, and patching exactly the requested ones into a loaded model.

liger-kernel has one ``apply_liger_kernel_to_<arch>`` function per architecture; its boolean
parameters name the ops it can patch, and most default to True. Every parameter is therefore passed
explicitly: the requested ops True, all others False, so that nothing is patched that was not asked for.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers
from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

# parameter of an apply_liger_kernel_to_* function -> the ktrain op it patches
PARAM_OPS = {
    "rope": "rope",
    "rms_norm": "rms_norm",
    "swiglu": "swiglu",
    "geglu": "swiglu",
    "layer_norm": "layer_norm",
    "cross_entropy": "cross_entropy",
    "fused_linear_cross_entropy": "fused_linear_cross_entropy",
}
MODULE_OPS = {"rms_norm", "swiglu", "layer_norm"}


def model_type(config: Any) -> str:
    """The ``model_type`` of the run's base model, from its config alone (no weights are read)."""
    source = config.base_model_config or config.base_model
    return transformers.AutoConfig.from_pretrained(source, trust_remote_code=config.trust_remote_code).model_type


def supported_ops(kind: str) -> set[str] | None:
    """The ops liger-kernel patches for ``model_type`` ``kind``; None for an architecture it does not know."""
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(kind)
    if apply is None:
        return None
    return {PARAM_OPS[name] for name in inspect.signature(apply).parameters if name in PARAM_OPS}


def unsupported(kind: str, requested: dict[str, str]) -> dict[str, str]:
    """key -> why, for every requested key that liger-kernel cannot patch into a ``kind`` model."""
    ops = supported_ops(kind)
    if ops is None:
        known = ", ".join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))
        return {
            name: f"liger-kernel has no kernels for model_type '{kind}' (it has: {known}); remove the liger_* keys"
            for name in requested
        }
    have = ", ".join(sorted(ops))
    return {
        name: f"liger-kernel has no {op} kernel for model_type '{kind}' (it has: {have}); remove {name}"
        for name, op in requested.items()
        if op not in ops
    }


def patch(model: torch.nn.Module, ops: set[str]) -> dict[str, str]:
    """Patch ``ops`` into ``model`` (in place, and into its architecture's module); return op -> what changed."""
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN[model.config.model_type]
    flags = {
        name: PARAM_OPS.get(name) in ops
        for name, param in inspect.signature(apply).parameters.items()
        if isinstance(param.default, bool)
    }
    before = {name: module._get_name() for name, module in model.named_modules()}
    apply(model=model, **flags)
    replaced: dict[str, int] = {}
    for name, module in model.named_modules():
        if module._get_name() != before.get(name):
            replaced[module._get_name()] = replaced.get(module._get_name(), 0) + 1
    done = {}
    for param, op in PARAM_OPS.items():
        if flags.get(param):
            modules = [f"{count} {cls}" for cls, count in replaced.items() if op in MODULE_OPS and _op_of(cls) == op]
            done[op] = ", ".join(modules) if op in MODULE_OPS else "function"
    return done


def _op_of(class_name: str) -> str | None:
    lowered = class_name.lower()
    if "rmsnorm" in lowered:
        return "rms_norm"
    if "layernorm" in lowered:
        return "layer_norm"
    if "glu" in lowered or "mlp" in lowered:
        return "swiglu"
    return None

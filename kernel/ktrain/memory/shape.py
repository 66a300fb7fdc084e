"""A decoder's shape read from its ``config.json``, and the parameter tensors that shape gives, without torch.

Llama-family decoders (Llama, Mistral, Qwen2, Qwen3 and their kin) are described by a handful of numbers:
hidden and intermediate sizes, layers, attention and key/value heads, head size, vocabulary, tied
embeddings, biases, and Qwen3's per-head query/key norms. ``ModelShape.tensors()`` lists every parameter
tensor that ``transformers`` builds for such a config, by name and shape, so that a count of bytes made
from it is exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})
QKV_BIAS_TYPES = frozenset({"qwen2"})


class ShapeError(ValueError):
    """The model's config.json cannot be read into a shape; the message says what to do."""


@attrs.frozen
class Tensor:
    """One parameter tensor: its name (as ``transformers`` names it), shape, and what it is.

    ``kind`` is ``"linear"`` (a projection in a block), ``"embedding"``, ``"lm_head"`` or ``"vector"`` (a norm's
    weight or a bias); ``block`` is the index of the transformer block holding it, None outside the blocks.
    """

    name: str
    shape: tuple[int, ...]
    kind: str
    block: int | None = None

    @property
    def numel(self) -> int:
        """Elements of the tensor."""
        out = 1
        for size in self.shape:
            out *= size
        return out


@attrs.frozen
class ModelShape:
    """The numbers of a decoder's config.json that its memory depends on."""

    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, data: dict[str, Any]) -> ModelShape:
        """The shape of a ``config.json`` mapping; raises ``ShapeError`` naming a missing number."""
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if not isinstance(data.get(k), int)]  # fmt: skip
        if missing:
            raise ShapeError(
                f"config.json has no {', '.join(missing)}: only decoder configs of the Llama family are modelled"
            )
        heads = data["num_attention_heads"]
        model_type = str(data.get("model_type", "llama"))
        return cls(
            model_type=model_type,
            vocab=data["vocab_size"],
            hidden=data["hidden_size"],
            intermediate=data["intermediate_size"],
            layers=data["num_hidden_layers"],
            heads=heads,
            kv_heads=data.get("num_key_value_heads") or heads,
            head_dim=data.get("head_dim") or data["hidden_size"] // heads,
            tied=bool(data.get("tie_word_embeddings", False)),
            attention_bias=bool(data.get("attention_bias", model_type in QKV_BIAS_TYPES)),
            mlp_bias=bool(data.get("mlp_bias", False)),
            qk_norm=model_type in QK_NORM_TYPES,
        )

    def tensors(self) -> list[Tensor]:
        """Every parameter tensor of the model, in the order ``transformers`` registers them."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = [Tensor("model.embed_tokens.weight", (self.vocab, h), "embedding")]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            attention = [("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h)]
            for name, rows, cols in attention:
                out.append(Tensor(f"{p}self_attn.{name}.weight", (rows, cols), "linear", i))
                if self.attention_bias:
                    out.append(Tensor(f"{p}self_attn.{name}.bias", (rows,), "vector", i))
            out.append(Tensor(f"{p}self_attn.o_proj.weight", (h, q), "linear", i))
            if self.attention_bias and self.model_type not in QKV_BIAS_TYPES:
                out.append(Tensor(f"{p}self_attn.o_proj.bias", (h,), "vector", i))
            if self.qk_norm:
                out.append(Tensor(f"{p}self_attn.q_norm.weight", (self.head_dim,), "vector", i))
                out.append(Tensor(f"{p}self_attn.k_norm.weight", (self.head_dim,), "vector", i))
            mlp = [("gate_proj", self.intermediate, h), ("up_proj", self.intermediate, h),
                   ("down_proj", h, self.intermediate)]  # fmt: skip
            for name, rows, cols in mlp:
                out.append(Tensor(f"{p}mlp.{name}.weight", (rows, cols), "linear", i))
                if self.mlp_bias:
                    out.append(Tensor(f"{p}mlp.{name}.bias", (rows,), "vector", i))
            out.append(Tensor(f"{p}input_layernorm.weight", (h,), "vector", i))
            out.append(Tensor(f"{p}post_attention_layernorm.weight", (h,), "vector", i))
        out.append(Tensor("model.norm.weight", (h,), "vector"))
        if not self.tied:
            out.append(Tensor("lm_head.weight", (self.vocab, h), "lm_head"))
        return out

    @property
    def parameters(self) -> int:
        """Parameters of the model (tied embeddings counted once)."""
        return sum(t.numel for t in self.tensors())


def config_json(config: Any) -> Path:
    """The config.json of the run's model: ``base_model_config`` or ``base_model``, a local folder.

    Raises ``ShapeError`` naming the key when it is not a local folder holding one.
    """
    key = "base_model_config" if config.base_model_config else "base_model"
    where = getattr(config, key)
    if not where:
        raise ShapeError("base_model: not set; the memory model reads the model's config.json")
    path = Path(where).expanduser() / "config.json"
    if not path.is_file():
        raise ShapeError(
            f"{key}: {where} is not a local folder with a config.json; download the model's config.json into a "
            f"folder and set base_model_config to it"
        )
    return path


def read_shape(config: Any) -> ModelShape:
    """The shape of the run's model, from its local config.json; raises ``ShapeError`` with what to do."""
    path = config_json(config)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ShapeError(f"{path}: cannot be read as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ShapeError(f"{path}: holds no JSON object")
    return ModelShape.from_config(data)

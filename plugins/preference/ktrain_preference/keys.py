"""The config keys of ktrain-plugin-preference (Axolotl's names) and the methods ``rl`` takes: no torch here."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key

# rl -> what the loss is (the name of the same loss in TRL's DPOTrainer, loss_type).
METHODS = {"dpo": "sigmoid", "ipo": "ipo"}
# Methods of Axolotl's rl that sample answers from the policy while training.
GENERATION_METHODS = ("grpo", "gdpo", "ebft", "online_dpo", "rloo", "ppo")
DEFAULT_BETA = 0.1
PAIR_FORMAT = "chat_template.default"


@attrs.define(kw_only=True)
class PreferenceKeys:
    """Preference tuning: the method, its strength, and its reference model."""

    rl: str | None = key(
        None, "preference tuning method: dpo or ipo (pairs of chosen and rejected answers to one prompt)"
    )
    rl_beta: float | None = key(
        None, f"beta: how far the policy may move from the reference (default {DEFAULT_BETA}; IPO: its tau)"
    )
    dpo_label_smoothing: float = key(
        0.0, "DPO: the share of pairs assumed mislabelled (conservative DPO); 0 is plain DPO"
    )

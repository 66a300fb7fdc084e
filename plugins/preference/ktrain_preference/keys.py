"""The config keys of ktrain-plugin-preference (Axolotl's names) and the methods ``rl`` takes: no torch here."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key

# rl -> the loss: as TRL's DPOTrainer's loss_type (dpo, ipo; against a reference), ORPOTrainer (orpo), CPOTrainer's
# loss_type simpo (simpo), KTOTrainer (kto: unpaired rows, against a reference); orpo and simpo need no reference model.
METHODS = {"dpo": "sigmoid", "ipo": "ipo", "orpo": "orpo", "simpo": "simpo", "kto": "kto"}
REFERENCE_FREE = ("orpo", "simpo")
# Methods of Axolotl's rl that sample answers from the policy while training.
GENERATION_METHODS = ("grpo", "gdpo", "ebft", "online_dpo", "rloo", "ppo")
DEFAULT_BETA = 0.1
PAIR_FORMAT = "chat_template.default"


@attrs.define(kw_only=True)
class PreferenceKeys:
    """Preference tuning: the method, its strength, and its reference model."""

    rl: str | None = key(
        None,
        "preference tuning method: dpo, ipo, orpo or simpo (pairs of chosen and rejected answers to one prompt), "
        "or kto (single answers labelled desirable or not)",
    )
    rl_beta: float | None = key(
        None, f"beta: how far the policy may move from the reference (default {DEFAULT_BETA}; IPO: its tau)"
    )
    dpo_label_smoothing: float = key(
        0.0, "DPO, SimPO: the share of pairs assumed mislabelled (conservative DPO); 0 is plain DPO"
    )
    orpo_alpha: float | None = key(None, "ORPO: weight of the odds-ratio term beside the chosen NLL (default 0.1)")
    simpo_gamma: float = key(0.5, "SimPO: the target reward margin")
    cpo_alpha: float = key(1.0, "SimPO: weight of the chosen answers' NLL beside the preference loss (0: none)")
    kto_desirable_weight: float = key(1.0, "KTO: weight of the losses of the desirable answers (label: true)")
    kto_undesirable_weight: float = key(1.0, "KTO: weight of the losses of the undesirable answers (label: false)")
    precompute_ref_log_probs: bool = key(
        False,
        "DPO, IPO: compute the reference's log-probabilities of every pair once before training (kept beside the "
        "preprocessing cache); training then holds no reference model and runs no reference forward",
    )

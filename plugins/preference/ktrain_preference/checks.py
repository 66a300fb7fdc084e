"""The checks of a preference config: the method, the datasets' type, and what pairs cannot be trained with."""

from __future__ import annotations

from typing import Any

from ktrain_preference.axolotl_types import kto_type_names, type_names
from ktrain_preference.keys import GENERATION_METHODS, METHODS, PAIR_FORMAT, REFERENCE_FREE

# Keys of plugins that replace the model's output layer and loss with a fused one that returns no logits.
UNSHARED_LOSS_KEYS = ("fused_linear_cross_entropy", "liger_fused_linear_cross_entropy", "liger_cross_entropy")


def validate(config: Any, report: Any) -> None:
    """Refuse a method that needs generation or is unknown, packing, and datasets that are not pairs."""
    method = config.rl
    if method is None:
        for i, entry in enumerate(config.datasets or []):
            if entry.type == PAIR_FORMAT or entry.type in type_names() or entry.type in kto_type_names():
                report.error(f"datasets[{i}].type", f"{PAIR_FORMAT} holds preference rows: set rl: dpo (or kto)")
        return
    if method in GENERATION_METHODS:
        report.error("rl", f"{method} needs a generation engine; not supported yet (rl: {' or '.join(METHODS)} are)")
        return
    if method not in METHODS:
        report.error("rl", f"'{method}' is not a method of ktrain-plugin-preference; use {' or '.join(METHODS)}")
        return
    if config.rl_beta is not None and config.rl_beta <= 0:
        report.error("rl_beta", "must be above 0")
    if not 0 <= config.dpo_label_smoothing < 0.5:
        report.error("dpo_label_smoothing", "must be at least 0 and below 0.5")
    if config.dpo_label_smoothing and method not in ("dpo", "simpo"):
        report.error("dpo_label_smoothing", "applies to rl: dpo and rl: simpo only; leave it out")
    if config.orpo_alpha is not None and method != "orpo":
        report.error("orpo_alpha", "applies to rl: orpo only; leave it out")
    for name in ("kto_desirable_weight", "kto_undesirable_weight"):
        if config.is_set(name) and method != "kto":
            report.error(name, "applies to rl: kto only; leave it out")
        elif getattr(config, name) <= 0:
            report.error(name, "must be above 0")
    if config.precompute_ref_log_probs and method not in ("dpo", "ipo"):
        why = "needs no reference" if method in REFERENCE_FREE else "pairs each prompt with other rows' answers"
        report.error("precompute_ref_log_probs", f"applies to rl: dpo and rl: ipo (rl: {method} {why}); leave it out")
    if method == "kto" and config.micro_batch_size < 2:
        report.error(
            "micro_batch_size",
            "rl: kto estimates its KL term from the other rows of a micro-batch: set micro_batch_size to 2 or more",
        )
    if config.sample_packing:
        report.error("sample_packing", "preference pairs are not packed; set sample_packing: false")
    for name in UNSHARED_LOSS_KEYS:  # keys of other plugins: present only when those are installed
        if getattr(config, name, None):
            report.error(name, f"rl: {method} computes its own loss from the logits; leave {name} out")
    for name in ("context_parallel_size", "sequence_parallel_degree"):
        if (getattr(config, name, None) or 1) > 1:
            report.error(name, f"rl: {method} needs each sequence whole on a rank; leave {name} at 1")
    for i, entry in enumerate(config.datasets or []):
        if method == "kto" and entry.type != PAIR_FORMAT and entry.type not in kto_type_names():
            report.error(
                f"datasets[{i}].type",
                f"rl: kto reads prompt/completion/label rows (or prompt/chosen/rejected pairs, two rows each): set "
                f"type: {PAIR_FORMAT} (or one of Axolotl's "
                "KTO types, e.g. llama3.ultra)",
            )
        elif entry.type != PAIR_FORMAT and entry.type not in type_names():
            report.error(
                f"datasets[{i}].type",
                f"rl: {method} trains on preference pairs: set type: {PAIR_FORMAT} (or one of Axolotl's "
                "chatml.* and llama3.* preference types, e.g. chatml.intel)",
            )

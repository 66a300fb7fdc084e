"""The plugin's config keys: Axolotl's ``wandb_*`` names and meanings, and ``use_wandb``."""

from __future__ import annotations

from typing import Literal

import attrs

from ktrain.config.keys import key


@attrs.define(kw_only=True)
class WandbKeys:
    """Weights & Biases: the run is tracked when ``wandb_project`` is set (or ``use_wandb: true``)."""

    use_wandb: bool | None = key(None, "track the run in W&B (default: when wandb_project is set); false: do not")
    wandb_project: str | None = key(None, "W&B project of the run; setting it turns tracking on")
    wandb_entity: str | None = key(None, "W&B team or user that owns the project (default: the logged-in user's)")
    wandb_name: str | None = key(None, "display name of the W&B run (default: wandb_run_id, else W&B's)")
    wandb_run_id: str | None = key(
        None, "id of the W&B run; a W&B run with this id is continued (default: a new id, kept in the run directory)"
    )
    wandb_mode: Literal["online", "offline", "disabled"] | None = key(
        None, "online, offline (files in the wandb folder, `wandb sync` later) or disabled (default: W&B's, WANDB_MODE)"
    )
    wandb_watch: Literal["false", "gradients", "parameters", "all"] | None = key(
        None, "wandb.watch the model: histograms of gradients, parameters or both, every logging_steps"
    )
    wandb_log_model: Literal["false", "checkpoint", "end"] | None = key(
        None, "upload the model as a W&B artifact: each checkpoint and the final model, or the final model only"
    )

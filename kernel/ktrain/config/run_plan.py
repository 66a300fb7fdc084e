"""``Plan``: everything decided before a rank starts (``ktrain.config.plan.prepare`` makes it).

A type of its own, beside the function that makes it: ``Run`` holds a plan, and the hook specifications
name ``Run``, so this module imports none of what finds and activates plugins.
"""

from __future__ import annotations

import attrs

from ktrain.config.mesh import MeshPlan
from ktrain.config.model import Config
from ktrain.config.report import Problem
from ktrain.plugins import Plugins
from ktrain.registry import Registry


@attrs.define
class Plan:
    """Everything decided before a rank starts."""

    config: Config
    plugins: Plugins
    mesh: MeshPlan
    optimizers: Registry
    schedulers: Registry
    formats: Registry
    warnings: list[Problem]

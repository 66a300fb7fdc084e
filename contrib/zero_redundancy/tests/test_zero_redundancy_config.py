"""The keys of ktrain-plugin-zero-redundancy: checked before any rank starts, listed by ``ktrain plugins``."""

from __future__ import annotations

import types

import pytest

from ktrain.config.report import ConfigError
from ktrain.plugins import PluginError
from ktrain.testing import KtrainProject

pytest_plugins = ["ktrain.testing"]
# Activation imports torch.distributed.optim, whose functional optimizers still use torch.jit.script.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def test_the_key_enables_the_plugin_with_its_roles(ktrain_project: KtrainProject) -> None:
    plan = ktrain_project.plan("zero_redundancy: true", world_size=2)
    owners = plan.plugins.role_owners()
    for role in ("sharding", "checkpoint_format"):
        assert owners[role].plugin.distribution == "ktrain-plugin-zero-redundancy"
        assert owners[role].keys == ("zero_redundancy",)
    assert plan.mesh.dims["dp_shard"] == 2  # the ranks left over go to the sharded dimension
    plain = ktrain_project.plan()
    assert plain.plugins.role_owners()["sharding"].default


def test_tensor_parallelism_beside_it_is_an_error_naming_the_key(ktrain_project: KtrainProject) -> None:
    with pytest.raises(ConfigError) as info:
        ktrain_project.plan("zero_redundancy: true\ncontext_parallel_size: 2")
    assert "context_parallel_size: zero_redundancy shards the optimizer over every rank" in str(info.value)


def test_bucket_view_alone_is_a_warning(ktrain_project: KtrainProject) -> None:
    plan = ktrain_project.plan("zero_redundancy_bucket_view: true")
    assert [str(w) for w in plan.warnings] == [
        "zero_redundancy_bucket_view: has no effect without zero_redundancy: true"
    ]


OTHER_SHARDING = """
import types

import attrs

from ktrain import hookimpl
from ktrain.config.keys import key


@attrs.define(kw_only=True)
class Keys:
    other_sharding: bool = key(False, "shard another way")


@hookimpl
def ktrain_register_config(register):
    register(Keys)


@hookimpl
def ktrain_activate(config, activate):
    if config.other_sharding:
        activate(types.SimpleNamespace(), roles=("sharding",), keys=("other_sharding",))
"""


def test_another_sharding_plugin_in_the_same_config_is_refused(ktrain_project: KtrainProject) -> None:
    other = types.ModuleType("other_sharding")
    exec(OTHER_SHARDING, other.__dict__)
    with pytest.raises(PluginError) as info:
        ktrain_project.plan("zero_redundancy: true\nother_sharding: true", plugins=[("other_sharding", other)])
    message = str(info.value)
    assert "role 'sharding'" in message and "ktrain-plugin-zero-redundancy 0.1.0" in message
    assert "'other_sharding'" in message and "enabled by: other_sharding" in message


def test_ktrain_plugins_lists_it_with_its_distribution_and_version(ktrain_project: KtrainProject) -> None:
    done = ktrain_project.ktrain("plugins")
    assert done.returncode == 0, done.stderr
    assert "zero_redundancy: ktrain-plugin-zero-redundancy 0.1.0 (ktrain_zero_redundancy.entry)" in done.stdout
    assert "roles it can claim: sharding, checkpoint_format" in done.stdout

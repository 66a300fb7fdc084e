"""The keys of ktrain-plugin-powersgd: checked before any rank starts, listed by ``ktrain plugins``."""

import pytest

from ktrain.config.report import ConfigError
from ktrain.testing import KtrainProject

pytest_plugins = ["ktrain.testing"]


def test_the_key_enables_it_beside_the_kernels_sharding(ktrain_project: KtrainProject) -> None:
    plan = ktrain_project.plan("powersgd: true", world_size=2)
    owners = plan.plugins.role_owners()
    assert owners["ddp:comm_hook"].plugin.distribution == "ktrain-plugin-powersgd"
    assert owners["ddp:comm_hook"].keys == ("powersgd",)
    assert owners["sharding"].default  # the kernel's DDP, over dp_replicate
    assert plan.mesh.dims["dp_replicate"] == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("powersgd_rank: 0", "powersgd_rank: must be 1 or more, not 0"),
        ("powersgd_start_step: 1", "powersgd_start_step: must be 2 or more, not 1: DDP settles its buckets"),
    ],
)
def test_a_value_out_of_range_names_its_key(ktrain_project: KtrainProject, line: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ktrain_project.plan(f"powersgd: true\n{line}")
    assert message in str(info.value)


def test_a_tuning_key_alone_is_a_warning(ktrain_project: KtrainProject) -> None:
    plan = ktrain_project.plan("powersgd_rank: 4")
    assert [str(w) for w in plan.warnings] == ["powersgd_rank: has no effect without powersgd: true"]


def test_ktrain_plugins_lists_it(ktrain_project: KtrainProject) -> None:
    done = ktrain_project.ktrain("plugins")
    assert done.returncode == 0, done.stderr
    assert "powersgd: ktrain-plugin-powersgd 0.1.0 (ktrain_powersgd.entry)" in done.stdout
    assert "roles it can claim: ddp:comm_hook" in done.stdout

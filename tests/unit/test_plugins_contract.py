"""The plugin contract: one owner per role, no hook that does not exist, and the kernel's defaults.

Plugins are registered in process through ``prepare(..., extra_plugins=[(name, module)])``; one test
installs two fake distributions (a module and its .dist-info with an entry point) on PYTHONPATH and runs
the real ``ktrain check`` on them.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import attrs
import pluggy
import pytest

import ktrain
from ktrain import hookimpl, hookspecs
from ktrain.cli import EXIT_BAD_INPUT, main
from ktrain.config.activation import discover
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.plugins import DEFAULT_OWNERS, OWNED_HOOKS, PluginError

BUILTIN = Path(ktrain.__file__).parent / "builtin"


def plugin(name: str, *objects: object, **hooks: object) -> types.ModuleType:
    """An entry module named ``name`` holding ``hooks`` (functions, marked as hook implementations)."""
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    for obj in objects:
        setattr(module, obj.__name__, obj)
    return module


def switch(key: str) -> type:
    """An attrs section with one boolean key, as a plugin declares its config."""
    return attrs.make_class(f"{key.title()}Keys", {key: attrs.field(default=False, metadata={"help": "on"})})


def claiming(name: str, key: str, roles: tuple[str, ...]) -> types.ModuleType:
    """A plugin with the key ``key`` that, when the key is true, activates an object claiming ``roles``."""
    section = switch(key)

    def ktrain_register_config(register):
        register(section)

    def ktrain_activate(config, activate):
        if getattr(config, key):
            activate(types.SimpleNamespace(), roles=roles, keys=(key,))

    return plugin(name, ktrain_register_config=ktrain_register_config, ktrain_activate=ktrain_activate)


@pytest.fixture
def config(tiny_config):
    """Write a good config with ``extra`` keys and return its path."""
    return tiny_config


# ---------------------------------------------------------------------------------------------------
# (a) one owner per role
# ---------------------------------------------------------------------------------------------------


def test_two_plugins_claiming_one_role_name_both_and_their_keys(config) -> None:
    plugins = [
        ("fsdp_like", claiming("fsdp_like", "shard_a", ("sharding",))),
        ("zero_like", claiming("zero_like", "shard_b", ("sharding",))),
    ]
    with pytest.raises(PluginError) as info:
        prepare(config(shard_a=True, shard_b=True), extra_plugins=plugins)
    message = str(info.value)
    assert "'sharding'" in message
    assert "'fsdp_like'" in message and "'zero_like'" in message
    assert "shard_a" in message and "shard_b" in message
    assert "(registered in process)" in message  # where the distribution and version go


def test_one_claim_is_fine_and_replaces_the_default(config) -> None:
    plugins = [
        ("fsdp_like", claiming("fsdp_like", "shard_a", ("sharding",))),
        ("zero_like", claiming("zero_like", "shard_b", ("sharding",))),
    ]
    plan = prepare(config(shard_a=True), extra_plugins=plugins)
    owner = plan.plugins.role_owners()["sharding"]
    assert (owner.plugin.name, owner.keys, owner.default) == ("fsdp_like", ("shard_a",), False)


def test_cli_prints_a_role_conflict_and_exits_2(config, monkeypatch, capsys) -> None:
    import ktrain.config.plan

    extra = [
        ("fsdp_like", claiming("fsdp_like", "shard_a", ("sharding",))),
        ("zero_like", claiming("zero_like", "shard_b", ("sharding",))),
    ]
    monkeypatch.setattr(ktrain.config.plan, "discover", lambda more=(): discover([*extra, *more]))
    code = main(["check", str(config(shard_a=True, shard_b=True))])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert err.startswith("ktrain: two plugins claim the role 'sharding'")
    assert "Traceback" not in err


FAKE_PLUGIN = """
import types

import attrs

from ktrain import hookimpl


@attrs.define(kw_only=True)
class Keys:
    {key}: bool = attrs.field(default=False, metadata={{"help": "turn on"}})


@hookimpl
def ktrain_register_config(register):
    register(Keys)


@hookimpl
def ktrain_activate(config, activate):
    if config.{key}:
        activate(types.SimpleNamespace(), roles=("sharding",), keys=("{key}",))
"""


def _install_fake(site: Path, dist: str, version: str, module: str, source: str) -> None:
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[ktrain]\n{module} = {module}\n", encoding="utf-8")


def _check_with(site: Path, config_path: Path) -> subprocess.CompletedProcess:
    path = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run(
        [sys.executable, "-m", "ktrain.cli", "check", str(config_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_installed_plugins_conflict_names_distributions_and_versions(tmp_path, config) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_fake(site, "ktrain-plugin-fake-a", "0.1", "fake_a", FAKE_PLUGIN.format(key="fake_a"))
    _install_fake(site, "ktrain-plugin-fake-b", "0.2", "fake_b", FAKE_PLUGIN.format(key="fake_b"))
    done = _check_with(site, config(fake_a=True))
    assert done.returncode == 0, done.stderr
    assert "sharding: 'fake_a' (ktrain-plugin-fake-a 0.1); enabled by fake_a" in done.stdout
    done = _check_with(site, config(fake_a=True, fake_b=True))
    assert done.returncode == EXIT_BAD_INPUT
    assert "Traceback" not in done.stderr
    for text in ("role 'sharding'", "ktrain-plugin-fake-a 0.1", "ktrain-plugin-fake-b 0.2", "fake_a", "fake_b"):
        assert text in done.stderr


def test_installed_plugin_that_fails_to_import_names_its_distribution(tmp_path, config) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_fake(site, "ktrain-plugin-broken", "1.0", "broken", "import no_such_module_anywhere\n")
    done = _check_with(site, config())
    assert done.returncode == EXIT_BAD_INPUT
    assert "Traceback" not in done.stderr
    assert "ktrain-plugin-broken 1.0 failed to load" in done.stderr
    assert "pip uninstall ktrain-plugin-broken" in done.stderr


def test_registering_one_name_twice_names_both_plugins(config) -> None:
    def ktrain_register_optimizers(register):
        register("adamw_torch", object())

    copycat = plugin("copycat", ktrain_register_optimizers=ktrain_register_optimizers)
    with pytest.raises(PluginError, match="optimizer 'adamw_torch' is registered by two plugins") as info:
        prepare(config(), extra_plugins=[("copycat", copycat)])
    assert "'kernel' (ktrain-llm " in str(info.value) and "'copycat'" in str(info.value)


def test_a_key_declared_twice_names_both_owners(config) -> None:
    section = attrs.make_class("Clash", {"micro_batch_size": attrs.field(default=1)})

    def ktrain_register_config(register):
        register(section)

    clash = plugin("clash", ktrain_register_config=ktrain_register_config)
    with pytest.raises(ConfigError, match="micro_batch_size: declared by two plugins") as info:
        prepare(config(), extra_plugins=[("clash", clash)])
    assert "'kernel'" in str(info.value) and "'clash'" in str(info.value)


def test_a_mesh_dimension_needs_an_owner(config) -> None:
    ep = plugin("ep_plugin", ktrain_collect_mesh_dims=lambda config: {"ep": 2})
    with pytest.raises(ConfigError, match="ep: no active plugin parallelizes the 'ep' dimension"):
        prepare(config(), extra_plugins=[("ep_plugin", ep)])
    owner = claiming("ep_owner", "ep_on", ("mesh:ep",))
    plan = prepare(config(ep_on=True), world_size=4, extra_plugins=[("ep_plugin", ep), ("ep_owner", owner)])
    assert plan.mesh.dims == {"dp_replicate": 2, "dp_shard": 1, "cp": 1, "tp": 1, "ep": 2}


def test_plugin_mesh_dimensions_join_the_mesh(config) -> None:
    ep = claiming("ep_plugin", "ep_on", ("mesh:ep",))
    ep.ktrain_collect_mesh_dims = hookimpl(lambda config: {"ep": 2} if config.ep_on else None)
    plan = prepare(config(ep_on=True), world_size=2, extra_plugins=[("ep_plugin", ep)])
    assert plan.mesh.dims["ep"] == 2 and plan.mesh.world_size == 2


def test_two_plugins_sizing_one_dimension_are_both_named(config) -> None:
    first = plugin("ep_first", ktrain_collect_mesh_dims=lambda config: {"ep": 2})
    second = plugin("ep_second", ktrain_collect_mesh_dims=lambda config: {"ep": 4})
    with pytest.raises(ConfigError, match="mesh: the mesh dimension 'ep' is given by two plugins") as info:
        prepare(config(), extra_plugins=[("ep_first", first), ("ep_second", second)])
    assert "'ep_first'" in str(info.value) and "'ep_second'" in str(info.value)


def test_the_dispatcher_transforms_in_order_and_names_both_plugins_of_a_clash() -> None:
    """Every transforming and collecting hook goes through ``Plugins.transform`` / ``Plugins.collect_mapping``:
    each plugin gets the previous answer (None keeps it), and a name given twice names both plugins."""
    first = plugin(
        "first",
        ktrain_wrap_model=lambda model, run: [*model, "first"],
        ktrain_collect_checkpoint_state=lambda run: {"counter": 1},
    )
    second = plugin(
        "second",
        ktrain_wrap_model=lambda model, run: None,
        ktrain_collect_checkpoint_state=lambda run: {"counter": 2},
    )
    third = plugin("third", ktrain_wrap_model=lambda model, run: [*model, "third"])
    plugins = discover([("first", first), ("second", second), ("third", third)])
    assert plugins.transform("ktrain_wrap_model", "model", [], run=None) == ["third", "first"]  # last registered first
    with pytest.raises(PluginError, match="checkpoint state 'counter' is given by two plugins") as info:
        plugins.collect("ktrain_collect_checkpoint_state", "checkpoint state", run=None)
    assert "'first' ((registered in process) -)" in str(info.value) and "'second'" in str(info.value)


def test_a_plugin_sizes_a_kernel_dimension_only_when_its_key_is_unset(config) -> None:
    """As sequence_parallel_degree sizes cp: allowed while context_parallel_size is unset, else an error."""
    sp = claiming("sp_plugin", "sp_on", ("mesh:cp",))
    sp.ktrain_collect_mesh_dims = hookimpl(lambda config: {"cp": 2} if config.sp_on else None)
    plan = prepare(config(sp_on=True), world_size=2, extra_plugins=[("sp_plugin", sp)])
    assert plan.mesh.dims["cp"] == 2 and plan.mesh.gradient_ranks == 2 and plan.mesh.copies == 1
    with pytest.raises(ConfigError, match="context_parallel_size: mesh dimension sized twice"):
        prepare(config(sp_on=True, context_parallel_size=1), extra_plugins=[("sp_plugin", sp)])


def _activating(name: str, runtime: object, roles: tuple[str, ...]) -> types.ModuleType:
    def ktrain_activate(config, activate):
        activate(runtime, roles=roles)

    return plugin(name, ktrain_activate=ktrain_activate)


def test_a_runtime_object_answering_a_role_hook_without_claiming_the_role_is_refused(config) -> None:
    class Sharder:
        @hookimpl
        def ktrain_shard(self, model, run, build_optimizer, build_lr_scheduler):
            return None

    with pytest.raises(PluginError) as info:
        prepare(config(), extra_plugins=[("sly", _activating("sly", Sharder(), ()))])
    message = str(info.value)
    assert "'sly'" in message and "(registered in process)" in message
    assert "ktrain_shard" in message and "'sharding'" in message and "Sharder" in message


def test_claiming_one_role_does_not_cover_the_hooks_of_another(config) -> None:
    class Sharder:
        @hookimpl
        def ktrain_shard(self, model, run, build_optimizer, build_lr_scheduler):
            return None

        @hookimpl
        def ktrain_save_checkpoint(self, engine, run, path):
            return None

    with pytest.raises(PluginError, match=r"'half'.*ktrain_save_checkpoint.*'checkpoint_format'"):
        prepare(config(), extra_plugins=[("half", _activating("half", Sharder(), ("sharding",)))])
    plan = prepare(
        config(), extra_plugins=[("whole", _activating("whole", Sharder(), ("sharding", "checkpoint_format")))]
    )
    assert plan.plugins.role_owners()["checkpoint_format"].plugin.name == "whole"


def test_an_entry_module_answering_a_role_hook_is_refused_at_discover() -> None:
    exporter = plugin("exporter", ktrain_export_model=lambda engine, run, path: True)
    with pytest.raises(PluginError) as info:
        discover([("exporter", exporter)])
    message = str(info.value)
    assert "'exporter'" in message and "ktrain_export_model" in message and "entry module" in message
    assert "roles=('export',)" in message


def test_every_first_result_hook_belongs_to_a_role() -> None:
    first_result = {
        n for n, spec in vars(hookspecs).items() if n.startswith("ktrain_") and spec.ktrain_spec["firstresult"]
    }
    assert set(OWNED_HOOKS) == first_result
    for name, role in OWNED_HOOKS.items():
        assert f"``{role}``" in textwrap.dedent(getattr(hookspecs, name).__doc__), name


# ---------------------------------------------------------------------------------------------------
# (b) hooks that do not exist
# ---------------------------------------------------------------------------------------------------


def test_misspelled_hook_in_an_entry_module_fails_at_discover() -> None:
    def ktrain_wrap_modle(model, run):
        return None

    with pytest.raises(PluginError) as info:
        discover([("typo", plugin("typo", ktrain_wrap_modle=ktrain_wrap_modle))])
    message = str(info.value)
    assert "'typo'" in message and "'ktrain_wrap_modle'" in message
    assert "did you mean 'ktrain_wrap_model'" in message


def test_misspelled_hook_in_a_runtime_object_fails_at_activation(config) -> None:
    class Runtime:
        @hookimpl
        def ktrain_on_step_ends(self, run, step, metrics):
            return None

    def ktrain_activate(config, activate):
        activate(Runtime(), roles=("op:fake",))

    with pytest.raises(PluginError, match=r"'late_typo'.*'ktrain_on_step_ends'.*did you mean 'ktrain_on_step_end'"):
        prepare(config(), extra_plugins=[("late_typo", plugin("late_typo", ktrain_activate=ktrain_activate))])


def test_hook_asking_for_an_argument_that_does_not_exist_fails_at_discover() -> None:
    def ktrain_wrap_model(model, run, optimizer):
        return None

    with pytest.raises(PluginError, match=r"(?s)'extra_arg'.*ktrain_wrap_model.*'optimizer'"):
        discover([("extra_arg", plugin("extra_arg", ktrain_wrap_model=ktrain_wrap_model))])


def test_runtime_object_with_a_bad_signature_fails_at_activation(config) -> None:
    class Runtime:
        @hookimpl
        def ktrain_on_step_end(self, run, step, metrics, loss):
            return None

    def ktrain_activate(config, activate):
        activate(Runtime())

    with pytest.raises(PluginError, match=r"(?s)'bad_sig'.*ktrain_on_step_end.*'loss'"):
        prepare(config(), extra_plugins=[("bad_sig", plugin("bad_sig", ktrain_activate=ktrain_activate))])


def test_cli_prints_a_misspelled_hook_and_exits_2(config, monkeypatch, capsys) -> None:
    import ktrain.config.plan

    typo = plugin("typo", ktrain_wrap_modle=lambda model, run: None)
    monkeypatch.setattr(ktrain.config.plan, "discover", lambda more=(): discover([("typo", typo), *more]))
    code = main(["check", str(config())])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert "ktrain_wrap_modle" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------------
# (c) the kernel's own hook implementations
# ---------------------------------------------------------------------------------------------------


def _builtin_modules() -> list[str]:
    return sorted(f"ktrain.builtin.{p.stem}" for p in BUILTIN.glob("*.py") if p.stem != "__init__")


def _implementers(module: types.ModuleType) -> list[object]:
    """The module itself and every class defined in it that carries hook implementations."""
    found: list[object] = [module]
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == module.__name__ and any(hasattr(v, "ktrain_impl") for v in vars(cls).values()):
            found.append(cls)
    return found


def test_discover_checks_the_kernel_entry_module() -> None:
    plugins = discover()
    assert plugins.infos[0].name == "kernel"
    plugins.pm.check_pending()


@pytest.mark.parametrize("name", _builtin_modules())
def test_builtin_hook_implementations_match_their_specs(name: str) -> None:
    for obj in _implementers(importlib.import_module(name)):
        pm = pluggy.PluginManager(ktrain.PROJECT)
        pm.add_hookspecs(hookspecs)
        pm.register(obj)  # validates every implementation's arguments against its spec
        pm.check_pending()  # and that every hook it implements exists


def test_default_owners_register_and_pass_the_check(config) -> None:
    plan = prepare(config(), with_defaults=True)
    plan.plugins.pm.check_pending()
    owners = plan.plugins.role_owners()
    assert set(DEFAULT_OWNERS) <= set(owners)
    for role, target in DEFAULT_OWNERS.items():
        module_name, attr = target.split(":")
        assert type(owners[role].obj) is getattr(importlib.import_module(module_name), attr)


# ---------------------------------------------------------------------------------------------------
# (d) the kernel's defaults own what nobody claimed
# ---------------------------------------------------------------------------------------------------


def test_unclaimed_roles_are_listed_with_the_default_owner(config) -> None:
    plan = prepare(config(), with_defaults=False)
    owners = plan.plugins.role_owners()
    assert {role: act.obj for role, act in owners.items()} == DEFAULT_OWNERS
    assert all(act.default and act.plugin.name == "kernel" for act in owners.values())


def test_a_claimed_role_leaves_the_others_to_the_defaults(config) -> None:
    plugins = [("fsdp_like", claiming("fsdp_like", "shard_a", ("sharding", "checkpoint_format")))]
    plan = prepare(config(shard_a=True), with_defaults=False, extra_plugins=plugins)
    owners = plan.plugins.role_owners()
    claimed = {"sharding", "checkpoint_format"}
    assert {role for role, act in owners.items() if not act.default} == claimed
    assert {role: act.obj for role, act in owners.items() if act.default} == {
        role: target for role, target in DEFAULT_OWNERS.items() if role not in claimed
    }


def test_check_lists_the_owner_of_every_role(config, capsys) -> None:
    assert main(["check", str(config())]) == 0
    out = capsys.readouterr().out
    for role, target in DEFAULT_OWNERS.items():
        assert f"  {role}: kernel default {target}" in out


def test_hookspec_docstrings_name_the_role_of_every_firstresult_hook() -> None:
    roles = {"model_loader", "sharding", "optimizer", "lr_scheduler", "checkpoint_format", "export", "objective"}
    for name, spec in vars(hookspecs).items():
        if name.startswith("ktrain_") and spec.ktrain_spec["firstresult"]:
            doc = textwrap.dedent(spec.__doc__ or "")
            assert any(f"``{role}``" in doc for role in roles), name


# ---------------------------------------------------------------------------------------------------
# (e) what a run offers plugins: the default DDP's options, process groups, a line to the user
# ---------------------------------------------------------------------------------------------------


def giving_ddp_options(name: str, key: str, options: dict[str, object]) -> types.ModuleType:
    """A plugin with the key ``key`` whose runtime object answers ``ktrain_collect_ddp_options`` with ``options``."""
    section = switch(key)

    class Options:
        @hookimpl
        def ktrain_collect_ddp_options(self, run):
            return options

    def ktrain_register_config(register):
        register(section)

    def ktrain_activate(config, activate):
        if getattr(config, key):
            activate(Options(), keys=(key,))

    return plugin(name, ktrain_register_config=ktrain_register_config, ktrain_activate=ktrain_activate)


def one_rank(plan, tmp_path: Path, rank: int = 0):
    import torch

    from ktrain.run.context import Run

    device = torch.device("cpu")
    return Run(plan, tmp_path, rank, rank, 1, device, None, torch.float32)


def test_ddp_options_merge_and_a_clash_names_both_plugins(config, tmp_path) -> None:
    from ktrain.builtin.data_parallel import ddp_options

    hook = object()
    plugins = [
        ("buckets", giving_ddp_options("buckets", "big_buckets", {"bucket_cap_mb": 100})),
        ("compress", giving_ddp_options("compress", "compress", {"comm_hook": hook, "static_graph": True})),
        ("also_buckets", giving_ddp_options("also_buckets", "more_buckets", {"bucket_cap_mb": 50})),
    ]
    plan = prepare(config(big_buckets=True, compress=True), extra_plugins=plugins)
    assert ddp_options(one_rank(plan, tmp_path)) == {"bucket_cap_mb": 100, "comm_hook": hook, "static_graph": True}
    plan = prepare(config(big_buckets=True, more_buckets=True), extra_plugins=plugins)
    with pytest.raises(PluginError) as info:
        ddp_options(one_rank(plan, tmp_path))
    assert "the DDP option 'bucket_cap_mb' is given by two plugins: 'buckets'" in str(info.value)
    assert "'also_buckets' ((registered in process) -)" in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"process_group": None}, "gives the DDP option 'process_group', which ktrain_collect_ddp_options does not"),
        ({"bucket_size": 25}, "gives the DDP option 'bucket_size'"),
        ({"comm_state": object()}, "gives a DDP comm_state without its comm_hook"),
    ],
)
def test_a_ddp_option_ddp_does_not_take_names_the_plugin(config, tmp_path, options, message) -> None:
    from ktrain.builtin.data_parallel import ddp_options

    plugins = [("odd", giving_ddp_options("odd", "odd", options))]
    plan = prepare(config(odd=True), extra_plugins=plugins)
    with pytest.raises(PluginError) as info:
        ddp_options(one_rank(plan, tmp_path))
    assert str(info.value).startswith("plugin 'odd' ((registered in process) -)") and message in str(info.value)


def test_process_groups_by_mesh_dimension(config, tmp_path) -> None:
    run = one_rank(prepare(config()), tmp_path)
    assert run.process_group("dp_replicate", "cp") is None and run.gradient_group is None  # one process
    with pytest.raises(ValueError, match=r"no mesh dimension \['ep'\]; the mesh has dp_replicate, dp_shard, cp, tp"):
        run.process_group("ep")


def test_say_prints_one_line_on_rank_0_only(config, tmp_path, capsys) -> None:
    plan = prepare(config())
    one_rank(plan, tmp_path, rank=1).say("not shown")
    one_rank(plan, tmp_path).say("compression\nstarts at step 3")
    assert capsys.readouterr().out == "ktrain: compression starts at step 3\n"


def test_checkpoint_state_holds_what_weights_only_loading_reads(tmp_path) -> None:
    """What docs/hooks.md says a ``ktrain_collect_checkpoint_state`` object may save, and what it may not."""
    import numpy as np
    import torch

    state = {"n": 3, "x": 0.5, "s": "a", "b": True, "none": None, "l": [1, (2, "3")], "d": {4: torch.ones(2)}}
    torch.save(state, tmp_path / "rank-0.pt")
    loaded = torch.load(tmp_path / "rank-0.pt", weights_only=True)
    assert loaded.keys() == state.keys() and loaded["l"] == [1, (2, "3")] and torch.equal(loaded["d"][4], torch.ones(2))
    torch.save({"rng": np.zeros(3)}, tmp_path / "rank-1.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "rank-1.pt", weights_only=True)

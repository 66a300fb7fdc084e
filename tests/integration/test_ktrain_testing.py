"""``ktrain.testing``, the pytest plugin for plugin authors: opt-in only, its fixtures, and its conformance suite.

The suite passes the kernel's own sharding (one process, DDP) and fails a sharding plugin, written here,
that forgets to average gradients over the ranks.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from ktrain.config.report import ConfigError
from ktrain.testing import HookRecorder, KtrainProject, ShardingConformance
from ktrain.testing.conformance import RunCache, ShardingRuns

pytest_plugins = ["ktrain.testing"]


def test_it_is_opt_in(tmp_path: Path) -> None:
    """No pytest11 entry point: an unrelated pytest run has none of its fixtures; ``-p ktrain.testing`` adds them."""
    pytest11 = [ep.value for ep in importlib.metadata.entry_points(group="pytest11")]
    assert not any(value.startswith("ktrain") for value in pytest11), pytest11
    (tmp_path / "test_unrelated.py").write_text("def test_nothing():\n    pass\n")

    def fixtures(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider", *args, str(tmp_path)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "ktrain_project" not in fixtures()
    assert "ktrain_project" in fixtures("-p", "ktrain.testing")


def test_the_tiny_model_folder_loads_and_chats(ktrain_model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(ktrain_model_dir)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False)
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text and len(ids) == len("user\nWhat is 2+2?\n") + 2
    config = transformers.AutoConfig.from_pretrained(ktrain_model_dir)
    assert config.vocab_size == len(tokenizer) and config.num_hidden_layers == 2


def test_a_plan_from_a_yaml_string(ktrain_project: KtrainProject) -> None:
    plan = ktrain_project.plan("micro_batch_size: 2\nlr_scheduler: linear\n", world_size=2)
    assert (plan.config.micro_batch_size, plan.config.lr_scheduler, plan.mesh.dims["dp_replicate"]) == (2, "linear", 2)
    with pytest.raises(ConfigError, match="micro_batch_sise: unknown key; did you mean 'micro_batch_size'"):
        ktrain_project.plan("micro_batch_sise: 2")


def test_the_recorder_sees_every_rank_call_the_hooks_in_order(
    ktrain_project: KtrainProject, ktrain_recorder: HookRecorder
) -> None:
    config = ktrain_project.config("max_steps: 2\nsave_steps: 1\nval_set_size: 8\neval_steps: 2\n")
    ktrain_project.train(config, nproc=2)
    setup = [
        "ktrain_collect_model_kwargs",
        "ktrain_wrap_model",
        "ktrain_parallelize",
        "ktrain_wrap_train_step",
        "ktrain_on_train_start",
    ]
    step = ["ktrain_collect_metrics", "ktrain_on_step_end"]
    saved = ["ktrain_collect_checkpoint_state", "ktrain_on_checkpoint_saved"]
    for rank in (0, 1):
        assert ktrain_recorder.names(rank) == [
            *setup,
            *step,
            *saved,
            *step,
            "ktrain_on_eval_end",
            *saved,
            "ktrain_on_train_end",
        ]
        (start,) = ktrain_recorder.calls("ktrain_on_train_start", rank)
        assert start["module"] == "torch.nn.parallel.distributed.DistributedDataParallel" and start["owns"] == []
    ends = ktrain_recorder.calls("ktrain_on_step_end")
    assert [(c["step"], "loss" in c["metrics"]) for c in ends] == [(1, True), (2, True)]
    assert [c["path"] for c in ktrain_recorder.calls("ktrain_on_checkpoint_saved")] == [
        "step-00000001",
        "step-00000002",
    ]


class TestKernelDefaultConformance(ShardingConformance):
    """The kernel's own sharding (one process, DDP over 2 ranks) passes the suite it asks of plugins."""


BROKEN_SHARDING = '''
"""A sharding plugin that never averages gradients: each rank steps on its own micro-batch's gradient."""

import attrs

from ktrain import hookimpl
from ktrain.config.keys import key

KTRAIN_ROLES = ("sharding",)


@attrs.define(kw_only=True)
class Keys:
    broken_sharding: bool = key(False, "shard without averaging gradients")


class Broken:
    @hookimpl
    def ktrain_shard(self, model, run, build_optimizer, build_lr_scheduler):
        from ktrain.engine import Engine, param_groups

        optimizer = build_optimizer(param_groups(model, run.config.weight_decay))
        return Engine(model, model, optimizer, build_lr_scheduler(optimizer), run.config.max_grad_norm)


@hookimpl
def ktrain_register_config(register):
    register(Keys)


@hookimpl
def ktrain_activate(config, activate):
    if config.broken_sharding:
        activate(Broken(), roles=KTRAIN_ROLES, keys=("broken_sharding",))
'''


def test_the_suite_fails_a_plugin_that_forgets_to_average_gradients(ktrain_run_cache: RunCache) -> None:
    ktrain_run_cache.project({}).install_plugin("broken_sharding", BROKEN_SHARDING)

    class TestBroken(ShardingConformance):
        plugin_yaml = "broken_sharding: true"
        entry_point = "broken_sharding"

    runs = ShardingRuns(TestBroken, ktrain_run_cache)
    with pytest.raises(AssertionError, match=r"2 ranks: the loss of step 2 is .* \(relative difference .* > 1e-05\)"):
        TestBroken().test_loss_parity_with_one_process(runs)
    TestBroken().test_roles_declared(runs)  # what it declares is right: only its numbers are wrong

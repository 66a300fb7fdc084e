"""The conformance suite of a sharding plugin: subclass ``ShardingConformance`` and set ``plugin_yaml``.

Every check trains for real, through ``ktrain run`` processes on CPU ranks (gloo), and compares with
the kernel's one-process run of the same global batch (``steps`` optimizer steps of 8 rows). Which
tolerance governs which check:

- loss parity (``loss_rtol``): the plugin on 2 ranks (2 micro-batches of 2 rows each) and on 1 rank
  logs the losses of one process training on batches of 8 rows, step by step;
- gradients and weights (``loss_rtol`` for every step's gradient norm, ``weight_atol`` for the final
  weights): they agree as well;
- gradient accumulation (``loss_rtol``): 2 micro-batches of 4 rows on 1 rank give the losses and
  gradient norms of 1 batch of 8;
- save -> resume (exact, no tolerance): the 2-rank run saves at step ``steps // 2`` (its middle
  checkpoint: step 2 of the default 4) and at the end; a copy resumed from the middle checkpoint logs
  the same losses and ends with the same weights, bit for bit;
- export (exact): the final model and ``ktrain export`` of the last checkpoint load in
  ``transformers`` with the trained weights;
- roles: the plugin owns ``sharding`` in the run (or, with ``owns_sharding = False``, leaves it to the
  kernel's default) and declares every role it claims in ``KTRAIN_ROLES``; its entry module imports no
  torch.

A lossy plugin (gradient compression) declares why in ``lossy``: the 2-rank run is then held to
``lossy_rtol`` and ``lossy_weight_atol`` instead, and its gradient norms are not compared (they are the
norms of the compressed gradients); the 1-rank runs, accumulation, resume and export stay exact.

Runs are shared: the suite's runs are made once per class, the one-process reference once per test
session, and only when a selected test needs them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from ktrain.testing.assets import write_chat_dataset, write_model_dir
from ktrain.testing.project import KtrainProject, read_metrics


class RunCache:
    """Training runs made once per test session, keyed by their config, ranks and environment."""

    def __init__(self, root: Path):
        self.root = root
        self.model_dir = write_model_dir(root / "model")
        self.dataset = write_chat_dataset(root / "train.jsonl", count=96)
        self.runs: dict[str, Path] = {}

    def project(self, env: dict[str, str]) -> KtrainProject:
        project = KtrainProject(self.root, self.model_dir, self.dataset)
        project.env.update(env)
        return project

    def train(self, keys: dict[str, Any], nproc: int, env: dict[str, str]) -> Path:
        """The run directory of ``keys`` on ``nproc`` ranks, training it the first time it is asked for."""
        identity = json.dumps({"keys": keys, "nproc": nproc, "env": env}, sort_keys=True)
        if identity not in self.runs:
            project = self.project(env)
            name = f"run-{len(self.runs)}"
            self.runs[identity] = project.train(project.config(name=name, **keys), nproc=nproc)
        return self.runs[identity]


class ShardingRuns:
    """The runs one conformance class compares, made when a check first needs them."""

    def __init__(self, suite: type[ShardingConformance], cache: RunCache):
        self.suite = suite
        self.cache = cache
        self.half = suite.steps // 2
        self._resumed: Path | None = None

    def _keys(self, plugin: bool, micro: int, accumulation: int, **more: Any) -> dict[str, Any]:
        keys = {**_mapping(self.suite.base_yaml), "max_steps": self.suite.steps}
        keys.update(micro_batch_size=micro, gradient_accumulation_steps=accumulation, **more)
        return {**keys, **_mapping(self.suite.plugin_yaml)} if plugin else keys

    def one_process(self) -> Path:
        """The kernel's own run on one process: one micro-batch of 8 rows per step."""
        return self.cache.train(self._keys(False, 8, 1), 1, self.suite.env)

    def plugin_one_rank(self) -> Path:
        """The plugin on 1 rank: 2 micro-batches of 4 rows per step."""
        return self.cache.train(self._keys(True, 4, 2), 1, self.suite.env)

    def plugin_two_ranks(self) -> Path:
        """The plugin on 2 ranks: 2 micro-batches of 2 rows per rank and step; checkpoints half-way and at the end."""
        return self.cache.train(self._keys(True, 2, 2, save_steps=self.half), 2, self.suite.env)

    def resumed(self) -> Path:
        """``plugin_two_ranks`` as if killed after its middle checkpoint, then resumed with ``--resume``."""
        if self._resumed is None:
            whole = self.plugin_two_ranks()
            out = whole.parent / f"{whole.name}-resumed"
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(whole, out)
            checkpoints = sorted((out / "checkpoints").glob("step-*"))
            for later in checkpoints[1:]:
                shutil.rmtree(later)
            shutil.rmtree(out / "final")
            lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if json.loads(line)["step"] <= self.half + 1]  # one step logged after
            (out / "metrics.jsonl").write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            project = self.cache.project(self.suite.env)
            keys = self._keys(True, 2, 2, save_steps=self.half, output_dir=str(out))
            self._resumed = project.train(project.config(name=out.name, **keys), "--resume", nproc=2)
        return self._resumed


def _mapping(yaml_text: str) -> dict[str, Any]:
    keys = yaml.safe_load(yaml_text) or {}
    if not isinstance(keys, dict):
        raise TypeError(f"the suite's YAML must be a mapping of keys, not {yaml_text!r}")
    return keys


def _close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def _compare_series(name: str, got: dict[int, float], want: dict[int, float], rtol: float, what: str) -> None:
    assert got.keys() == want.keys(), f"{name}: {what} logged at steps {sorted(got)}, the reference at {sorted(want)}"
    for step in sorted(want):
        assert _close(got[step], want[step], rtol), (
            f"{name}: {what} of step {step} is {got[step]:.8g}, the reference's {want[step]:.8g} "
            f"(relative difference {abs(got[step] - want[step]) / max(abs(want[step]), 1e-30):.2e} > {rtol:g})"
        )


def _final_weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    folder = run_dir / "final"
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def _compare_weights(name: str, got: dict[str, Any], want: dict[str, Any], atol: float) -> None:
    assert got.keys() == want.keys(), f"{name}: the final model's tensors differ: {sorted(got.keys() ^ want.keys())}"
    for key in sorted(want):
        diff = float((got[key].float() - want[key].float()).abs().max())
        assert diff <= atol, f"{name}: final weight {key} differs from the reference by {diff:.3e} (> {atol:g})"


class ShardingConformance:
    """Subclass in a test module (``class TestMyPlugin(ShardingConformance)``) with ``plugin_yaml`` set.

    Needs the ``ktrain.testing`` pytest plugin (``pytest_plugins = ["ktrain.testing"]`` in the test
    module or a top-level conftest.py) and the plugin installed (``pip install -e .``), or made visible
    to the ``ktrain`` processes through ``env`` (``PYTHONPATH``). A plugin whose numbers legitimately differ more
    (other reduction orders, lower precision) widens the tolerances, and says why; one that changes the
    averaged gradient on purpose sets ``lossy``.
    """

    plugin_yaml: ClassVar[str] = ""
    """The YAML keys that enable the plugin (``"zero_redundancy: true"``); empty for the kernel's default."""
    entry_point: ClassVar[str | None] = None
    """The plugin's entry-point name in the ``ktrain`` group; None checks the kernel's default owner."""
    base_yaml: ClassVar[str] = ""
    """YAML keys of every run, the one-process reference included (e.g. a precision the plugin needs)."""
    env: ClassVar[dict[str, str]] = {}
    """Environment of the ``ktrain`` processes (e.g. ``PYTHONPATH``, ``DS_ACCELERATOR``)."""
    steps: ClassVar[int] = 4
    loss_rtol: ClassVar[float] = 1e-5
    """Relative tolerance of losses and gradient norms against the reference (fp32: sums in another order)."""
    weight_atol: ClassVar[float] = 1e-4
    """Largest absolute difference of a final weight from the one-process run's."""
    heavy_modules: ClassVar[tuple[str, ...]] = ("torch", "transformers", "deepspeed", "peft")
    """Modules the entry module must not import (``ktrain --help``, ``check`` and ``plugins`` stay light)."""
    owns_sharding: ClassVar[bool] = True
    """False for a plugin that tunes the kernel's default DDP (``ktrain_collect_ddp_options``) instead of
    claiming ``sharding``: ``test_roles_declared`` then checks that the kernel's default owns the role."""
    lossy: ClassVar[str] = ""
    """Why the plugin's multi-rank runs differ from one process on purpose (``"PowerSGD sends a rank-1
    approximation of each gradient matrix"``), or empty. Set, the 2-rank run's losses are compared with
    ``lossy_rtol``, its final weights with ``lossy_weight_atol``, its gradient norms not at all, and a
    failure quotes the reason."""
    lossy_rtol: ClassVar[float] = 0.05
    """Relative tolerance of a lossy plugin's 2-rank losses against one process's."""
    lossy_weight_atol: ClassVar[float] = 0.05
    """Largest absolute difference of a lossy plugin's 2-rank final weights from one process's."""

    @classmethod
    def two_rank_tolerances(cls) -> tuple[str, float, float]:
        """(name, loss rtol, weight atol) of the 2-rank run: the exact ones, or the lossy ones with the reason."""
        if cls.lossy:
            return f"2 ranks (lossy: {cls.lossy})", cls.lossy_rtol, cls.lossy_weight_atol
        return "2 ranks", cls.loss_rtol, cls.weight_atol

    @pytest.fixture(scope="class")
    @classmethod
    def sharding_runs(cls, ktrain_run_cache: RunCache) -> ShardingRuns:
        """The runs of this class, made lazily and shared by its tests."""
        return ShardingRuns(cls, ktrain_run_cache)

    def test_loss_parity_with_one_process(self, sharding_runs: ShardingRuns) -> None:
        """The same global batch of 8 rows on 2 ranks (2 x 2 rows each) or 1 rank gives one process's losses."""
        want = read_metrics(sharding_runs.one_process())
        name, rtol, _ = self.two_rank_tolerances()
        _compare_series(name, read_metrics(sharding_runs.plugin_two_ranks()), want, rtol, "the loss")
        _compare_series("1 rank", read_metrics(sharding_runs.plugin_one_rank()), want, self.loss_rtol, "the loss")

    def test_gradients_and_weights_agree_with_one_process(self, sharding_runs: ShardingRuns) -> None:
        """Every step's gradient norm, and the trained weights, are one process's (a lossy plugin's 2-rank
        norms are those of its compressed gradients: not compared)."""
        reference = sharding_runs.one_process()
        want, weights = read_metrics(reference, "grad_norm"), _final_weights(reference)
        name, _, atol = self.two_rank_tolerances()
        two, one = sharding_runs.plugin_two_ranks(), sharding_runs.plugin_one_rank()
        if not self.lossy:
            _compare_series(name, read_metrics(two, "grad_norm"), want, self.loss_rtol, "grad_norm")
        _compare_series("1 rank", read_metrics(one, "grad_norm"), want, self.loss_rtol, "grad_norm")
        _compare_weights(name, _final_weights(two), weights, atol)
        _compare_weights("1 rank", _final_weights(one), weights, self.weight_atol)

    def test_gradient_accumulation_equivalence(self, sharding_runs: ShardingRuns) -> None:
        """2 micro-batches of 4 rows accumulated on 1 rank give the losses and gradients of 1 batch of 8 rows.

        (The 2-rank run accumulates 2 micro-batches per rank too, so the parity checks cover accumulation
        across ranks.)
        """
        accumulated, whole = sharding_runs.plugin_one_rank(), sharding_runs.one_process()
        for key in ("loss", "grad_norm"):
            want = read_metrics(whole, key)
            _compare_series("1 rank x 2 micro-batches", read_metrics(accumulated, key), want, self.loss_rtol, key)

    def test_save_resume_exact(self, sharding_runs: ShardingRuns) -> None:
        """Resumed from its middle checkpoint, a run ends with the losses and weights of the run that went through."""
        whole, resumed = sharding_runs.plugin_two_ranks(), sharding_runs.resumed()
        assert read_metrics(resumed) == read_metrics(whole), "the resumed run logged other losses"
        _compare_weights("resumed", _final_weights(resumed), _final_weights(whole), 0.0)

    def test_export_loads_in_transformers(self, sharding_runs: ShardingRuns) -> None:
        """final/ and ``ktrain export`` of the last checkpoint load in transformers, with the trained weights."""
        import torch
        import transformers

        run = sharding_runs.plugin_two_ranks()
        done = sharding_runs.cache.project(self.env).ktrain("export", str(run), "--output", str(run / "exported"))
        assert done.returncode == 0, f"`ktrain export` failed:\n{done.stderr[-3000:]}"
        trained = _final_weights(run)
        for folder in (run / "final", run / "exported"):
            model = transformers.AutoModelForCausalLM.from_pretrained(folder)
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
            ids = torch.tensor([tokenizer("What is 2+2?")["input_ids"]])
            assert torch.isfinite(model(input_ids=ids).logits).all(), folder
            state = model.state_dict()
            for key, value in trained.items():
                assert torch.equal(state[key], value), f"{folder.name}: {key} is not the trained weight"

    def test_roles_declared(self, sharding_runs: ShardingRuns) -> None:
        """The plugin owns ``sharding`` in its runs (or leaves it to the kernel: ``owns_sharding = False``), and
        ``KTRAIN_ROLES`` lists every role it claimed."""
        plugins = json.loads((sharding_runs.plugin_two_ranks() / "run.json").read_text(encoding="utf-8"))["plugins"]
        owners = {role: p for p in plugins for role in p["roles"]}
        if self.entry_point is None or not self.owns_sharding:
            assert owners["sharding"]["default"], f"sharding is owned by {owners['sharding']}, not the kernel"
        if self.entry_point is None:
            return
        assert any(p["name"] == self.entry_point for p in plugins), f"{self.entry_point} did not activate in the run"
        if self.owns_sharding:
            assert owners["sharding"]["name"] == self.entry_point, f"sharding is owned by {owners['sharding']['name']}"
        claimed = {role for p in plugins if p["name"] == self.entry_point for role in p["roles"]}
        declared = set(_entry_module_facts(type(self), sharding_runs)["roles"])
        assert claimed <= declared, f"claimed roles {sorted(claimed - declared)} are missing from KTRAIN_ROLES"

    def test_entry_module_imports_nothing_heavy(self, sharding_runs: ShardingRuns) -> None:
        """Importing the entry module (as ``ktrain --help`` does) imports none of ``heavy_modules``."""
        if self.entry_point is None:
            pytest.skip("the kernel's default sharding has no entry module of its own")
        heavy = _entry_module_facts(type(self), sharding_runs)["heavy"]
        assert not heavy, f"the entry module imports {heavy}: import them in ktrain_activate or the runtime object"


def _entry_module_facts(suite: type[ShardingConformance], runs: ShardingRuns) -> dict[str, Any]:
    """The roles the entry module declares and the heavy modules importing it pulls in, from a fresh process."""
    script = (
        "import importlib.metadata, json, sys\n"
        f"(ep,) = [e for e in importlib.metadata.entry_points(group='ktrain') if e.name == {suite.entry_point!r}]\n"
        "module = ep.load()\n"
        f"heavy = sorted(m for m in {list(suite.heavy_modules)!r} if m in sys.modules)\n"
        "print(json.dumps({'roles': list(getattr(module, 'KTRAIN_ROLES', ())), 'heavy': heavy}))\n"
    )
    done = runs.cache.project(suite.env).python("-c", script, timeout=120)
    assert done.returncode == 0, (
        f"the entry point {suite.entry_point!r} is not installed or fails to load:\n{done.stderr}"
    )
    return json.loads(done.stdout.strip().splitlines()[-1])

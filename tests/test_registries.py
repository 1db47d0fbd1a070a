"""Advantage estimators, policy losses and generation backends are registries: a user module adds one
without editing accord."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch

from accord.algorithms import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, group_advantages, register_advantage, register_loss
from accord.algorithms.losses import LossTotals, policy_loss
from accord.config import ConfigError, config_from_dict
from accord.trainer import Trainer


def test_builtin_estimators_are_registered_and_match_the_formulas():
    assert {"mean", "rloo", "max", "raw"} <= set(ADVANTAGE_ESTIMATORS) and "clip" in POLICY_LOSSES
    r, g = torch.tensor([1.0, 2.0, 6.0, 5.0]), torch.tensor([0, 0, 0, 1])
    assert group_advantages(r, g, "mean").tolist() == [-2.0, -1.0, 3.0, 0.0]
    assert group_advantages(r, g, "max").tolist() == [-5.0, -4.0, 0.0, 0.0]
    assert group_advantages(r, g, "rloo").tolist() == pytest.approx([-3.0, -1.5, 4.5, 0.0])


def test_a_registered_estimator_is_used_and_a_bad_one_is_refused():
    @register_advantage("test_median")
    def median(returns, stats):
        out = torch.empty_like(returns)
        for gid in stats.index.unique():
            members = stats.index == gid
            out[members] = returns[members] - returns[members].median()
        return out

    r, g = torch.tensor([1.0, 2.0, 10.0, 4.0, 4.0]), torch.tensor([0, 0, 0, 1, 1])
    assert group_advantages(r, g, "test_median").tolist() == [-1.0, 0.0, 8.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("test_median")(lambda returns, stats: returns)
    register_advantage("test_scalar")(lambda returns, stats: returns.sum())
    with pytest.raises(ValueError, match="must return a tensor of shape"):
        group_advantages(r, g, "test_scalar")
    with pytest.raises(ValueError, match="register one with accord.algorithms.register_advantage"):
        group_advantages(r, g, "nope")


def test_a_registered_loss_replaces_the_surrogate():
    @register_loss("test_reinforce")
    def reinforce(x):
        per_token = -x.advantages * x.logp
        return per_token, {"pg": (per_token * x.mask).sum().detach()}

    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask, adv = torch.ones(1, 2), torch.tensor([2.0])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, LossTotals(2, 1), loss="test_reinforce")
    loss.backward()
    assert loss.item() == pytest.approx(3.0) and logp.grad.tolist() == [[-1.0, -1.0]]
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss(logp, logp.detach(), adv, mask, LossTotals(2, 1), loss="nope")


def test_unknown_names_are_config_errors_before_any_model_loads(tiny_cfg):
    for key, value, registered in (("advantage", "meen", "'mean'"), ("loss", "clipp", "'clip'")):
        with pytest.raises(ConfigError, match=f"algorithm.{key}='{value}' is not registered; did you mean {registered}"):
            Trainer(config_from_dict(tiny_cfg(algorithm={key: value, "num_generations": 4})))
    with pytest.raises(ConfigError, match="rollout.generation_backend='hff' is not registered; did you mean 'hf'"):
        Trainer(config_from_dict(tiny_cfg(rollout={"generation_backend": "hff"})))


@pytest.mark.parametrize("name, problem", [(5, "is of type int, not text"), ("", "is empty"),
                                           ("a b", "holds whitespace"), ("tab\tname", "holds whitespace"),
                                           ("pettingzoo:x", "holds a ':'"), ("my_pkg:Task", "holds a ':'")])
def test_a_task_name_that_cannot_be_named_is_refused_at_registration(name, problem):
    """A non-text name broke `accord envs` later (sorting with the other names); an empty name, one with spaces, or
    one with a ':' (an adapter's prefix or a module:attribute reference) could not be given as task.name."""
    from accord.envs.registry import TASKS, TaskError, register_task

    with pytest.raises(TaskError, match=rf"register_task\({re.escape(repr(name))}, \.\.\.\): the name {problem}; a "
                                        r"task name is non-empty text without whitespace or ':'"):
        register_task(name, "a bad name")
    assert name not in TASKS


def test_every_registered_task_name_passes_the_name_rule():
    from accord.envs.registry import TASKS, register_task

    try:
        register_task("my-task.v2_test", "a name with '-', '.' and '_'")(lambda: None)
        for name in list(TASKS):
            register_task(name + "-copy-test", "the same characters")(lambda: None)
    finally:
        for name in [n for n in TASKS if n.endswith("-copy-test") or n == "my-task.v2_test"]:
            del TASKS[name]


def test_a_policy_generates_through_the_backend_it_owns(tiny_cfg):
    """The policy calls its backend object; a registered backend is built per policy from the rollout
    config, and a LoRA group's adapters share the group's one backend."""
    from accord.build import build_policies
    from accord.generation.backends import HFBackend, register_backend

    calls = []

    @register_backend("test_recording")
    class Recording(HFBackend):
        name = "test_recording"

        def generate(self, model, tokenizer, prompts, **kw):
            calls.append((kw["name"], kw["adapter"], len(prompts)))
            return super().generate(model, tokenizer, prompts, **kw)

    with pytest.raises(ValueError, match="already registered"):
        register_backend("test_recording")(HFBackend)
    with pytest.raises(ValueError, match="must be an identifier"):
        register_backend("a b")
    cfg = config_from_dict(tiny_cfg(rollout={"generation_backend": "test_recording", "max_new_tokens": 4}))
    pol = next(iter(build_policies(cfg, {"main": 1})[0].values()))
    assert isinstance(pol.backend, Recording) and pol.backend.rollout is cfg.rollout
    prompt = pol.encode_chat([{"role": "user", "content": "hi"}])
    ours = pol.generate([prompt, prompt], greedy=True, temperature=1.0)
    assert calls == [(pol.name, None, 2)]
    plain = HFBackend(cfg.rollout).generate(pol.model, pol.tokenizer, [prompt, prompt], greedy=True, temperature=1.0,
                                            generator=None, name="x")
    assert [g.ids for g in ours] == [g.ids for g in plain] and all(g.ids for g in ours)


def _train_importing(tmp_path, module: str, data: dict) -> subprocess.CompletedProcess:
    """`accord train` of the config ``data`` importing the user's ``module`` (a file in ``tmp_path``), run there."""
    import yaml

    data["imports"] = [module]
    data["run"]["run_dir"] = str(tmp_path / "run")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    return subprocess.run([sys.executable, "-m", "accord.cli", "train", "cfg.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_user_module_registers_all_three_and_trains_through_the_cli(tiny_cfg, tmp_path):
    (tmp_path / "my_algos.py").write_text(textwrap.dedent("""
        import torch
        from accord.algorithms import register_advantage, register_loss

        CALLS = {"adv": 0, "loss": 0}

        @register_advantage("centred_rank")
        def centred_rank(returns, stats):
            CALLS["adv"] += 1
            same = stats.index[:, None] == stats.index[None, :]
            below = (same & (returns[None, :] < returns[:, None])).sum(1)
            ties = (same & (returns[None, :] == returns[:, None])).sum(1) - 1
            return below + ties / 2 - (stats.size - 1) / 2

        @register_loss("plain_pg")
        def plain_pg(x):
            CALLS["loss"] += 1
            per_token = -x.advantages * torch.exp(x.logp - x.old_logp)
            return per_token, {"pg": (per_token * x.mask).sum().detach()}

        @register_backend("hf_logged")
        class LoggedHF(HFBackend):
            def generate(self, model, tokenizer, prompts, **kw):
                with open("backend_calls.txt", "a") as f:
                    f.write(f"{kw['name']} {len(prompts)}\\n")
                return super().generate(model, tokenizer, prompts, **kw)
    """).replace("from accord.algorithms import", "from accord.generation.backends import HFBackend, register_backend\n"
                 "from accord.algorithms import"))
    out = _train_importing(tmp_path, "my_algos", tiny_cfg(algorithm={"advantage": "centred_rank", "loss": "plain_pg",
                                                                     "num_generations": 4},
                                                          rollout={"generation_backend": "hf_logged"}))
    assert out.returncode == 0, out.stderr[-2000:]
    metrics = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"step"' in line]
    assert len(metrics) >= 2 and "loss/main/pg" in metrics[-1]
    calls = (tmp_path / "backend_calls.txt").read_text().splitlines()
    assert calls and all(line.split()[0] == "main" and int(line.split()[1]) > 0 for line in calls)


@pytest.mark.slow
@pytest.mark.parametrize("kind, body, message", [
    ("advantage", "@register_advantage('bad')\ndef bad(returns, stats):\n    return returns[:1]\n",
     r"advantage estimator 'bad' returned Tensor \(1,\); it must return a tensor of shape"),
    ("loss", "@register_loss('bad')\ndef bad(x):\n    return 0.0\n",
     r"policy loss 'bad' returned float; it must return \(the per-token loss, a tensor of shape"),
])
def test_a_registered_function_returning_the_wrong_thing_is_one_line_from_the_cli(tiny_cfg, tmp_path, kind, body,
                                                                                   message):
    """accord's own check of what a user's estimator or loss returned reaches the user as one line (exit 2), as the
    check of a task's reward does, not as a traceback."""
    (tmp_path / "my_bad.py").write_text("from accord.algorithms import register_advantage, register_loss\n\n" + body)
    out = _train_importing(tmp_path, "my_bad", tiny_cfg(
        algorithm={kind: "bad", "normalize_std": False} if kind == "advantage" else {kind: "bad"}))
    assert out.returncode == 2, out.stderr[-2000:]
    assert re.search(message, out.stderr) and "Traceback" not in out.stderr, out.stderr[-2000:]

"""policies.<name>.trainable_layers: only the last N decoder blocks and the final norm train; the blocks below, the
embeddings and the output head keep their weights to the bit, and the update's gradient matches full
fine-tuning's on the parts that do train. Real tiny policies, real samples, real updates."""

from __future__ import annotations

import pytest
import torch

from accord.config import (AlgorithmConfig, ConfigError, PolicyConfig, RolloutConfig, TrainingConfig, config_from_dict,
                           load_config)
from accord.policies.model import ModelPolicy
from accord.trainer import Trainer
from accord.rollout.sample import Sample

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 3}}


def policy(trainable_layers: int | None, lr: float = 1e-3, **model_kwargs) -> ModelPolicy:
    cfg = PolicyConfig(model=TINY["model"], model_kwargs={**TINY["model_kwargs"], **model_kwargs},
                       trainable_layers=trainable_layers)
    return ModelPolicy("p", cfg, TrainingConfig(bf16=False, lr=lr),
                       AlgorithmConfig(), RolloutConfig(max_new_tokens=8, temperature=1.0),
                       total_optimizer_steps=4, seed=3)


def samples(pol: ModelPolicy) -> list[Sample]:
    prompts = [pol.encode_chat([{"role": "user", "content": f"count to {n}"}]) for n in range(4)]
    torch.manual_seed(0)
    gens = pol.generate(prompts, greedy=False, temperature=1.0)
    return [Sample(agent="a", policy=pol.name, turn=0, group=0, instance=0, prompt_ids=p,
                   completion_ids=list(g.ids), logprobs=list(g.logprobs), finish_reason=g.finish_reason,
                   advantage=a) for p, g, a in zip(prompts, gens, [1.0, -1.0, 0.5, -0.5])]


def state(pol: ModelPolicy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in pol.model.state_dict().items()}


def test_only_the_last_blocks_and_the_final_norm_train():
    pol = policy(1)
    trained = {n for n, p in pol.model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("model.layers.2.", "model.norm.")) for n in trained), trained
    assert "model.norm.weight" in trained
    assert len(pol.params) == len(trained)   # the optimizer holds exactly these
    before = state(pol)
    pol.update(samples(pol), step=1)
    after = state(pol)
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith(("model.layers.2.", "model.norm.")) for k in moved), moved
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])


def test_an_untied_output_head_trains_a_tied_one_stays_with_the_embeddings():
    untied = policy(1, tie_word_embeddings=False)
    trained = {n for n, p in untied.model.named_parameters() if p.requires_grad}
    assert "lm_head.weight" in trained and "model.embed_tokens.weight" not in trained
    before = state(untied)
    untied.update(samples(untied), step=1)
    assert not torch.equal(before["lm_head.weight"], untied.model.lm_head.weight)
    assert torch.equal(before["model.embed_tokens.weight"], untied.model.model.embed_tokens.weight)
    tied = policy(1)
    assert not tied.model.lm_head.weight.requires_grad


def test_the_trained_blocks_get_full_fine_tunings_gradient():
    """Freezing the parts below changes what is updated, not the gradient of what is: the last block's gradient
    equals the one full fine-tuning computes for it (same weights, same samples)."""
    grads = {}
    for n in (None, 1):
        pol = policy(n)
        batch = samples(pol)
        logp, _, mask = pol._forward_completion(pol.model, batch, want_entropy=False)
        adv = torch.tensor([s.advantage for s in batch])[:, None]
        (-(logp * adv * mask).sum()).backward()
        grads[n] = {k: p.grad.clone() for k, p in pol.model.named_parameters()
                    if k.startswith("model.layers.2.") and p.grad is not None}
    assert grads[1].keys() == grads[None].keys() and grads[1]
    for k in grads[1]:
        torch.testing.assert_close(grads[1][k], grads[None][k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n", [3, 4])
def test_as_many_layers_as_the_model_has_or_more_train_the_whole_model(n):
    """Nothing lies below the last n blocks when the model has n or fewer: the embeddings train too."""
    pol = policy(n)
    assert all(p.requires_grad for p in pol.model.parameters())
    assert len(pol.params) == len(list(pol.model.parameters()))


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_a_bad_count_is_refused(value):
    with pytest.raises(ConfigError, match="trainable_layers"):
        PolicyConfig(trainable_layers=value)


def test_under_lora_the_adapters_sit_on_the_last_blocks_only(tiny_cfg):
    """specialization=lora: trainable_layers=1 of 2 blocks puts the adapters on the last block; one update moves
    only them; policies with different values are refused."""
    data = tiny_cfg(specialization="lora", policies={"a": dict(TINY), "b": dict(TINY)},
                    agents=[{"name": "e", "policy": "a"}, {"name": "o", "policy": "b"}], run={"steps": 1})
    data["task"] = {"name": "letters", "eval_size": 0}
    for name in ("a", "b"):
        data["policies"][name]["trainable_layers"] = 1
    trainer = Trainer(config_from_dict(data))
    try:
        model = trainer.policies["a"].model
        adapters = [k for k, _ in model.named_parameters() if "lora_" in k]
        assert adapters and all(".layers.2." in k for k in adapters), adapters
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        trainer.train()
        moved = {k for k, v in model.named_parameters() if not torch.equal(before[k], v)}
        assert moved and all("lora_" in k and ".layers.2." in k for k in moved), moved
    finally:
        trainer.close()
    data["policies"]["b"]["trainable_layers"] = 2
    with pytest.raises(ConfigError, match=r"trainable_layers differ \(a: 1, b: 2\)"):
        config_from_dict(data)


def test_the_default_policy_trains_smollm2s_last_ten_blocks_and_overrides_refine_it():
    """A config without policies gets the default job's policy; policies.main.KEY=VALUE changes that key only."""
    assert load_config().policies["main"].trainable_layers == 10
    cfg = load_config(None, ["policies.main.device=cpu"])
    main = cfg.policies["main"]
    assert (main.model, main.trainable_layers, main.lr, main.device) == ("smollm2-135m", 10, 2e-4, "cpu")
    assert load_config(None, ["policies.main.trainable_layers=null"]).policies["main"].trainable_layers is None
    # overrides that name other policies build the section from them alone (no default `main` beside them)
    named = load_config(None, ["policies.concise.model=tiny-qwen2", "policies.detailed.model=tiny-qwen2"])
    assert sorted(named.policies) == ["concise", "detailed"]
    assert all(p.trainable_layers is None and p.lr is None for p in named.policies.values())


def test_resume_is_exact_and_a_changed_count_is_refused(tiny_cfg, tmp_path):
    """A run with trainable_layers resumes to the weights of an uninterrupted one; resuming it with another count
    is a one-line error naming the key (the optimizer state holds another set of tensors)."""
    policies = {"main": {**TINY, "trainable_layers": 1}}
    full = Trainer(config_from_dict(tiny_cfg(run={"steps": 2, "run_dir": str(tmp_path / "a")}, policies=policies)))
    full.train()
    data = tiny_cfg(run={"steps": 2, "run_dir": str(tmp_path / "b"), "checkpoint_every": 1}, policies=policies)
    Trainer(config_from_dict(data)).train(stop_after=1)
    resumed = Trainer(config_from_dict(data), resume=True)
    resumed.train()
    a, b = full.policies["main"].model.state_dict(), resumed.policies["main"].model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    data["policies"] = {"main": {**TINY, "trainable_layers": 2}}
    data["run"]["steps"] = 3
    with pytest.raises(ConfigError, match=r"trained \d+ tensors .* this run trains \d+; resume with the "
                                          r"trainable_layers"):
        Trainer(config_from_dict(data), resume=True)


def test_the_memory_plan_counts_what_trains(tiny_cfg):
    """`accord plan`: gradients and AdamW state for the trained tensors only, activations for the trained blocks
    only; under LoRA, the adapters of the last blocks."""
    from accord.plan import make_plan

    top = make_plan(config_from_dict(tiny_cfg(policies={"main": {**TINY, "trainable_layers": 1}})))["plans"][0]
    whole = make_plan(config_from_dict(tiny_cfg(policies={"main": dict(TINY)})))["plans"][0]
    assert top.trainable == sum(p.numel() for p in policy(1).params) < whole.trainable == whole.params
    assert top.activations < whole.activations and top.optimizer == 8.0 * top.trainable
    data = tiny_cfg(specialization="lora", policies={"a": dict(TINY), "b": dict(TINY)},
                    agents=[{"name": "e", "policy": "a"}, {"name": "o", "policy": "b"}])
    every = make_plan(config_from_dict(data))["plans"][0].trainable
    for name in ("a", "b"):
        data["policies"][name]["trainable_layers"] = 1
    assert make_plan(config_from_dict(data))["plans"][0].trainable * 3 == every   # 1 of 3 blocks adapted

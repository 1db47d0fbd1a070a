"""Generation: prompt/completion boundaries, EOS-aware masks, stored log-probs = training log-probs."""

import torch
from transformers import GenerationConfig

from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
from accord.generation import generate
from accord.policies import Policy
from accord.rollout.sample import Sample


def make_policy(pad_is_eos: bool, **rollout) -> Policy:
    cfg = PolicyConfig(model="tiny-llama", model_kwargs={"pad_is_eos": pad_is_eos})
    return Policy("p", cfg, TrainingConfig(), AlgorithmConfig(), RolloutConfig(**rollout), total_optimizer_steps=1,
                  seed=0)


def test_pad_equals_eos_with_eos_inside_the_chat_template():
    pol = make_policy(pad_is_eos=True, max_new_tokens=24, temperature=1.0)
    tok = pol.tokenizer
    assert tok.pad_token_id == tok.eos_token_id
    # two turns: the template puts EOS after every message, so the prompt itself contains EOS
    prompt = pol.encode_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
                              {"role": "user", "content": "write a long answer please"}])
    assert prompt.count(tok.eos_token_id) >= 2
    short = pol.encode_chat([{"role": "user", "content": "x"}])
    torch.manual_seed(0)
    # make EOS likely so that some completions stop early and others run to the limit
    with torch.no_grad():
        hidden = pol.model.model(input_ids=torch.tensor([prompt])).last_hidden_state[0].mean(0)
        pol.model.lm_head.weight[tok.eos_token_id] = hidden * (5.0 / hidden.dot(hidden))
    gens = generate(pol.model, tok, [prompt, short] * 16, max_new_tokens=24, temperature=1.0)
    reasons = {g.finish_reason for g in gens}
    for g in gens:
        assert len(g.ids) == len(g.logprobs) >= 1
        if g.finish_reason == "stop":
            assert g.ids[-1] == tok.eos_token_id and tok.eos_token_id not in g.ids[:-1]
        else:
            assert len(g.ids) == 24 and tok.eos_token_id not in g.ids
    assert reasons == {"stop", "length"}, reasons
    # the update's forward (left-padded, completion right-aligned, counts not pad search) sees the same
    # tokens: its log-probs equal the stored sampling log-probs, the EOS token included
    samples = [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=p, completion_ids=g.ids,
                      logprobs=g.logprobs, finish_reason=g.finish_reason)
               for p, g in zip([prompt, short] * 16, gens)]
    with torch.no_grad():
        logp, _, mask = pol._forward_completion(pol.model, samples, want_entropy=False)
    for i, g in enumerate(gens):
        row = logp[i][mask[i]]
        assert row.numel() == len(g.ids)
        assert torch.allclose(row, torch.tensor(g.logprobs), atol=1e-4)


def test_model_generation_config_does_not_leak_into_sampling():
    """A checkpoint's generation_config (here top_k=1, i.e. greedy) must not change what is sampled."""
    pol = make_policy(pad_is_eos=False)
    pol.model.generation_config = GenerationConfig(top_k=1, repetition_penalty=5.0, eos_token_id=2)
    prompt = pol.encode_chat([{"role": "user", "content": "hello"}])
    torch.manual_seed(0)
    gens = generate(pol.model, pol.tokenizer, [prompt] * 8, max_new_tokens=8, temperature=1.0)
    assert len({tuple(g.ids) for g in gens}) > 1  # samples differ: no top_k=1 was applied
    assert pol.model.generation_config.top_k == 1  # the model's own config is restored


def test_top_p_top_k_logprobs_are_the_truncated_distribution():
    pol = make_policy(pad_is_eos=False, temperature=0.7, top_k=20, top_p=0.9)
    prompt = pol.encode_chat([{"role": "user", "content": "count"}])
    torch.manual_seed(1)
    gens = generate(pol.model, pol.tokenizer, [prompt] * 4, max_new_tokens=10, temperature=0.7, top_k=20, top_p=0.9)
    samples = [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=prompt, completion_ids=g.ids,
                      logprobs=g.logprobs, finish_reason=g.finish_reason) for g in gens]
    with torch.no_grad():
        logp, _, mask = pol._forward_completion(pol.model, samples, want_entropy=False)
    stored = torch.cat([torch.tensor(g.logprobs) for g in gens])
    assert torch.allclose(logp[mask], stored, atol=1e-4)
    # truncation raises the log-prob of kept tokens above the untruncated distribution's
    assert (stored > -torch.log(torch.tensor(20.0)) - 10).all()


def test_greedy_is_deterministic():
    pol = make_policy(pad_is_eos=False)
    prompt = pol.encode_chat([{"role": "user", "content": "abc"}])
    a = generate(pol.model, pol.tokenizer, [prompt] * 3, max_new_tokens=6, greedy=True)
    b = generate(pol.model, pol.tokenizer, [prompt], max_new_tokens=6, greedy=True)
    assert a[0].ids == a[2].ids == b[0].ids


def test_sampler_draws_from_the_processed_distribution():
    """The in-processor sampler (inverse CDF) reproduces the truncated, tempered distribution."""
    from accord.algorithms.losses import process_logits
    from accord.generation.hf import _Sampler

    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, -3.0]]).expand(40000, 6)
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.5, 0, 0.8)]:
        sampler = _Sampler(temperature, top_k, top_p, greedy=False, name="t")
        scores = sampler(torch.zeros(40000, 1, dtype=torch.long), logits.clone())
        tokens = scores.argmax(-1)
        assert (scores.isfinite().sum(-1) == 1).all()
        want = torch.softmax(process_logits(logits[:1], temperature, top_k, top_p), -1)[0]
        freq = torch.bincount(tokens, minlength=6).float() / tokens.numel()
        assert torch.allclose(freq, want, atol=0.01), (freq, want)
        assert (freq[want == 0] == 0).all()
        assert torch.allclose(sampler.logprobs[0], want.log()[tokens])

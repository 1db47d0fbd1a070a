"""Generation: prompt/completion boundaries, EOS-aware masks, stored log-probs = training log-probs."""

import pytest
import torch
from transformers import GenerationConfig

from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
from accord.generation import generate
from accord.policies import Policy
from accord.rollout.sample import Sample


def make_policy(pad_is_eos: bool, **rollout) -> Policy:
    cfg = PolicyConfig(model="tiny-llama", model_kwargs={"pad_is_eos": pad_is_eos})
    return Policy("p", cfg, TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(**rollout), total_optimizer_steps=1,
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


def _hf_path(monkeypatch):
    import accord.generation.hf as hf

    monkeypatch.setattr(hf, "supports_own_loop", lambda model: False)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_own_decoding_loop_matches_hf_generate(arch, monkeypatch):
    """accord's loop (shared prefill of repeated prompts, growing cache) draws the same tokens with the
    same log-probs as Hugging Face generate driving the same sampler from the same stream."""
    import accord.generation.hf as hf

    pol = Policy("p", PolicyConfig(model=f"tiny-{arch}", model_kwargs={"pad_is_eos": arch == "llama"}),
                 TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(), total_optimizer_steps=1, seed=0)
    assert hf.supports_own_loop(pol.model)
    long_prompt = pol.encode_chat([{"role": "user", "content": "tell me a long story " * 6}])
    short = pol.encode_chat([{"role": "user", "content": "hi"}])
    mixed = [long_prompt] * 4 + [short] * 3 + [long_prompt]  # repeats, not adjacent, different widths
    same_width = [long_prompt] * 3 + [short] * 2                # chunks of one width each: no padding
    runs = {}
    for path in ("own", "hf"):
        if path == "hf":
            _hf_path(monkeypatch)
        for prompts, batch in ((mixed, 5), (same_width, 3)):
            for greedy in (False, True):
                gen = torch.Generator().manual_seed(3)
                runs[path, greedy, batch] = generate(pol.model, pol.tokenizer, prompts, max_new_tokens=20,
                                                     temperature=0.8, top_p=0.95, greedy=greedy, generator=gen,
                                                     batch_size=batch)
    for greedy, batch in ((False, 5), (True, 5), (False, 3), (True, 3)):
        own, ref = runs["own", greedy, batch], runs["hf", greedy, batch]
        assert [g.ids for g in own] == [g.ids for g in ref]
        assert [g.finish_reason for g in own] == [g.finish_reason for g in ref]
        for a, b in zip(own, ref):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert len({tuple(g.ids) for g in runs["own", False, 5][:4]}) > 1  # K samples of one prompt still differ
    assert runs["own", True, 5][0].ids == runs["own", True, 5][7].ids   # and greedy ones agree


def test_growing_cache_layer_equals_concatenation():
    from accord.generation.hf import _GrowingLayer

    layer = _GrowingLayer(capacity=3)
    chunks = [torch.randn(2, 3, n, 4) for n in (2, 1, 1, 4, 1)]  # outgrows the first buffer twice
    for i, chunk in enumerate(chunks):
        keys, values = layer.update(chunk, -chunk)
        want = torch.cat(chunks[:i + 1], dim=-2)
        assert torch.equal(keys, want) and torch.equal(values, -want)
        assert layer.get_seq_length() == want.size(-2)
    layer.select_rows(torch.tensor([1, 1, 0]))
    want = torch.cat(chunks, dim=-2)[[1, 1, 0]]
    assert torch.equal(layer.keys, want)
    keys, _ = layer.update(torch.ones(3, 3, 1, 4), torch.ones(3, 3, 1, 4))
    assert torch.equal(keys[:, :, :-1], want) and keys.size(-2) == want.size(-2) + 1


def test_sliding_window_models_are_generated_by_hf_generate():
    """A cache the loop does not implement (sliding window) leaves decoding to Hugging Face generate."""
    import transformers

    import accord.generation.hf as hf

    pol = make_policy(pad_is_eos=False)
    config = transformers.MistralConfig(vocab_size=pol.model.config.vocab_size, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        sliding_window=8)
    model = transformers.MistralForCausalLM(config).eval()
    assert not hf.supports_own_loop(model)
    prompt = pol.encode_chat([{"role": "user", "content": "a longer prompt than the window"}])
    gens = generate(model, pol.tokenizer, [prompt] * 3, max_new_tokens=12, greedy=True)
    assert len(gens) == 3 and gens[0].ids == gens[2].ids and len(gens[0].ids) >= 1


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prompt_forward_matches_the_full_sequence_forward(arch, monkeypatch):
    """The update's forward with each distinct prompt run once (its cache copied to the K samples)
    gives the full-sequence forward's log-probs, entropies, mask and parameter gradients."""
    pol = Policy("p", PolicyConfig(model=f"tiny-{arch}", model_kwargs={"pad_is_eos": arch == "llama"}),
                 TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(temperature=0.8, top_p=0.9),
                 total_optimizer_steps=1, seed=0)
    assert pol._can_share_prompts(pol.model)
    long_prompt = pol.encode_chat([{"role": "user", "content": "tell me a long story " * 5}])
    short = pol.encode_chat([{"role": "user", "content": "hi"}])
    alone = pol.encode_chat([{"role": "user", "content": "once"}])
    prompts = [long_prompt, short, long_prompt, alone, short, long_prompt]
    gens = generate(pol.model, pol.tokenizer, prompts, max_new_tokens=12, temperature=0.8, top_p=0.9,
                    generator=torch.Generator().manual_seed(0))
    cut = [12, 3, 7, 1, 12, 5]   # completions of different lengths, one of a single token
    samples = [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=p, completion_ids=g.ids[:n],
                      logprobs=g.logprobs[:n], finish_reason="length") for p, g, n in zip(prompts, gens, cut)]

    def forward(share: bool):
        monkeypatch.setattr(pol, "_can_share_prompts", lambda model: share)
        pol.model.zero_grad(set_to_none=True)
        logp, ent, mask = pol._forward_completion(pol.model, samples, want_entropy=True)
        ((logp * mask).sum() + (ent * mask).sum()).backward()
        return logp.detach(), ent.detach(), mask, [p.grad.clone() for p in pol.params]

    shared, full = forward(True), forward(False)
    assert torch.equal(shared[2], full[2])
    mask = full[2]
    assert torch.allclose(shared[0][mask], full[0][mask], atol=1e-5)
    assert torch.allclose(shared[1][mask], full[1][mask], atol=1e-5)
    assert torch.allclose(shared[0][mask], torch.tensor([x for s in samples for x in s.logprobs]), atol=1e-4)
    for a, b in zip(shared[3], full[3]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)

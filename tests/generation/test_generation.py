"""Generation: prompt/completion boundaries, EOS-aware masks, stored log-probs = training log-probs."""

import dataclasses

import pytest
import torch
from transformers import GenerationConfig

from accord.config import AlgorithmConfig, PolicyConfig, RolloutConfig, TrainingConfig
from accord.generation import generate
from accord.policies.learner import prefix_plan
from accord.policies.model import ModelPolicy
from accord.rollout.sample import Sample


def make_policy(pad_is_eos: bool, **rollout) -> ModelPolicy:
    cfg = PolicyConfig(model="tiny-llama", model_kwargs={"pad_is_eos": pad_is_eos})
    return ModelPolicy("p", cfg, TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(**rollout),
                       total_optimizer_steps=1, seed=0)


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

    pol = ModelPolicy("p", PolicyConfig(model=f"tiny-{arch}", model_kwargs={"pad_is_eos": arch == "llama"}),
                      TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(), total_optimizer_steps=1, seed=0)
    assert hf.supports_own_loop(pol.model)
    assert hf.DecodeStep.build(pol.model, 64) is not None  # the loop's decoding steps skip the model's forward
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


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_finished_rows_leave_the_batch_without_changing_the_draws(arch, monkeypatch):
    """Rows that emit EOS leave accord's batch at different steps; the others draw the same tokens with the
    same log-probs as Hugging Face generate, which computes every row to the end: the random stream
    advances for finished rows too."""
    import accord.generation.hf as hf

    # a 300-token vocabulary sampled at temperature 2: EOS comes by chance, to some rows, at different steps
    kwargs = {"pad_is_eos": arch == "llama", "vocab_size": 300}
    pol = ModelPolicy("p", PolicyConfig(model=f"tiny-{arch}", model_kwargs=kwargs),
                      TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(), total_optimizer_steps=1, seed=0)
    assert hf.unsupported_reason(pol.model) is None  # the direct decoding step applies
    long_prompt = pol.encode_chat([{"role": "user", "content": "tell me a long story " * 6}])
    short = pol.encode_chat([{"role": "user", "content": "hi"}])
    prompts = [long_prompt] * 5 + [short] * 3 + [long_prompt] * 4
    runs = {}
    for path in ("own", "hf"):
        if path == "hf":
            _hf_path(monkeypatch)
        runs[path] = generate(pol.model, pol.tokenizer, prompts, max_new_tokens=24, temperature=2.0,
                              generator=torch.Generator().manual_seed(5))
    own, ref = runs["own"], runs["hf"]
    assert len({len(g.ids) for g in own}) >= 3, [len(g.ids) for g in own]  # rows left at different steps
    assert [g.ids for g in own] == [g.ids for g in ref]
    for a, b in zip(own, ref):
        assert a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_per_row_sampling_through_the_direct_loop_draws_like_generate(monkeypatch):
    """Rows with their own temperature, top-k, top-p and length cap, interleaved across prompts (the direct
    loop reorders rows by prompt) and leaving the batch at EOS or at their cap: the direct decoding loop
    draws Hugging Face generate's tokens and log-probs, and each row's are those of its own settings."""
    import accord.generation.hf as hf
    from accord.rollout.sample import Sampling

    pol = ModelPolicy("p", PolicyConfig(model="tiny-qwen3", model_kwargs={"vocab_size": 300}),
                      TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(), total_optimizer_steps=1, seed=0)
    assert hf.unsupported_reason(pol.model) is None  # the direct decoding step applies
    hot, nucleus, capped = Sampling(2.0, 0, 1.0, 24), Sampling(1.5, 0, 0.9, 24), Sampling(0.9, 7, 1.0, 5)
    long_prompt = pol.encode_chat([{"role": "user", "content": "tell me a long story " * 6}])
    short = pol.encode_chat([{"role": "user", "content": "hi"}])
    prompts = [long_prompt, short, long_prompt, short, long_prompt, short, long_prompt, short, long_prompt]
    rows = [hot, capped, nucleus, hot, capped, nucleus, hot, hot, nucleus]
    runs = {}
    for path in ("own", "hf"):
        if path == "hf":
            _hf_path(monkeypatch)
        runs[path] = generate(pol.model, pol.tokenizer, prompts, max_new_tokens=30, row_sampling=rows,
                              generator=torch.Generator().manual_seed(11))
    own, ref = runs["own"], runs["hf"]
    assert [g.ids for g in own] == [g.ids for g in ref]
    assert [g.finish_reason for g in own] == [g.finish_reason for g in ref]
    for a, b in zip(own, ref):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert {len(g.ids) for g, s in zip(own, rows) if s is capped} == {5}
    assert any(g.finish_reason == "stop" for g in own) and len({len(g.ids) for g in own}) >= 3
    samples = [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=p, completion_ids=g.ids,
                      logprobs=g.logprobs, finish_reason=g.finish_reason, sampling=s)
               for p, g, s in zip(prompts, own, rows)]
    with torch.no_grad():
        logp, _, mask = pol._forward_completion(pol.model, samples, want_entropy=False)
    for i, s in enumerate(samples):   # the learner's log-probs under each row's own settings
        assert torch.allclose(logp[i][mask[i]], torch.tensor(s.logprobs), atol=1e-4)


def _decode_step_models():
    import transformers

    common = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128)
    return {
        "qwen2 (biases, GQA, tied)": transformers.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True,
                                                               **common),
        "llama (biases, no GQA, untied, linear rope)": transformers.LlamaConfig(
            num_key_value_heads=4, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, **common),
        "mistral (no sliding window, head_dim 32)": transformers.MistralConfig(
            num_key_value_heads=1, head_dim=32, sliding_window=None, **common),
        "llama eager attention": transformers.LlamaConfig(num_key_value_heads=2, attn_implementation="eager", **common),
        "qwen3 (q/k norms, GQA, biases)": transformers.Qwen3Config(num_key_value_heads=2, attention_bias=True,
                                                                    head_dim=16, **common),
    }


KERNELS = pytest.mark.parametrize("kernel", ["accord", "onednn", None], ids=["accord-kernel", "onednn", "F.linear"])


def use_product_kernel(monkeypatch, kernel: str | None) -> None:
    """Run the decoding products of every projection, the tiny models' small ones included, through ``kernel``
    (accord's compiled CPU kernel, oneDNN's prepacked products, or F.linear for None)."""
    import accord.generation.fast_decode as fast_decode
    from accord.generation import cpu_gemm

    if kernel == "accord" and cpu_gemm._unavailable() is not None:
        pytest.skip(f"accord's CPU kernel does not apply here: {cpu_gemm._unavailable()}")
    if kernel == "onednn" and not fast_decode.onednn_linear_available():
        pytest.skip("this torch build has no oneDNN prepacked products")
    monkeypatch.setattr(fast_decode, "product_kernel", lambda: kernel)
    monkeypatch.setattr(fast_decode, "PACK_MIN_WEIGHTS", 0 if kernel else 1 << 62)


@KERNELS
@pytest.mark.parametrize("name", list(_decode_step_models()))
def test_direct_decode_step_matches_the_model_forward(name, kernel, monkeypatch):
    """DecodeStep over a SharedPrefixCache (each distinct prompt prefilled once, its rows' own tokens apart,
    a finished row dropped midway) gives, row by row, the logits of the model's forward over the row's
    whole sequence; with accord's CPU kernel, oneDNN's prepacked products and F.linear."""
    import transformers

    import accord.generation.fast_decode as fast_decode
    from accord.generation.fast_decode import DecodeStep, SharedPrefixCache
    from accord.generation.hf import _cache_kwarg, first_occurrences

    use_product_kernel(monkeypatch, kernel)
    config = _decode_step_models()[name]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # random biases and norm weights, not zeros and ones
            param.add_(torch.randn_like(param) * 0.05)
    monkeypatch.setattr(fast_decode, "SHARE_MIN_TOKENS", 3)  # the tiny prompts' shared prefixes run once
    steps = 6
    for prompts in ([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]],                   # one row each, three lengths
                    [[3, 4, 5]] * 3,                                              # one prompt, three rows
                    [[5, 6, 7, 8, 9], [10, 11], [5, 6, 7, 8, 9], [10, 11], [5, 6, 7, 8, 9], [12, 13]],
                    # shared prefixes: 5-8 by three prompts, then 5-9 by two of them, one prompt within another
                    [[5, 6, 7, 8, 9, 1], [5, 6, 7, 8, 2, 3], [5, 6, 7, 8, 9, 4, 4], [5, 6, 7, 8, 9, 1, 2], [10, 11]]):
        index, first = first_occurrences([tuple(p) for p in prompts])
        order = sorted(range(len(prompts)), key=index.__getitem__)  # rows of one prompt adjacent
        step = DecodeStep.build(model, max(map(len, prompts)) + steps, rows=len(prompts))
        assert step is not None, name
        with torch.no_grad():
            logits, prefix, lengths = step.prefill([prompts[r] for r in first])
            for u, r in enumerate(first):
                cache = transformers.DynamicCache(config=config)
                want = model(input_ids=torch.tensor([prompts[r]]), **{_cache_kwarg(model): cache}).logits[0, -1]
                assert torch.allclose(logits[u], want, atol=1e-5, rtol=1e-5), (name, "prefill", u)
                for (keys, values), layer in zip(prefix, cache.layers):
                    assert torch.allclose(keys[u, :, :len(prompts[r])], layer.keys[0], atol=1e-5), (name, "keys", u)
                    assert torch.allclose(values[u, :, :len(prompts[r])], layer.values[0], atol=1e-5), (name, u)
                    assert not keys[u, :, len(prompts[r]):].any()  # right padding
        cache = SharedPrefixCache(prefix, lengths, torch.tensor([index[r] for r in order]), steps,
                                  compiled=step.compiled)
        sequences = [list(prompts[r]) for r in order]
        rows = list(range(len(order)))
        tokens = torch.randint(1, config.vocab_size, (steps, len(order)))
        with torch.no_grad():
            for t in range(steps):
                if t == 3 and len(rows) > 1:  # the second row emitted EOS: it leaves the batch
                    keep = torch.ones(len(rows), dtype=torch.bool)
                    keep[1] = False
                    cache.keep(keep)
                    rows = [r for r, k in zip(rows, keep) if k]
                for r in rows:
                    sequences[r].append(int(tokens[t, r]))
                got = step(tokens[t, rows], torch.tensor([len(sequences[r]) - 1 for r in rows]), cache)
                want = torch.stack([model(input_ids=torch.tensor([sequences[r]])).logits[0, -1] for r in rows])
                assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (name, prompts, t, (got - want).abs().max())
        assert cache.length == steps


@pytest.mark.parametrize("compiled", [True, False], ids=["accord's kernel", "torch"])
def test_shared_prefix_cache_attends_as_each_row_over_its_own_sequence(compiled):
    """SharedPrefixCache's attention (accord's compiled CPU kernel, or torch's operators with the prompt part in the
    prompts' slot layout, each row's own tokens apart) is, row by row, plain softmax attention over the row's prompt
    and its own tokens: prompts with uneven numbers of rows, one with none, padding past a shorter prompt, and rows
    leaving midway (a prompt losing its last row, the slots per prompt shrinking)."""
    from accord.generation import cpu_gemm
    from accord.generation.fast_decode import SharedPrefixCache

    if compiled and cpu_gemm.kernel() is None:
        pytest.skip("accord's CPU kernel does not apply here (or did not build)")

    torch.manual_seed(0)
    kv_heads, group, head_dim, steps = 2, 3, 8, 7
    lengths = [5, 3, 4, 2]   # prompt 3 has no row
    keys, values = torch.randn(2, 4, kv_heads, 5, head_dim).unbind(0)
    for u, n in enumerate(lengths):   # the prefill's right padding
        keys[u, :, n:] = 0
        values[u, :, n:] = 0
    row_prompt = torch.tensor([0, 0, 0, 1, 2, 2])
    cache = SharedPrefixCache([(keys, values)], torch.tensor(lengths), row_prompt, steps, compiled=compiled)
    rows = list(range(6))
    own = {r: ([], []) for r in rows}   # each row's generated keys and values so far
    for t in range(steps):
        if t in (2, 4):   # rows 1 and 3 leave, then rows 4 and 0 (prompt 1 keeps none, prompt 0 one row)
            gone = {2: (1, 3), 4: (4, 0)}[t]
            keep = torch.tensor([r not in gone for r in rows])
            cache.keep(keep)
            rows = [r for r in rows if r not in gone]
        q = torch.randn(len(rows), kv_heads, group, head_dim)
        k, v = torch.randn(2, len(rows), kv_heads, head_dim).unbind(0)
        got = cache.attend(0, q, k, v)
        cache.advance()
        for i, r in enumerate(rows):
            own[r][0].append(k[i])
            own[r][1].append(v[i])
            u = int(row_prompt[r])
            seq_k = torch.cat([keys[u, :, :lengths[u]], torch.stack(own[r][0], 1)], 1)   # (kv_heads, n, dim)
            seq_v = torch.cat([values[u, :, :lengths[u]], torch.stack(own[r][1], 1)], 1)
            want = torch.softmax(q[i] @ seq_k.transpose(1, 2), -1) @ seq_v
            assert torch.allclose(got[i], want, atol=1e-6), (t, r, (got[i] - want).abs().max())
    assert cache.per_prompt == 1 and cache.length == steps


def test_direct_prefill_in_short_passes_and_without_gqa_attention_is_the_same(monkeypatch):
    """The prefill split into passes of a few tokens, and with the key/value heads copied per query head (torch
    before 2.5 has no enable_gqa), gives the logits and keys and values of one pass, to rounding."""
    import transformers

    import accord.generation.fast_decode as fast_decode
    from accord.generation.fast_decode import DecodeStep

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_decode_step_models()["qwen2 (biases, GQA, tied)"]).eval()
    prompts = [[5, 6, 7, 8, 9, 1], [5, 6, 7, 8, 2, 3], [5, 6, 7, 8, 9, 4, 4], [10, 11, 12], [13, 14]]
    monkeypatch.setattr(fast_decode, "SHARE_MIN_TOKENS", 3)
    step = DecodeStep.build(model, 16)
    with torch.no_grad():
        logits, cache, _ = step.prefill(prompts)
        monkeypatch.setattr(fast_decode, "PREFILL_TOKENS", 3)
        monkeypatch.setattr(fast_decode, "_SDPA_GQA", False)
        short_logits, short_cache, _ = step.prefill(prompts)
    assert torch.allclose(logits, short_logits, atol=1e-6)
    for (k, v), (sk, sv) in zip(cache, short_cache):
        assert torch.allclose(k, sk, atol=1e-6) and torch.allclose(v, sv, atol=1e-6)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # raised inside peft
def test_direct_decode_step_refuses_what_it_does_not_implement():
    """Adapters other than plain LoRA on the projections, other dtypes, hooks and sliding windows leave
    decoding to the model's forward."""
    import transformers
    from peft import LoraConfig, get_peft_model

    from accord.generation.fast_decode import unsupported_reason

    config = _decode_step_models()["qwen2 (biases, GQA, tied)"]
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert unsupported_reason(model) is None
    lora = get_peft_model(transformers.AutoModelForCausalLM.from_config(config),
                          LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert unsupported_reason(lora) is None  # plain LoRA: the direct step adds the adapters itself
    assert "not a plain nn.Linear" in unsupported_reason(lora.get_base_model())  # adapters without PEFT's model
    dora = get_peft_model(transformers.AutoModelForCausalLM.from_config(config),
                          LoraConfig(r=2, target_modules=["q_proj", "v_proj"], use_dora=True))
    assert "DoRA" in unsupported_reason(dora)
    head = get_peft_model(transformers.AutoModelForCausalLM.from_config(config),
                          LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    assert "output head" in unsupported_reason(head)
    assert "bfloat16" in unsupported_reason(transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16))
    hooked = transformers.AutoModelForCausalLM.from_config(config)
    hooked.model.layers[1].mlp.register_forward_hook(lambda *args: None)
    assert "hooks" in unsupported_reason(hooked)
    window = transformers.Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                      sliding_window=4, max_window_layers=1)
    assert "sliding-window" in unsupported_reason(transformers.AutoModelForCausalLM.from_config(window))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    assert "GPT2LMHeadModel is not one of" in unsupported_reason(gpt2)


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
    """The update's forward with each distinct prompt run once (its cache copied to the K samples), and a prefix
    that several distinct prompts share run once before them, gives the full-sequence forward's log-probs,
    entropies, mask and parameter gradients."""
    pol = ModelPolicy("p", PolicyConfig(model=f"tiny-{arch}", model_kwargs={"pad_is_eos": arch == "llama"}),
                      TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(temperature=0.8, top_p=0.9),
                      total_optimizer_steps=1, seed=0)
    assert pol._can_share_prompts(pol.model)
    long_prompt = pol.encode_chat([{"role": "user", "content": "tell me a long story " * 5}])
    short = pol.encode_chat([{"role": "user", "content": "hi"}])
    alone = pol.encode_chat([{"role": "user", "content": "once"}])
    # three prompts that share long instructions (one prefix run for them), one of them twice
    told = [pol.encode_chat([{"role": "system", "content": "follow these rules carefully " * 6},
                             {"role": "user", "content": text}]) for text in ("a", "a longer question", "b c")]
    prompts = [long_prompt, short, long_prompt, alone, short, long_prompt, *told, told[1]]
    assert prefix_plan(list(dict.fromkeys(map(tuple, prompts))))   # the two-pass forward runs
    gens = generate(pol.model, pol.tokenizer, prompts, max_new_tokens=12, temperature=0.8, top_p=0.9,
                    generator=torch.Generator().manual_seed(0))
    cut = [12, 3, 7, 1, 12, 5, 4, 1, 12, 9]   # completions of different lengths, some of a single token
    samples = [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=p, completion_ids=g.ids[:n],
                      logprobs=g.logprobs[:n], finish_reason="length") for p, g, n in zip(prompts, gens, cut)]

    def forward(share: bool):
        monkeypatch.setattr(pol, "_can_share_prompts", lambda model: share)
        with torch.no_grad():
            logp, ent, mask = pol._forward_completion(pol.model, samples, want_entropy=True)
        # the gradients of the untruncated distribution: a change of float rounding can swap two nearly tied
        # tokens at the nucleus boundary (seen: one position of one sample), which moves the truncated
        # distribution's gradients by 1e-4 whichever forward runs; the truncation comes after the forward
        pol.model.zero_grad(set_to_none=True)
        g_logp, g_ent, _ = pol._forward_completion(pol.model, samples, want_entropy=True, untruncated=True,
                                                   entropy_grad=True)
        ((g_logp * mask).sum() + (g_ent * mask).sum()).backward()
        return logp, ent, mask, [p.grad.clone() for p in pol.params]

    shared, full = forward(True), forward(False)
    assert torch.equal(shared[2], full[2])
    mask = full[2]
    assert torch.allclose(shared[0][mask], full[0][mask], atol=1e-5)
    assert torch.allclose(shared[1][mask], full[1][mask], atol=1e-5)
    # against the sampler's log-probs: its decoding step's products round otherwise than the forward's, and where a
    # token at the nucleus boundary is within rounding of the least likely kept one, the two keep different sets
    # (seen on an AVX2-only Zen 3 EPYC at one of the 66 positions: 4e-4, one boundary token's share of this flat
    # 2k-token distribution); every other position agrees to 1e-4
    gap = (shared[0][mask] - torch.tensor([x for s in samples for x in s.logprobs])).abs()
    assert int((gap > 1e-4).sum()) <= 1 and float(gap.max()) < 2e-3, gap
    for a, b in zip(shared[3], full[3]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_prefix_plan_runs_a_shared_prefix_once_only_where_it_spares_positions():
    """Prompts sharing a long prefix get it as one first-pass row; a prompt sharing none keeps all but its last
    token as its own; prompts with nothing worth sharing, or one prompt, get no plan."""
    told = [[7] * 40 + [1, 2], [7] * 40 + [3], [7] * 40 + [4, 5, 6]]
    prefixes, of = prefix_plan([*told, [9] * 30])
    assert prefixes == [[7] * 40, [9] * 29] and of == [0, 0, 0, 1]
    assert prefix_plan([[1, 2, 3], [4, 5, 6]]) is None   # two passes would compute as many positions as one
    assert prefix_plan([[7] * 20 + [1], [7] * 20 + [2]]) is None   # 20 positions spared, under the minimum
    assert prefix_plan([[7] * 70 + [1], [7] * 70 + [2]])
    assert prefix_plan([told[0]]) is None


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_decoding_and_the_update_forward_raise_no_deprecation_warning(arch):
    """The KV cache is passed by the keyword the installed transformers names (``cache`` in 5.24, where
    ``past_key_values`` warns on every forward): accord's own decoding loop, Hugging Face generate and the
    update's shared-prompt forward run with FutureWarning and DeprecationWarning turned into errors."""
    import warnings

    pol = ModelPolicy("p", PolicyConfig(model=f"tiny-{arch}"), TrainingConfig(bf16=False), AlgorithmConfig(),
                      RolloutConfig(temperature=1.0), total_optimizer_steps=1, seed=0)
    prompts = [pol.encode_chat([{"role": "user", "content": text}]) for text in ("hello there", "hi")] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        gens = generate(pol.model, pol.tokenizer, prompts, max_new_tokens=4, temperature=1.0,
                        generator=torch.Generator().manual_seed(0))
        samples = [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=p, completion_ids=g.ids,
                          logprobs=g.logprobs, finish_reason=g.finish_reason) for p, g in zip(prompts, gens)]
        assert pol._can_share_prompts(pol.model)
        with torch.no_grad():
            pol._forward_completion(pol.model, samples, want_entropy=False)


def test_prefix_tree_shares_what_spares_enough_tokens():
    """A shared prefix gets a node of its own when (prompts sharing it - 1) x its length reaches the
    threshold; each prompt keeps its last token for its own leaf; prompts that share nothing are leaves."""
    from accord.generation.fast_decode import prefix_tree

    def shape(nodes):
        return [(n.start, n.end, n.members, shape(n.children)) for n in nodes]

    a, b, c = [1] * 10 + [2, 3], [1] * 10 + [2, 4, 5], [1] * 10 + [6]
    # ten tokens shared by three spare 20; the eleventh, shared by a and b, spares 1
    assert shape(prefix_tree([a, b, c], min_tokens=20)) == [
        (0, 10, [0, 1, 2], [(10, 12, [0], []), (10, 13, [1], []), (10, 11, [2], [])])]
    assert shape(prefix_tree([a, b, c], min_tokens=1)) == [
        (0, 10, [0, 1, 2], [(10, 11, [0, 1], [(11, 12, [0], []), (11, 13, [1], [])]), (10, 11, [2], [])])]
    # above 20 the ten are not worth a pass, nor a and b's eleven (11 x 1)
    assert shape(prefix_tree([a, b, c], min_tokens=21)) == [(0, 12, [0], []), (0, 13, [1], []), (0, 11, [2], [])]
    # ... but a and b's eleven are when they spare enough, after the prompts that share less are split off
    assert shape(prefix_tree([a, b, c], min_tokens=11)) == [
        (0, 10, [0, 1, 2], [(10, 12, [0], []), (10, 13, [1], []), (10, 11, [2], [])])]
    assert shape(prefix_tree([a, b, [9] + c], min_tokens=11)) == [
        (0, 11, [0, 1], [(11, 12, [0], []), (11, 13, [1], [])]), (0, 12, [2], [])]
    # one prompt inside another: the shorter keeps its last token for its own leaf
    assert shape(prefix_tree([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]], min_tokens=3)) == [
        (0, 3, [0, 1], [(3, 4, [0], []), (3, 6, [1], [])])]
    assert shape(prefix_tree([[7, 8], [9]], min_tokens=1)) == [(0, 2, [0], []), (0, 1, [1], [])]
    assert shape(prefix_tree([[7, 8]], min_tokens=0)) == [(0, 2, [0], [])]
    assert shape(prefix_tree([[1], [1, 2]], min_tokens=0)) == [(0, 1, [0], []), (0, 2, [1], [])]  # no empty node


def _eos_likely(pol, prompt, scale=5.0):
    """Raise EOS's logit after ``prompt`` so that completions often stop within a few tokens."""
    with torch.no_grad():
        hidden = pol.model.model(input_ids=torch.tensor([prompt])).last_hidden_state[0].mean(0)
        pol.model.lm_head.weight[pol.tokenizer.eos_token_id] = hidden * (scale / hidden.dot(hidden))


@pytest.mark.parametrize("path", ["direct", "forward", "hf"])
def test_min_new_tokens_holds_eos_back_and_the_learner_renormalises_the_same(path, monkeypatch):
    """No completion ends before its floor (rows with floors 0 and 4 in one batch, sampled and greedy), and the
    learner's log-probs of the samples, told each sample's floor, equal the stored sampling log-probs; without
    the floor the learner's would differ (the test can fail) and unfloored rows do stop early."""
    import accord.generation.hf as hf
    from accord.rollout.sample import Sampling

    pol = make_policy(pad_is_eos=False, max_new_tokens=12, temperature=1.0)
    tok = pol.tokenizer
    prompt = pol.encode_chat([{"role": "user", "content": "write a long answer please"}])
    _eos_likely(pol, prompt, scale=8.0)
    if path == "forward":
        monkeypatch.setattr(hf, "unsupported_reason", lambda model: "the test's forward path")
    elif path == "hf":
        _hf_path(monkeypatch)
    free, floored = Sampling(1.0, 0, 1.0, 12, 0), Sampling(1.0, 0, 1.0, 12, 4)
    rows = [free, floored] * 12
    gens = generate(pol.model, tok, [prompt] * len(rows), max_new_tokens=12, row_sampling=rows,
                    generator=torch.Generator().manual_seed(0))
    eos = tok.eos_token_id
    assert all(eos not in g.ids[:4] for g in gens[1::2])
    assert any(g.finish_reason == "stop" and len(g.ids) <= 4 for g in gens[0::2])   # the free rows stop early
    assert any(g.finish_reason == "stop" for g in gens[1::2])   # floored rows stop too, after their floor
    samples = [Sample(agent="a", policy="p", turn=0, group=0, instance=0, prompt_ids=prompt, completion_ids=g.ids,
                      logprobs=g.logprobs, finish_reason=g.finish_reason, sampling=s) for g, s in zip(gens, rows)]
    with torch.no_grad():
        logp, _, mask = pol._forward_completion(pol.model, samples, want_entropy=True)
        shared = pol._forward_shared_prompts(pol.model, samples, want_entropy=False)[0]
        unfloored = pol._forward_completion(pol.model, [dataclasses.replace(s, sampling=free) for s in samples],
                                            want_entropy=False)[0]
    stored = torch.cat([torch.tensor(g.logprobs) for g in gens])
    assert torch.allclose(logp[mask], stored, atol=1e-4)
    assert torch.allclose(shared[mask], stored, atol=1e-4)
    assert not torch.allclose(unfloored[mask], stored, atol=1e-2)
    greedy = generate(pol.model, tok, [prompt] * 2, max_new_tokens=12, greedy=True, row_sampling=[free, floored])
    assert greedy[0].ids == [eos] and eos not in greedy[1].ids[:4]


def test_min_new_tokens_settings_resolve_per_agent_and_bad_floors_are_refused():
    """rollout.min_new_tokens null takes the task's floor (the writing task: L1's 8 words), a number every
    agent's, an agent's own setting wins; a floor at or above the cap and a negative one are one-line errors."""
    from accord.build import build_env, env_info
    from accord.config import ConfigError, load_config
    from accord.config.rules import check_rollout
    from accord.rollout.sample import agent_sampling

    def floors(*overrides):
        cfg = load_config(None, [*overrides] if "task.name=relay" in overrides else
                          ["task.options.source=offline", *overrides])
        check_rollout(cfg, env_info(build_env(cfg)))
        return {a: s.min_new_tokens for a, s in agent_sampling(cfg).items()}

    assert floors() == {"concise": 8, "detailed": 8}
    assert floors("rollout.min_new_tokens=0") == {"concise": 0, "detailed": 0}
    assert floors("rollout.min_new_tokens=3") == {"concise": 3, "detailed": 3}
    relay = floors("task.name=relay")
    assert relay and set(relay.values()) == {0}
    with pytest.raises(ConfigError, match=r"rollout.min_new_tokens=80 is not below the length cap of agent 'concise'"):
        floors("rollout.min_new_tokens=80")
    with pytest.raises(ConfigError, match=r"min_new_tokens=-1 must be an integer >= 0"):
        floors("rollout.min_new_tokens=-1")
    with pytest.raises(ConfigError,
                       match=r"agents.concise.sampling.min_new_tokens=9 is not below the length cap of agent 'concise'"):
        floors("rollout.max_new_tokens=9", "agents=[{name: concise, sampling: {min_new_tokens: 9}}, {name: detailed}]")


def test_a_task_floor_that_the_cap_leaves_no_room_for_is_not_applied_and_says_so(caplog):
    from accord.build import build_env, env_info
    from accord.config import load_config
    from accord.config.rules import check_rollout
    from accord.rollout.sample import agent_sampling

    cfg = load_config(None, ["task.options.source=offline", "rollout.max_new_tokens=8"])
    with caplog.at_level("WARNING", logger="accord.config.rules"):
        check_rollout(cfg, env_info(build_env(cfg)))
    assert {s.min_new_tokens for s in agent_sampling(cfg).values()} == {0}
    assert "declares a completion floor of 8 tokens, which its length cap of 8 leaves no room for" in caplog.text


def test_a_task_declares_its_floor_as_a_number_or_per_agent():
    from types import SimpleNamespace

    from accord.build import task_floors

    assert task_floors(SimpleNamespace(agents=("a", "b"), min_new_tokens=3)) == (("a", 3), ("b", 3))
    assert task_floors(SimpleNamespace(agents=("a", "b"), min_new_tokens={"b": 5, "a": 0})) == (("b", 5),)
    assert task_floors(SimpleNamespace(agents=("a",))) == ()


def _trunk_policies(vocab_size: int = 300, **extra):
    """Two policies over one tiny model that train only its last block; the second's trained part moved."""
    kwargs = {"vocab_size": vocab_size, "hidden_size": 64, "num_layers": 3, **extra}
    pols = [ModelPolicy(name, PolicyConfig(model="tiny-qwen2", model_kwargs=kwargs, trainable_layers=1),
                        TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(max_new_tokens=24),
                        total_optimizer_steps=1, seed=0) for name in ("a", "b")]
    torch.manual_seed(1)
    with torch.no_grad():
        for p in pols[1].model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn_like(p))
    return pols


@pytest.mark.parametrize("tied", [False, True], ids=["own-heads", "tied-head"])
@KERNELS
def test_policies_sharing_their_first_layers_decode_them_together_with_the_same_draws(kernel, tied, monkeypatch):
    """Two policies that train the last of three blocks of one model: generate_together runs the two frozen
    blocks for both policies' rows at once (and, with a head tied to the frozen embeddings, the head too, after
    each policy's own trained final norm), and each policy gets the tokens and log-probs of its own call (its
    own stream, its own per-row settings, rows leaving at EOS or their cap at different steps): bit for bit
    with the packed kernels' products (accord's and oneDNN's), whose rows do not depend on the batch, to rounding
    with F.linear's; so does the rollout's generate_by_policy."""
    from accord.generation.fast_decode import DecodeStep, shared_trunk
    from accord.generation.hf import DecodeJob, generate_together
    from accord.policies.agents import generate_by_policy
    from accord.rollout.sample import Sampling

    use_product_kernel(monkeypatch, kernel)
    a, b = _trunk_policies(tie_word_embeddings=tied)   # untied: heads of their own, which train
    first = DecodeStep(a.model, 64, rows=4)
    assert (DecodeStep(b.model, 64, rows=2, trunk=(first, 2)).head is first.head) == tied
    assert not torch.equal(a.model.model.norm.weight, b.model.model.norm.weight)
    long_prompt = a.encode_chat([{"role": "user", "content": "tell me a long story " * 6}])
    short = a.encode_chat([{"role": "user", "content": "hi"}])
    _eos_likely(b, long_prompt, scale=12.0)
    if tied:   # the row written into b's embeddings, which the trunk shares
        with torch.no_grad():
            a.model.lm_head.weight.copy_(b.model.lm_head.weight)
    assert shared_trunk([a.model, b.model]) == 2
    hot, nucleus, capped = Sampling(2.0, 0, 1.0, 24), Sampling(1.5, 0, 0.9, 24), Sampling(0.9, 7, 1.0, 5)
    prompts = {"a": [long_prompt, short, long_prompt, short, long_prompt],
               "b": [short, short, long_prompt, long_prompt, long_prompt, short, long_prompt]}
    rows = {"a": [hot, capped, nucleus, hot, nucleus], "b": [hot] * 7}
    pols = {"a": a, "b": b}
    lengths = {}
    for greedy in (False, True):
        alone, jobs = {}, []
        for name, pol in pols.items():
            settings = {"max_new_tokens": 24, "row_sampling": rows[name]} if name == "a" else {
                "max_new_tokens": 20, "temperature": 2.0}
            alone[name] = generate(pol.model, pol.tokenizer, prompts[name], greedy=greedy, name=name,
                                   generator=torch.Generator().manual_seed(7), **settings)
            jobs.append(DecodeJob(pol.model, pol.tokenizer, prompts[name], greedy,
                                  torch.Generator().manual_seed(7), name, settings))
        together = dict(zip(pols, generate_together(jobs, 2)))
        for name in pols:
            assert [g.ids for g in together[name]] == [g.ids for g in alone[name]]
            assert [g.finish_reason for g in together[name]] == [g.finish_reason for g in alone[name]]
            same_logprobs(together[name], alone[name], kernel is not None)
            lengths[name, greedy] = [len(g.ids) for g in alone[name]]
    # sampling, b's rows stopped at several steps before its cap, and a's rows ran on after b's had all stopped
    assert len(set(lengths["b", False])) >= 3 and max(lengths["b", False]) < max(lengths["a", False]), lengths

    # through the rollout: each policy's own training stream, restarted to the same state for both paths
    import accord.policies.agents as agents

    runs = []
    for _ in range(2):
        for pol in pols.values():
            pol.generator.manual_seed(5)
        runs.append(generate_by_policy(pols, prompts, greedy=False, temperature=1.5))
        monkeypatch.setattr(agents, "shared_trunk", lambda models: 0)   # the second pass: one call per policy
    for name in pols:
        assert [g.ids for g in runs[0][name]] == [g.ids for g in runs[1][name]]
        same_logprobs(runs[0][name], runs[1][name], kernel is not None)


@pytest.mark.parametrize("own_loop", [True, False], ids=["direct", "generate"])
def test_an_empty_prompt_or_no_room_to_generate_is_one_line(own_loop, monkeypatch):
    """The direct path failed with an IndexError on an empty prompt, and Hugging Face's generate decoded one from
    padding alone; a cap of 0 tokens was refused by generate only."""
    import accord.generation.hf as hf

    if not own_loop:
        monkeypatch.setattr(hf, "supports_own_loop", lambda model: False)
    pol = ModelPolicy("p", PolicyConfig(model="tiny-qwen2", model_kwargs={"hidden_size": 64, "num_layers": 2}),
                      TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(max_new_tokens=4),
                      total_optimizer_steps=1, seed=0)
    prompt = pol.encode_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="^prompt 1 is empty; a completion continues at least one token"):
        generate(pol.model, pol.tokenizer, [prompt, []], max_new_tokens=4)
    with pytest.raises(ValueError, match="^max_new_tokens=0: give at least 1$"):
        generate(pol.model, pol.tokenizer, [prompt], max_new_tokens=0)


@pytest.mark.parametrize("kernel", ["accord", "onednn"], ids=["accord-kernel", "onednn"])
def test_a_row_decoded_alone_is_the_row_decoded_in_a_batch(kernel, monkeypatch):
    """The packed kernels' rows do not depend on the batch, a call of one row included: oneDNN's weights laid out
    for one row ran another kernel, whose results differed in the last bits from the same row's beside others (4.8e-7
    in the log-probs on the tiny model, a one-row job of generate_together against the same job's rows elsewhere)."""
    from accord.generation.fast_decode import Projection

    use_product_kernel(monkeypatch, kernel)
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 1024, bias=False)
    x = torch.randn(3, 256)
    with torch.no_grad():
        for hint in (1, 2, 8):
            proj = Projection([layer], hint, pack=kernel)
            assert proj.kernel == kernel
            assert torch.equal(proj(x[:1]), proj(x)[:1]), hint
    pol = ModelPolicy("p", PolicyConfig(model="tiny-qwen2", model_kwargs={"hidden_size": 128, "num_layers": 2}),
                      TrainingConfig(bf16=False), AlgorithmConfig(), RolloutConfig(max_new_tokens=10, temperature=1.0),
                      total_optimizer_steps=1, seed=0)
    prompts = [pol.encode_chat([{"role": "user", "content": f"count to {n}"}]) for n in (3, 4, 5)]
    streams = lambda n: [torch.Generator().manual_seed(s) for s in range(n)]   # noqa: E731
    batch = generate(pol.model, pol.tokenizer, prompts, temperature=1.0, max_new_tokens=10, row_generators=streams(3))
    alone = generate(pol.model, pol.tokenizer, prompts[:1], temperature=1.0, max_new_tokens=10,
                     row_generators=streams(1))
    assert alone[0].ids == batch[0].ids and alone[0].logprobs == batch[0].logprobs


def same_logprobs(got, want, exact: bool) -> None:
    for g, w in zip(got, want, strict=True):
        if exact:
            assert g.logprobs == w.logprobs
        else:
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5)


def test_only_frozen_equal_first_layers_are_shared():
    """The trunk ends at the first layer that differs or trains; different embeddings, a model without frozen
    layers, or a single model share none."""
    from accord.generation.fast_decode import shared_trunk

    a, b = _trunk_policies()
    assert shared_trunk([a.model]) == 0
    assert shared_trunk([a.model, b.model]) == 2
    with torch.no_grad():   # in place: the answer kept for these models must not outlive the change
        b.model.model.layers[1].mlp.up_proj.weight[0, 0] += 1e-6
    assert shared_trunk([a.model, b.model]) == 1
    with torch.no_grad():
        b.model.model.layers[1].mlp.up_proj.weight[0, 0] -= 1e-6
        b.model.model.embed_tokens.weight[3, 3] += 1e-6
    assert shared_trunk([a.model, b.model]) == 0
    c, d = _trunk_policies()
    assert shared_trunk([c.model, d.model]) == 2
    d.model.model.layers[0].requires_grad_(True)
    assert shared_trunk([c.model, d.model]) == 0
    d.model.model.layers[0].requires_grad_(False)
    d.model.model.layers[1].mlp.up_proj.weight = torch.nn.Parameter(torch.zeros_like(
        d.model.model.layers[1].mlp.up_proj.weight), requires_grad=False)   # a parameter replaced
    assert shared_trunk([c.model, d.model]) == 1
    e = _trunk_policies(num_heads=2)[0]   # another config (weights of the same shapes): nothing shared
    assert shared_trunk([c.model, e.model]) == 0

"""specialization=lora: one frozen base, one PEFT adapter per policy (tiny models only)."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from accord.config import (
    Config,
    ConfigError,
    PolicyConfig,
    RolloutConfig,
    config_from_dict,
)
from accord.tracking import read_metrics
from accord.models import load_model_and_tokenizer
from accord.policies.agents import generate_by_policy
from accord.policies.lora import LoraPolicy, build_lora_policies
from accord.rollout.sample import Sample
from accord.trainer import Trainer, train

TINY = {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}
FEW = ["q_proj", "v_proj"]  # fewer adapted modules keep the tiny runs fast


def lora_data(tiny_cfg, lora=None, **sections):
    return tiny_cfg(specialization="lora", policies={"pe": dict(TINY), "po": dict(TINY)},
                    agents=[{"name": "e", "policy": "pe"}, {"name": "o", "policy": "po"}],
                    lora={"r": 4, "alpha": 8, "target_modules": FEW, **(lora or {})}, **sections)


def group_policies(mixed=True, max_new_tokens=10, trainable_layers=None, **lora):
    names = ["pe", "po"]
    cfg = Config(specialization="lora", rollout=RolloutConfig(max_new_tokens=max_new_tokens, temperature=1.0),
                 policies={n: PolicyConfig(**TINY, trainable_layers=trainable_layers) for n in names})
    cfg.lora.r, cfg.lora.mixed_generation, cfg.lora.target_modules = 4, mixed, FEW
    for k, v in lora.items():
        setattr(cfg.lora, k, v)
    pols = build_lora_policies(cfg, names, 4, seed=0)
    with torch.no_grad():  # B = 0 at init makes every adapter the base: make them differ
        gen = torch.Generator().manual_seed(1)
        for p in pols.values():
            for k, t in p.named_params.items():
                if "lora_B" in k:
                    t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
    return pols


def chats(n):
    words = ["red", "blue", "green", "gold", "grey", "pink"]
    return [[{"role": "user", "content": f"Name a {words[i % 6]} thing, then {words[(i + 2) % 6]} ones."}]
            for i in range(n)]


def weights(trainer):
    model = next(iter(trainer.policies.values())).model
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# --- config and construction ---------------------------------------------------------------------------

def test_lora_needs_one_base_model(tiny_cfg):
    data = lora_data(tiny_cfg)
    data["policies"]["po"] = {"model": "tiny-llama"}
    with pytest.raises(ConfigError, match="one shared base model.*same model"):
        config_from_dict(data)


def test_lora_runs_on_the_local_backend_only(tiny_cfg):
    data = lora_data(tiny_cfg)
    data["run"]["backend"] = "ray"
    with pytest.raises(ConfigError, match="run.backend=local"):
        config_from_dict(data)


def test_unknown_target_module_names_the_available_ones_before_training(tiny_cfg):
    data = lora_data(tiny_cfg, lora={"target_modules": ["q_proj", "qkv"]})
    data["run"]["eval_before"] = True  # an evaluation would write metrics before the first step
    with pytest.raises(ConfigError, match=r"\['qkv'\] match no module.*'down_proj'.*'q_proj'.*'v_proj'"):
        train(config_from_dict(data))  # the entry point `accord train` uses
    run_dir = Path(data["run"]["run_dir"])
    metrics = run_dir / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text().strip() == ""  # nothing evaluated or trained
    assert not list(run_dir.glob("**/step_*"))  # no checkpoint


def test_one_base_adapters_on_every_projection_base_frozen(tiny_cfg):
    trainer = Trainer(config_from_dict(lora_data(tiny_cfg, lora={"target_modules": None})))
    pe, po = trainer.policies["pe"], trainer.policies["po"]
    assert isinstance(pe, LoraPolicy) and pe.model is po.model and pe.ref_model is None
    assert pe.group.targets == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    ids = {id(p) for p in pe.params}
    assert ids.isdisjoint(id(p) for p in po.params)
    assert {id(p) for g in pe.optimizer.param_groups for p in g["params"]} == ids
    lora_ids = {id(p) for n, p in pe.model.named_parameters() if "lora_" in n}
    assert lora_ids == ids | {id(p) for p in po.params}
    assert not any(p.requires_grad for n, p in pe.model.named_parameters() if "lora_" not in n)


# --- generation: mixed batch == per-adapter --------------------------------------------------------------

def test_mixed_batch_equals_per_adapter_greedy():
    pols = group_policies()
    prompts = {n: [pols[n].encode_chat(c) for c in chats(5)] for n in pols}
    mixed = generate_by_policy(pols, prompts, greedy=True, temperature=1.0)
    pols["pe"].group.lora.mixed_generation = False
    single = generate_by_policy(pols, prompts, greedy=True, temperature=1.0)
    for n in pols:
        assert [g.ids for g in mixed[n]] == [g.ids for g in single[n]]
        for a, b in zip(mixed[n], single[n]):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert [g.ids for g in mixed["pe"]] != [g.ids for g in mixed["po"]]  # the adapters do differ


def test_mixed_batch_equals_per_adapter_with_the_same_sampling_stream():
    """One mixed call over [pe x n, po x n] draws, at each step, one uniform per row; each adapter
    alone over the same batch shape from the same stream state draws the same numbers, so its rows
    must come out token for token the same."""
    pols = group_policies(max_new_tokens=12)
    group = pols["pe"].group
    p = [pols["pe"].encode_chat(c) for c in chats(4)]
    for pol in pols.values():
        pol.seed_stream("s", 123)  # the group's stream "s" takes the first adapter's seed
    mixed = group.generate_mixed({"pe": p, "po": p}, greedy=False, temperature=1.0, stream="s")
    alone = {}
    for n, rows in (("pe", slice(0, 4)), ("po", slice(4, 8))):
        pols[n].seed_stream("s", 123)
        alone[n] = pols[n].generate(p + p, greedy=False, temperature=1.0, stream="s")[rows]
    for n in pols:
        assert [g.ids for g in mixed[n]] == [g.ids for g in alone[n]]
        for a, b in zip(mixed[n], alone[n]):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert len({tuple(g.ids) for g in mixed["pe"]}) > 1  # sampled, not all the same


@pytest.mark.parametrize("targets,trainable_layers", [(FEW, None), (None, None), (None, 1)],
                         ids=["q_v", "every projection", "the last block's projections"])
def test_direct_decoding_step_with_adapters_matches_peft_forward(targets, trainable_layers, monkeypatch):
    """Mixed-adapter generation through accord's direct decoding step (each row's adapter applied by a
    mask over the stacked LoRA factors), with the prompts' shared prefixes prefilled once per adapter or
    not, draws the tokens of the loop through PEFT's forward with ``adapter_names``, from the same stream,
    log-probs within 1e-5."""
    import accord.generation.fast_decode as fast_decode
    import accord.generation.hf as hf

    pols = group_policies(max_new_tokens=12, target_modules=targets, trainable_layers=trainable_layers)
    group = pols["pe"].group
    adapted = {k.split(".layers.")[1].split(".")[0] for k in pols["pe"].named_params}
    assert adapted == ({"1"} if trainable_layers == 1 else {"0", "1"}), adapted
    assert hf.unsupported_reason(group.model) is None
    p = [pols["pe"].encode_chat(c) for c in chats(3)]
    assert fast_decode.prefix_tree(p, min_tokens=2)[0].children  # the chats share a prefix worth a pass
    runs = {}
    for path in ("direct", "shared prefixes", "forward"):
        if path == "shared prefixes":
            monkeypatch.setattr(fast_decode, "SHARE_MIN_TOKENS", 2)
        if path == "forward":
            monkeypatch.setattr(hf, "unsupported_reason", lambda model: "the forward, for comparison")
        for pol in pols.values():
            pol.seed_stream("s", 7)
        runs[path] = group.generate_mixed({"pe": p + p[:1], "po": p}, greedy=False, temperature=1.0, stream="s")
    for n in pols:
        for path in ("direct", "shared prefixes"):
            assert [g.ids for g in runs[path][n]] == [g.ids for g in runs["forward"][n]]
            for a, b in zip(runs[path][n], runs["forward"][n]):
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert [g.ids for g in runs["direct"]["pe"][:3]] != [g.ids for g in runs["direct"]["po"]]  # adapters differ


# --- update and KL reference ---------------------------------------------------------------------------

def test_kl_reference_is_the_base_with_adapters_disabled():
    pols = group_policies()
    pe = pols["pe"]
    base, _ = load_model_and_tokenizer(TINY["model"], model_kwargs=TINY["model_kwargs"], seed=0)
    prompt = pe.encode_chat(chats(1)[0])
    batch = [Sample("e", "pe", 0, 0, 0, prompt, [5, 9, 12, 2], [0.0] * 4, "stop"),
             Sample("e", "pe", 0, 0, 0, prompt[3:], [7, 2], [0.0] * 2, "stop")]
    ref = pe._reference_logprobs(batch)
    expected, _, _ = pe._forward_completion(base.eval(), batch, want_entropy=False)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-6)
    with torch.no_grad():
        adapted, _, mask = pe._forward_completion(pe.model, batch, want_entropy=False)
    assert not torch.allclose(adapted[mask], ref[mask])
    assert pe.model.training  # the reference forward restores the mode


def test_update_trains_each_adapter_and_never_the_base(tiny_cfg):
    """(with one generate call per adapter: the trainer's other generation path)"""
    trainer = Trainer(config_from_dict(lora_data(tiny_cfg, run={"steps": 2}, lora={"mixed_generation": False},
                                                 algorithm={"num_generations": 4, "kl_coef": 0.1})))
    before = weights(trainer)
    trainer.train()
    after = weights(trainer)
    base = [k for k in before if "lora_" not in k]
    assert base and all(torch.equal(before[k], after[k]) for k in base), "a base parameter changed"
    adapters = [k for k in before if "lora_" in k]
    unchanged = [k for k in adapters if torch.equal(before[k], after[k])]
    assert not unchanged, f"adapter parameters not updated: {unchanged}"
    rec = read_metrics(trainer.run_dir)[-1]
    assert rec["loss/pe/kl"] > 0 and rec["loss/po/kl"] > 0


def test_an_adapter_update_touches_only_its_adapter():
    pols = group_policies()
    pe = pols["pe"]
    prompt = pe.encode_chat(chats(1)[0])
    gens = pe.generate([prompt] * 4, greedy=False, temperature=1.0)
    samples = [Sample("e", "pe", 0, 0, 0, prompt, g.ids, g.logprobs, g.finish_reason, advantage=a)
               for g, a in zip(gens, [1.0, -1.0, 0.5, -0.5])]
    snap = {k: v.detach().clone() for k, v in pe.model.named_parameters()}
    pe.update(samples, 0)
    changed = {k for k, v in pe.model.named_parameters() if not torch.equal(v, snap[k])}
    mine = {n for n, p in pe.model.named_parameters() if any(p is q for q in pe.params)}
    assert changed and changed <= mine


# --- state ---------------------------------------------------------------------------------------------

def test_lora_resume_is_exact(tiny_cfg, tmp_path):
    _check_lora_resume(tiny_cfg, tmp_path, "cpu")


@pytest.mark.gpu
def test_lora_resume_is_exact_on_a_gpu(tiny_cfg, tmp_path):
    """LoRA dropout on a GPU draws from CUDA's default generator: the checkpoint restores it."""
    _check_lora_resume(tiny_cfg, tmp_path, "cuda")


def _check_lora_resume(tiny_cfg, tmp_path, device):
    common = {"lora": {"dropout": 0.1},
              "algorithm": {"num_generations": 3, "kl_coef": 0.1, "ppo_epochs": 2},
              "rollout": {"batch_size": 2, "max_new_tokens": 6, "temperature": 1.0},
              "training": {"lr": 1e-2, "micro_batch_size": 5, "schedule": "cosine", "warmup_steps": 1}}
    full = Trainer(config_from_dict(lora_data(tiny_cfg, run={"steps": 3, "run_dir": str(tmp_path / "a"),
                                                             "device": device}, **common)))
    full.train()
    cfg_b = lora_data(tiny_cfg, run={"steps": 3, "run_dir": str(tmp_path / "b"), "checkpoint_every": 2,
                                     "device": device}, **common)
    Trainer(config_from_dict(cfg_b)).train(stop_after=2)
    ckpt = tmp_path / "b" / "checkpoints" / "step_000002" / "policies" / "pe"
    assert (ckpt / "adapter.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    resumed = Trainer(config_from_dict(cfg_b), resume=True)
    assert resumed.start_step == 2
    resumed.train()
    a, b = weights(full), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["team/reward"] for r in ra] == [r["team/reward"] for r in rb]
    assert [r["loss/po/pg"] for r in ra] == [r["loss/po/pg"] for r in rb]


def test_save_load_restores_adapter_optimizer_and_streams(tmp_path):
    pols = group_policies(max_new_tokens=6)
    prompts = {n: [pols[n].encode_chat(c) for c in chats(3)] for n in pols}
    for n, pol in pols.items():
        pol.save(tmp_path / n)
    def ids(gens):
        return {n: [g.ids for g in v] for n, v in gens.items()}

    first = {}
    for mixed in (True, False):
        pols["pe"].group.lora.mixed_generation = mixed
        first[mixed] = ids(generate_by_policy(pols, prompts, greedy=False, temperature=1.0))
    with torch.no_grad():
        for pol in pols.values():
            for p in pol.params:
                p.add_(1.0)
    for n, pol in pols.items():
        pol.load(tmp_path / n)
    for mixed, before in first.items():  # the same weights and streams: the same samples on both paths
        pols["pe"].group.lora.mixed_generation = mixed
        assert ids(generate_by_policy(pols, prompts, greedy=False, temperature=1.0)) == before


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")  # PEFT asks transformers 5
def test_export_is_a_peft_adapter(tmp_path):
    from peft import PeftModel

    pols = group_policies()
    pols["po"].export(tmp_path / "po")
    assert (tmp_path / "po" / "adapter_config.json").is_file()
    assert (tmp_path / "po" / "adapter_model.safetensors").is_file()
    base, _ = load_model_and_tokenizer(TINY["model"], model_kwargs=TINY["model_kwargs"], seed=0)
    loaded = PeftModel.from_pretrained(base, tmp_path / "po").eval()
    ids = torch.tensor([pols["po"].encode_chat(chats(1)[0])])
    pols["po"].group.activate("po")
    model = pols["po"].model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=1e-5)
    model.train()


def test_example_config_loads():
    from pathlib import Path

    from accord.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "atgrpo_planpath_lora.yaml")
    assert cfg.specialization == "lora" and len(cfg.policies) == 2


@pytest.mark.slow
def test_heterogeneous_separate_policies_smollm2_and_tiny_qwen2(tiny_cfg):
    """Agents on different architectures and tokenizers in one run, each with its own chat template
    and optimizer: SmolLM2-135M (Llama, 49k vocab) and a tiny Qwen2 (2k vocab)."""
    from accord.config import config_from_dict
    from accord.trainer import Trainer

    data = tiny_cfg(specialization="separate", algorithm={"num_generations": 2},
                    rollout={"batch_size": 1, "max_new_tokens": 4})
    data["policies"] = {"big": {"model": "smollm2-135m"},
                        "small": {"model": "tiny-qwen2", "model_kwargs": {"hidden_size": 64, "num_layers": 2}}}
    data["agents"] = [{"name": "e", "policy": "big"}, {"name": "o", "policy": "small"}]
    trainer = Trainer(config_from_dict(data))
    big, small = trainer.policies["big"], trainer.policies["small"]
    assert type(big.model).__name__ != type(small.model).__name__
    assert len(big.tokenizer) != len(small.tokenizer)
    msgs = [{"role": "user", "content": "hi"}]
    assert big.encode_chat(msgs) != small.encode_chat(msgs)    # each policy's own chat template and vocabulary
    before = {n: [p.detach().clone() for p in pol.model.parameters()][:3] for n, pol in trainer.policies.items()}
    metrics, table = trainer.train_step(0)
    assert {"loss/big/pg", "loss/small/pg"} <= set(metrics)
    assert big.optimizer is not small.optimizer
    for n, pol in trainer.policies.items():
        assert any(not torch.equal(a, b) for a, b in zip(before[n], list(pol.model.parameters())[:3]))
    assert {r["agent"] for r in table} == {"e", "o"}


@pytest.mark.slow
def test_resuming_with_another_specialization_names_the_config_not_a_corruption(tiny_cfg, tmp_path):
    """A run of whole models resumed with specialization=lora (or the reverse) met intact checkpoints whose files
    are another kind's: each was called "incomplete or corrupted" and the last line advised --overwrite, which
    deletes a healthy run. Now one line says the settings differ from the run's."""
    separate = tiny_cfg(specialization="separate", policies={"pe": dict(TINY), "po": dict(TINY)},
                        agents=[{"name": "e", "policy": "pe"}, {"name": "o", "policy": "po"}],
                        run={"steps": 1, "run_dir": str(tmp_path / "whole"), "checkpoint_every": 1})
    lora = lora_data(tiny_cfg, run={"steps": 1, "run_dir": str(tmp_path / "lora"), "checkpoint_every": 1})
    for data, other in ((separate, "lora"), (lora, "separate")):
        Trainer(config_from_dict(data)).train()
        data = dict(data, specialization=other, run={**data["run"], "steps": 2})
        if other == "lora":
            data["lora"] = {"r": 4, "alpha": 8, "target_modules": FEW}
        else:
            data.pop("lora")
        with pytest.raises(ConfigError, match=r"--resume changes specialization from '(separate|lora)' to "
                           r"'(lora|separate)', but the checkpoints of .* hold a run laid out by the first; resume "
                           r"without that change") as err:
            Trainer(config_from_dict(data), resume=True)
        assert "corrupted" not in str(err.value) and "--overwrite" not in str(err.value)

"""Tests for the MAGRPO collaborative writing task (accord.envs.writing.core)."""

from __future__ import annotations

import json
import logging
import sys
import types
from itertools import combinations
from pathlib import Path

import pytest

from accord import data
from accord.data import DataFileError
from accord.envs.writing import core as writing
from accord.envs.writing.core import (
    ARXIV_AGENTS,
    TLDR_AGENTS,
    TRANSITION_CATEGORIES,
    WritingDataUnavailable,
    content_jaccard,
    load_writing_rows,
    transition_categories,
    transition_score,
    writing_prompt,
    writing_reward_levels,
    writing_team_reward,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tldr_sample.jsonl"
ATTAINABLE_MAX = 0.5 + 1.0 + 0.5 + (0.4 * 0.95 + 0.6)  # 2.98, see module docstring


def words(n: int, prefix: str = "w", distinct: int | None = None) -> str:
    """n whitespace tokens; the first `distinct` are distinct, the rest repeat token 0."""
    distinct = n if distinct is None else distinct
    return " ".join(f"{prefix}{i if i < distinct else 0}" for i in range(n))


# Twelve categories, one marker each, plus 16 more distinct content words (35 tokens).
MAX_TEXT1 = "The storm damaged roads and bridges across the northern valley yesterday."
MAX_TEXT2 = (
    "First, the storm damaged roads; however, old bridges also held because crews worked nightly. "
    "Therefore, for example, indeed, similarly, overall, in other words, although repairs continue, "
    "travel resumes if weather allows."
)


# ----------------------------------------------------------------- level 1


@pytest.mark.parametrize("n1,n2", [(7, 20), (10, 7), (0, 20), (100, 257), (257, 300)])
def test_l1_out_of_range_gives_zero(n1, n2):
    assert writing_reward_levels(words(n1), words(n2, "v")) == {
        "l1": 0.0, "l2": 0.0, "l3": 0.0, "l4": 0.0, "total": 0.0,
    }


def test_l1_bounds_inclusive():
    assert writing_reward_levels(words(8), words(16, "v"))["l1"] == 0.5
    assert writing_reward_levels(words(128), words(256, "v"))["l1"] == 0.5


# ----------------------------------------------------------------- level 2


def test_l2_ratio_two_is_full():
    levels = writing_reward_levels(words(10), words(20, "v"))
    assert levels["l2"] == 1.0


@pytest.mark.parametrize("n1,n2,expected", [
    (20, 27, 0.5),   # 1.35: midpoint of the 1.1 -> 1.6 ramp
    (20, 32, 1.0),   # 1.6: start of the plateau
    (10, 32, 1.0),   # 3.2: end of the plateau
    (10, 41, 0.5),   # 4.1: midpoint of the 3.2 -> 5.0 ramp
    (10, 50, 0.0),   # 5.0: end of the ramp
    (10, 60, 0.0),   # beyond
    (20, 22, 0.0),   # 1.1: start of the ramp
    (10, 10, 0.0),   # equal lengths
])
def test_l2_ramps(n1, n2, expected):
    assert writing_reward_levels(words(n1), words(n2, "v"))["l2"] == pytest.approx(expected)


def test_l2_zero_stops_the_sum():
    # Same length, lots of transition words and shared words: L3/L4 still 0.
    levels = writing_reward_levels(MAX_TEXT2, MAX_TEXT2)
    assert levels == {"l1": 0.5, "l2": 0.0, "l3": 0.0, "l4": 0.0, "total": 0.5}


def test_l2_partial_credit_proceeds():
    levels = writing_reward_levels(words(20), words(27, "v"))  # L2 = 0.5, u-ratio 1.35
    assert levels["l2"] == pytest.approx(0.5)
    assert levels["l3"] > 0.0


# ----------------------------------------------------------------- level 3


@pytest.mark.parametrize("distinct2,expected", [
    (40, 0.5),    # u-ratio 2.0
    (33, 0.25),   # u-ratio 1.65: ramp midpoint -> half of 0.5
    (26, 0.0),    # u-ratio 1.3: ramp start
    (20, 0.0),    # u-ratio 1.0
])
def test_l3_unique_ratio(distinct2, expected):
    # 20 vs 40 tokens keeps L2 at 1.0 while the number of distinct words varies.
    levels = writing_reward_levels(words(20), words(40, "v", distinct=distinct2))
    assert levels["l2"] == 1.0
    assert levels["l3"] == pytest.approx(expected)


def test_l3_zero_stops_before_l4():
    text2 = MAX_TEXT1 + " " + MAX_TEXT1  # ratio 2 but no new vocabulary, shares all words
    levels = writing_reward_levels(MAX_TEXT1, text2)
    assert levels["l2"] == 1.0
    assert levels["l3"] == 0.0 and levels["l4"] == 0.0
    assert levels["total"] == 1.5


def test_unique_words_are_case_and_punctuation_insensitive():
    t1 = "Alpha beta gamma delta epsilon zeta eta theta"
    t2 = "ALPHA, Beta! gamma? delta. epsilon; zeta: eta theta " * 2
    levels = writing_reward_levels(t1, t2)
    assert levels["l2"] == 1.0 and levels["l3"] == 0.0  # u-ratio 1.0


# ----------------------------------------------------------------- level 4


def test_transition_categories_counting():
    assert transition_categories("plain words only here") == set()
    assert transition_score("plain words only here") == 0.0
    assert transition_categories("However, this failed.") == {"contrast"}
    assert transition_score("However, this failed.") == pytest.approx(0.4)
    text = "However it rained; for example, the roads flooded. Therefore we stayed in."
    assert transition_categories(text) == {"contrast", "example", "result"}
    assert transition_score(text) == pytest.approx(0.5)
    # Several markers of one category count once.
    assert transition_score("however, in contrast, by contrast, whereas") == pytest.approx(0.4)


def test_transition_matching_uses_whole_words():
    # "if" inside "different", "then" inside "strengthen", "also" inside "falsely".
    assert transition_categories("a different strengthen falsely thusly") == set()
    assert transition_categories("Even though it rained") == {"concession"}
    assert transition_categories("In   FACT,  it works") == {"emphasis"}


def test_transition_score_maxes_at_twelve_categories():
    assert len(TRANSITION_CATEGORIES) == 12
    assert transition_categories(MAX_TEXT2) == set(TRANSITION_CATEGORIES)
    assert transition_score(MAX_TEXT2) == pytest.approx(0.95)


def test_transition_phrases_belong_to_one_category():
    for a, b in combinations(TRANSITION_CATEGORIES, 2):
        assert not set(TRANSITION_CATEGORIES[a]) & set(TRANSITION_CATEGORIES[b]), (a, b)


def test_jaccard_ignores_stop_words():
    assert content_jaccard("the cat and the dog", "a cat or a bird") == pytest.approx(1 / 3)
    assert content_jaccard("the and of", "a an the") == 0.0


def test_l4_jaccard_cap():
    # 10 distinct words vs 20: L2 = 1 and L3 = 0.5; no transitions in text2.
    t1 = words(10)
    disjoint = words(20, "v")
    assert writing_reward_levels(t1, disjoint)["l4"] == 0.0
    # Sharing w0 gives J = 1/29 > 0.03: capped, full 0.6.
    one_shared = "w0 " + words(19, "v")
    assert content_jaccard(t1, one_shared) == pytest.approx(1 / 29)
    assert writing_reward_levels(t1, one_shared)["l4"] == pytest.approx(0.6)
    # Sharing more words gives no more credit.
    many_shared = words(5) + " " + words(15, "v")
    assert writing_reward_levels(t1, many_shared)["l4"] == pytest.approx(0.6)
    # J = 1/67 (about 0.015, half the cap) gives half of 0.6.
    t1_long = words(20)
    t2_long = "w0 " + words(47, "v")
    assert content_jaccard(t1_long, t2_long) == pytest.approx(1 / 67)
    assert writing_reward_levels(t1_long, t2_long)["l4"] == pytest.approx(0.6 * (1 / 67) / 0.03)


def test_l4_combines_transition_and_jaccard():
    t1 = words(10)
    t2 = "however w0 " + words(18, "v")  # 1 category, J above the cap
    assert writing_reward_levels(t1, t2)["l4"] == pytest.approx(0.4 * 0.4 + 0.6)


# ----------------------------------------------------------------- totals


def test_crafted_pair_reaches_the_maximum():
    levels = writing_reward_levels(MAX_TEXT1, MAX_TEXT2)
    assert levels["l1"] == 0.5
    assert levels["l2"] == 1.0
    assert levels["l3"] == 0.5
    assert levels["l4"] == pytest.approx(0.4 * 0.95 + 0.6)
    assert levels["total"] == pytest.approx(ATTAINABLE_MAX)
    assert levels["total"] <= writing.REWARD_MAX


def test_the_reward_does_not_need_language():
    """What the docstring warns of: a word repeated against that word and a list of transition words scores 2.96
    of the 2.98 reachable, NUL characters 1.5 (the reward is lexical; the text's meaning never enters it)."""
    salad = ("zebra however because for example therefore similarly in conclusion in other words if although "
             "first moreover q1 q2 q3 q4 q5")
    levels = writing_reward_levels(" ".join(["zebra"] * 8), salad)
    assert (levels["l1"], levels["l2"], levels["l3"]) == (0.5, 1.0, 0.5)
    assert levels["total"] == pytest.approx(2.96)
    assert writing_reward_levels("\x00 " * 10, "\x00 " * 30)["total"] == pytest.approx(1.5)


def test_total_is_sum_of_levels():
    for t1, t2 in [(words(20), words(27, "v")), (MAX_TEXT1, MAX_TEXT2), (words(10), words(40, "v", 13))]:
        levels = writing_reward_levels(t1, t2)
        assert levels["total"] == pytest.approx(sum(levels[k] for k in ("l1", "l2", "l3", "l4")))


def arxiv_pair() -> tuple[str, str]:
    # 140 vs 200 tokens (ratio 1.43), 140 vs 150 distinct words (ratio 1.07).
    text1 = "results " + words(139, "a")
    markers = (
        "first however also because therefore for example indeed similarly overall "
        "in other words although if"
    )
    # The body reuses agent 1's words, so the content overlap is far above the cap.
    body = words(200 - 1 - len(markers.split()), "a", distinct=150 - 1 - len(markers.split()))
    return text1, f"results {markers} {body}"


def test_arxiv_variant_levels():
    text1, text2 = arxiv_pair()
    assert len(text1.split()) == 140 and len(text2.split()) == 200
    levels = writing_reward_levels(text1, text2, "arxiv")
    assert levels["l1"] == 0.5 and levels["l2"] == 1.0 and levels["l3"] == 0.5
    assert levels["total"] == pytest.approx(ATTAINABLE_MAX)


@pytest.mark.parametrize("n1,n2,expected", [
    (150, 150, 0.4),   # ratio 1.0 on the 0.8 -> 1.3 ramp
    (130, 234, 0.5),   # ratio 1.8 on the 1.6 -> 2.0 ramp
])
def test_arxiv_l2_ramps(n1, n2, expected):
    assert writing_reward_levels(words(n1), words(n2, "v"), "arxiv")["l2"] == pytest.approx(expected)


@pytest.mark.parametrize("distinct2,expected", [
    (84, 0.25),    # u-ratio 0.6 on the 0.5 -> 0.7 ramp
    (210, 0.25),   # u-ratio 1.5 on the 1.3 -> 1.7 ramp
    (70, 0.0),     # u-ratio 0.5
])
def test_arxiv_l3_ramps(distinct2, expected):
    levels = writing_reward_levels(words(140), words(210, "v", distinct=distinct2), "arxiv")
    assert levels["l2"] == 1.0
    assert levels["l3"] == pytest.approx(expected)


def test_variants_differ():
    tldr_levels = writing_reward_levels(MAX_TEXT1, MAX_TEXT2, "tldr")
    arxiv_levels = writing_reward_levels(MAX_TEXT1, MAX_TEXT2, "arxiv")
    assert tldr_levels["total"] == pytest.approx(ATTAINABLE_MAX)
    assert arxiv_levels["total"] == 0.0  # too short for arXiv's 128-token floor
    text1, text2 = arxiv_pair()
    # Fine for arXiv, but for TL;DR the 1.43 length ratio is on the ramp and
    # the 1.07 unique ratio is below 1.3.
    tldr_total = writing_reward_levels(text1, text2, "tldr")["total"]
    assert tldr_total < writing_reward_levels(text1, text2, "arxiv")["total"]


def test_unknown_variant_and_bad_types():
    with pytest.raises(ValueError, match="tldr"):
        writing_reward_levels("a", "b", "poetry")
    with pytest.raises(TypeError, match="str"):
        writing_reward_levels(None, "b")  # type: ignore[arg-type]


# ----------------------------------------------------------------- batch


def test_team_reward_batch_length_and_order():
    pairs = [(MAX_TEXT1, MAX_TEXT2), (words(3), words(3)), (words(20), words(27, "v"))]
    completions = {"concise": [p[0] for p in pairs], "detailed": [p[1] for p in pairs]}
    rewards = writing_team_reward(prompts=["p"] * 3, completions=completions, agents=TLDR_AGENTS)
    assert len(rewards) == 3
    assert rewards == [writing_reward_levels(a, b)["total"] for a, b in pairs]
    assert rewards[0] > rewards[2] > rewards[1] == 0.0
    # Agent order decides who is agent 1.
    swapped = writing_team_reward(completions=completions, agents=("detailed", "concise"))
    assert swapped[0] == writing_reward_levels(MAX_TEXT2, MAX_TEXT1)["total"] != rewards[0]


def test_team_reward_accepts_chat_completions_and_extra_kwargs():
    completions = {
        "a": [[{"role": "assistant", "content": MAX_TEXT1}]],
        "b": [[{"role": "assistant", "content": MAX_TEXT2}]],
    }
    rewards = writing_team_reward(completions=completions, agents=("a", "b"), trainer_state=None)
    assert rewards == [pytest.approx(ATTAINABLE_MAX)]


def test_team_reward_arxiv_and_empty():
    text1, text2 = arxiv_pair()
    completions = {"background": [text1], "methods": [text2]}
    assert writing_team_reward(completions=completions, agents=ARXIV_AGENTS, variant="arxiv") == [
        pytest.approx(ATTAINABLE_MAX)
    ]
    assert writing_team_reward(completions={"concise": [], "detailed": []}, agents=TLDR_AGENTS) == []


def test_team_reward_errors():
    with pytest.raises(ValueError, match="completion"):
        writing_team_reward(completions={"concise": ["x"], "detailed": []}, agents=TLDR_AGENTS)
    with pytest.raises(KeyError, match="detailed"):
        writing_team_reward(completions={"concise": ["x"]}, agents=TLDR_AGENTS)
    with pytest.raises(ValueError, match="2 agents"):
        writing_team_reward(completions={"a": ["x"]}, agents=("a",))


# ----------------------------------------------------------------- data


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """No test may reach the Hub: the reachability probe always says no."""
    monkeypatch.setattr(data, "hub_reachable", lambda *a, **k: False)


@pytest.mark.parametrize("variant", ["tldr", "arxiv"])
def test_offline_rows_enough_deterministic_disjoint(variant):
    train = load_writing_rows(variant, "train", source="offline")
    evals = load_writing_rows(variant, "eval", source="offline")
    assert len(train) >= 300 and len(evals) >= 100
    for row in train + evals:
        assert isinstance(row["id"], str) and row["id"]
        assert 40 <= len(row["text"].split()) <= 200
        assert row["source"] == "offline"
    assert {r["id"] for r in train}.isdisjoint({r["id"] for r in evals})
    assert {r["text"] for r in train}.isdisjoint({r["text"] for r in evals})
    assert len({r["id"] for r in train}) == len(train)
    # Deterministic for a seed; another seed reorders the same rows.
    assert load_writing_rows(variant, "train", source="offline") == train
    other = load_writing_rows(variant, "train", source="offline", seed=1)
    assert [r["id"] for r in other] != [r["id"] for r in train]
    assert sorted(r["id"] for r in other) == sorted(r["id"] for r in train)


def test_offline_limit():
    rows = load_writing_rows("tldr", "eval", source="offline", limit=7, seed=3)
    assert len(rows) == 7
    assert rows == load_writing_rows("tldr", "eval", source="offline", seed=3)[:7]
    assert load_writing_rows("tldr", "eval", source="offline", limit=0) == []


def test_offline_texts_are_prose():
    rows = load_writing_rows("tldr", "train", source="offline")
    for row in rows:
        assert ">>>" not in row["text"] and "::=" not in row["text"]
        assert not row["text"].endswith(":")


def test_data_files_tldr_fixture():
    records = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    assert len(records) == 6
    train = load_writing_rows("tldr", "train", data_files=str(FIXTURE))
    evals = load_writing_rows("tldr", "eval", data_files=str(FIXTURE))
    assert len(train) + len(evals) == 6
    assert {r["id"] for r in train}.isdisjoint({r["id"] for r in evals})
    for row in train + evals:
        assert row["source"] == "data_files"
        for marker in ("SUBREDDIT:", "TITLE:", "POST:", "TL;DR:"):
            assert marker not in row["text"]
        assert row["title"] and row["reference"]
    by_title = {r["title"]: r for r in train + evals}
    row = by_title["Why does my homemade bread come out dense every time?"]
    assert row["text"].startswith("I have baked about ten loaves")
    assert row["reference"].startswith("My bread is always dense")


def test_record_to_row_is_shared_conversion():
    record = {
        "prompt": "SUBREDDIT: r/test\n\nTITLE: A title\n\nPOST: Body line one.\n\nLine two.\n\nTL;DR:",
        "completion": " short",
    }
    row = writing.record_to_row("tldr", record)
    assert row["text"] == "Body line one.\n\nLine two."
    assert row["title"] == "A title" and row["reference"] == "short"
    # Without scaffolding the prompt is kept (minus a trailing TL;DR cue).
    assert writing.record_to_row("tldr", {"prompt": "Just a post. TL;DR:"})["text"] == "Just a post."
    assert writing.record_to_row("tldr", {"other": 1}) is None
    assert writing.record_to_row("arxiv", {"abstract": "  We  study\nthings. "})["text"] == "We study things."


def test_data_files_arxiv_json(tmp_path):
    path = tmp_path / "abstracts.json"
    records = [
        {"title": f"Paper {i}", "abstract": f"Abstract number {i} about topic {i}."} for i in range(20)
    ]
    path.write_text(json.dumps(records))
    train = load_writing_rows("arxiv", "train", data_files=str(path))
    evals = load_writing_rows("arxiv", "eval", data_files=str(path))
    assert len(train) + len(evals) == 20 and train and evals
    assert {r["text"] for r in train}.isdisjoint({r["text"] for r in evals})


def test_data_files_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_files"):
        load_writing_rows("tldr", "train", data_files=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2: not valid JSON"):
        load_writing_rows("tldr", "train", data_files=str(bad))
    # a file a user wrote loses no record silently: each bad record is named with the keys a record needs
    good = '{"prompt": "POST: a post about bread\\nTL;DR:", "completion": " bread"}\n'
    for record, message in [('[1, 2]', "record 2 holds list, not an object"),
                            ('{"body": "x", "summary": "y"}', r"record 2 has no text \(its keys: \['body', 'summary'\]\)"),
                            ('{"prompt": "POST: hi there\\nTL;DR:", "completion": 7}', "record 2: 'completion' holds int"),
                            ('{"prompt": "SUBREDDIT: r/x\\nTITLE: t\\nPOST: \\nTL;DR:"}', "record 2: its text is empty")]:
        bad.write_text(good + record + "\n")
        with pytest.raises(DataFileError, match=message):
            load_writing_rows("tldr", "train", data_files=str(bad))
    for raw, message in [(b"\xef\xbb\xbf" + good.encode(), None),   # a byte-order mark is not text: read as without
                         (good.encode() + b'{"prompt": "caf\xe9"}\n', "line 2 is not UTF-8 text"),
                         (b"[" * 100000 + b"]" * 100000 + b"\n", "nested too deeply"),
                         (good.encode() + b'{"prompt": "x \\ud800 y"}\n', "lone surrogate"),
                         # nested 600 deep (the parser takes it) with an escape: the recursive surrogate search hit the
                         # recursion limit (a RecursionError out of the reader)
                         (b"[" * 600 + b'"\\u0041"' + b"]" * 600 + b"\n", "record 1 holds list"),
                         (b"[" * 600 + b'"\\ud800"' + b"]" * 600 + b"\n", "lone surrogate")]:
        bad.write_bytes(raw)
        if message is None:
            assert load_writing_rows("tldr", "train", data_files=str(bad)) + load_writing_rows(
                "tldr", "eval", data_files=str(bad))
            continue
        with pytest.raises(DataFileError, match=message):
            load_writing_rows("tldr", "train", data_files=str(bad))
    # U+2028 is text inside a JSON string, not a line break
    bad.write_text('{"prompt": "POST: a\u2028b and more words\\nTL;DR:", "completion": "c"}\n' + good, encoding="utf-8")
    rows = load_writing_rows("tldr", "train", data_files=str(bad)) + load_writing_rows("tldr", "eval",
                                                                                         data_files=str(bad))
    assert len(rows) == 2
    with pytest.raises(ValueError, match="conflict"):
        load_writing_rows("tldr", "train", source="offline", data_files=str(FIXTURE))


def test_hub_offline_env_gives_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WritingDataUnavailable, match="offline") as info:
        load_writing_rows("tldr", "train", source="hub")
    assert "source='offline'" in str(info.value)
    assert "trl-lib/tldr" in str(info.value)


def test_hub_without_datasets_names_the_install(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    real_find_spec = data.importlib.util.find_spec
    monkeypatch.setattr(
        data.importlib.util, "find_spec",
        lambda name, *a: None if name == "datasets" else real_find_spec(name, *a),
    )
    with pytest.raises(WritingDataUnavailable, match="pip install datasets") as info:
        load_writing_rows("arxiv", "eval", source="hub")
    assert "offline" in str(info.value)


def test_hub_unreachable_error(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(WritingDataUnavailable, match="did not answer"):
        load_writing_rows("tldr", "train", source="hub")


def _fake_hub(monkeypatch, splits=None, error=None):
    """Make the Hub path usable without a network: a stand-in `datasets` module."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(data, "hub_reachable", lambda *a, **k: True)
    real_find_spec = data.importlib.util.find_spec
    monkeypatch.setattr(
        data.importlib.util, "find_spec",
        lambda name, *a: object() if name == "datasets" else real_find_spec(name, *a),
    )
    calls = []

    def load_dataset(name, *args, **kwargs):
        calls.append(name)
        if error is not None:
            raise error
        return splits

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def _tldr_record(i: int) -> dict:
    return {
        "prompt": f"SUBREDDIT: r/test\n\nTITLE: Title {i}\n\nPOST: Post body number {i}.\n\nTL;DR:",
        "completion": f" summary {i}",
    }


def test_hub_splits_are_used_and_decontaminated(monkeypatch):
    train = [_tldr_record(i) for i in range(10)]
    test = [_tldr_record(i) for i in range(8, 14)]  # 8 and 9 also occur in train
    calls = _fake_hub(monkeypatch, {"train": train, "validation": [], "test": test})
    train_rows = load_writing_rows("tldr", "train", source="hub")
    eval_rows = load_writing_rows("tldr", "eval", source="hub")
    assert calls == ["trl-lib/tldr", "trl-lib/tldr"]
    assert len(train_rows) == 10 and len(eval_rows) == 4
    assert {r["id"] for r in train_rows}.isdisjoint({r["id"] for r in eval_rows})
    assert {r["text"] for r in eval_rows} == {f"Post body number {i}." for i in range(10, 14)}
    assert all(r["source"] == "hub" for r in train_rows + eval_rows)
    # The Hub and data_files paths share one conversion.
    assert sorted(train_rows, key=lambda r: r["id"])[0]["title"].startswith("Title")


def test_hub_single_split_is_hash_split(monkeypatch):
    records = [{"abstract": f"Abstract {i} studies question {i}."} for i in range(40)]
    calls = _fake_hub(monkeypatch, {"train": records})
    train_rows = load_writing_rows("arxiv", "train", source="hub")
    eval_rows = load_writing_rows("arxiv", "eval", source="hub")
    assert calls[0] == "OpenMLRL/arXiv_abstract"
    assert len(train_rows) + len(eval_rows) == 40 and train_rows and eval_rows
    assert {r["id"] for r in train_rows}.isdisjoint({r["id"] for r in eval_rows})


def test_hub_load_failure(monkeypatch, caplog):
    _fake_hub(monkeypatch, error=ConnectionError("connection reset"))
    with pytest.raises(WritingDataUnavailable, match="connection reset"):
        load_writing_rows("tldr", "train", source="hub")
    with caplog.at_level(logging.WARNING, logger="accord.envs.writing.core"):
        rows = load_writing_rows("tldr", "train", limit=3)  # auto falls back
    assert [r["source"] for r in rows] == ["offline"] * 3
    assert any("falling back" in rec.getMessage() for rec in caplog.records)


def test_auto_uses_hub_when_usable(monkeypatch, caplog):
    _fake_hub(monkeypatch, {"train": [_tldr_record(i) for i in range(5)], "test": [_tldr_record(9)]})
    with caplog.at_level(logging.INFO, logger="accord.envs.writing.core"):
        rows = load_writing_rows("tldr", "eval")
    assert [r["text"] for r in rows] == ["Post body number 9."]
    assert any("1 TL;DR posts from the Hub dataset trl-lib/tldr" in rec.getMessage() for rec in caplog.records)


def test_auto_falls_back_to_offline(monkeypatch, caplog):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with caplog.at_level(logging.INFO, logger="accord.envs.writing.core"):
        rows = load_writing_rows("tldr", "train", limit=5)
    assert len(rows) == 5 and all(r["source"] == "offline" for r in rows)
    # the log line says what the run trains on (not TL;DR) and how to get TL;DR
    line = next(rec.getMessage() for rec in caplog.records if "offline corpus" in rec.getMessage())
    assert "passages of Python's own documentation" in line and "not TL;DR posts" in line, line
    assert "OFFLINE=1 is set" in line and "task.options.source=hub" in line, line
    assert "task.options.data_files=FILE.jsonl" in line and "pip install 'accord[hub]'" in line, line


def test_argument_validation():
    with pytest.raises(ValueError, match="split"):
        load_writing_rows("tldr", "test", source="offline")
    with pytest.raises(ValueError, match="source"):
        load_writing_rows("tldr", "train", source="web")
    with pytest.raises(ValueError, match="variant"):
        load_writing_rows("poems", "train", source="offline")
    with pytest.raises(ValueError, match="limit"):
        load_writing_rows("tldr", "train", source="offline", limit=-1)


# ----------------------------------------------------------------- prompts


def test_prompts_tldr():
    row = load_writing_rows("tldr", "train", data_files=str(FIXTURE))[0]
    concise = writing_prompt("concise", row)
    detailed = writing_prompt("detailed", row, "tldr")
    for messages in (concise, detailed):
        assert isinstance(messages, list) and messages
        assert all(set(m) == {"role", "content"} for m in messages)
        assert messages[-1]["role"] == "user"
        assert row["text"] in messages[-1]["content"]
        assert row["title"] in messages[-1]["content"]
    assert "1-3 sentences" in concise[-1]["content"]
    assert "transition" in detailed[-1]["content"] and "twice" not in concise[-1]["content"]
    assert concise != detailed


def test_prompts_arxiv_and_errors():
    row = {"id": "x", "text": "We propose a method."}
    background = writing_prompt("background", row, "arxiv")[-1]["content"]
    methods = writing_prompt("methods", row, "arxiv")[-1]["content"]
    assert "background" in background.lower() and "methodology" in methods.lower()
    with pytest.raises(ValueError, match="concise"):
        writing_prompt("summarizer", row, "tldr")
    with pytest.raises(ValueError, match="background"):
        writing_prompt("concise", row, "arxiv")
    with pytest.raises(ValueError, match="text"):
        writing_prompt("concise", {"id": "x"})


def test_prompt_truncates_long_texts():
    row = {"id": "x", "text": words(2000)}
    content = writing_prompt("detailed", row)[-1]["content"]
    assert len(content.split()) < 600 and content.endswith("...")


def test_task_pins_the_auto_source_for_both_splits(monkeypatch):
    from accord.envs.writing.task import WritingTask

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    task = WritingTask(source="auto")
    train = task.rows("train")
    assert task.source == "offline" and {r["source"] for r in train} == {"offline"}
    assert {r["source"] for r in task.rows("eval")} == {"offline"}


@pytest.mark.parametrize("options, problem", [({"source": "hubb"}, r"source='hubb'; choose one of \['auto', 'hub', "
                                                                    r"'offline'\]"),
                                              ({"variant": "tldrr"}, r"variant='tldrr'; choose 'tldr' or 'arxiv'")])
def test_a_wrong_source_or_variant_is_refused_when_the_task_is_built(options, problem):
    """source was checked only when the rows were first read (a ValueError out of tasks(), deep in a run)."""
    from accord.envs import make_task
    from accord.envs.registry import TaskError

    with pytest.raises(TaskError, match=problem):
        make_task("writing", options)

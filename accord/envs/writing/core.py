"""Two-agent collaborative writing task from MAGRPO (Liu et al., arXiv 2508.04652).

Two agents read the same text and write complementary pieces; the pair earns
one team reward.

* ``variant="tldr"`` (Reddit TL;DR posts): agent 1 (``"concise"``) writes a
  short summary, agent 2 (``"detailed"``) a longer, richer one.
* ``variant="arxiv"`` (arXiv abstract expansion): agent 1 (``"background"``)
  writes background and motivation, agent 2 (``"methods"``) methodology and
  implications.

Team reward
-----------
Four levels, summed, each gated by the one before it (nominal maximum 3.0):

====  ======  ==================================  ================================
lvl   max     TLDR                                arXiv
====  ======  ==================================  ================================
L1    0.5     both outputs 8-256 tokens           both outputs 128-256 tokens
L2    1.0     n2/n1 in [1.6, 3.2]; ramps 0->1 on  n2/n1 in [1.3, 1.6]; ramps on
              [1.1, 1.6] and 1->0 on [3.2, 5.0]   [0.8, 1.3] and [1.6, 2.0]
L3    0.5     u2/u1 >= 2.0; ramp on [1.3, 2.0]    u2/u1 in [0.7, 1.3]; ramps on
                                                  [0.5, 0.7] and [1.3, 1.7]
L4    1.0     0.4 * transition + 0.6 * min(J, 0.03) / 0.03 (both variants)
====  ======  ==================================  ================================

* Tokens and the word counts ``n1``, ``n2`` are whitespace-separated pieces
  (``str.split``).
* ``u1``, ``u2`` are the numbers of distinct lower-cased words (runs of letters
  and digits, apostrophes kept inside words), stop-words included.
* ``transition`` looks at agent 2's text only: 0 when none of the 12
  categories in ``TRANSITION_CATEGORIES`` occurs, otherwise
  ``0.4 + 0.05 * (categories present - 1)``, capped at 1.
* ``J`` is the Jaccard similarity of the two texts' sets of distinct words
  after removing ``STOP_WORDS`` (0 when both sets are empty).

Gating: if L1 fails the total is 0. A level that scores exactly 0 ends the sum;
a level with *partial* credit (on a ramp, score > 0) still lets the next level
count. So L3 counts only when L2 > 0, and L4 only when L3 > 0.

With 12 transition categories the transition score tops out at
``0.4 + 11 * 0.05 = 0.95``, so the highest total actually reachable is
``0.5 + 1.0 + 0.5 + (0.4 * 0.95 + 0.6) = 2.98``; ``REWARD_MAX`` (3.0) is the
nominal ceiling quoted by the paper.

What the reward measures: lexical proxies (lengths, vocabulary counts, word
overlap, presence of transition words) that compare the two agents' texts with
each other. It never reads the source text, so it does not judge whether a
summary is true to it: a pair of fluent but wrong summaries can score 2.98, and
a small Jaccard cap (0.03) means almost any shared content word earns the full
overlap credit. It does not need language either: "zebra" eight times against
"zebra" followed by one transition word of each category and five filler tokens
scores 2.96 (``tests/envs/test_writing.py``), and eight NUL characters separated
by spaces against thirty 1.5. A rising team reward says the pair fits these proxies better,
not that the summaries got better.

L1's word floor is also the task's completion floor (``WritingTask.min_new_tokens``): with
``rollout.min_new_tokens`` null, generation holds EOS back for each agent's first 8 tokens (tldr; 128 for
arxiv), since a shorter completion cannot have 8 words when each word takes at least one token.

Faithfulness term (optional, off by default: the default is the paper's reward)
----------------------------------------------------------------------------
``faithfulness=w`` (``task.options.faithfulness``, w > 0) adds
``w * (F(text1) + F(text2)) / 2`` to the total when L1 passes, where
:func:`source_faithfulness` ``F`` scores one text against the source text:
the mean of (a) the share of its distinct content words (non-stop-words) that
occur in the source and (b) the share of its distinct word bigrams that occur
in the source (a ROUGE-2-like precision). A near-verbatim extract scores close
to 1, a fluent sentence about something else close to 0. It is lexical too: a
wrong claim assembled from the source's own words and phrases still scores
well. The nominal maximum becomes ``3.0 + w``. ``source_overlap`` (the mean
``F`` of the pair) is reported as a reward component in every run, also when
the term is off, so a run shows whether the summaries stay close to the text.

Data
----
``load_writing_rows`` returns rows ``{"id", "text", "title", "reference",
"source"}`` from the Hub (``trl-lib/tldr`` / ``OpenMLRL/arXiv_abstract``, needs
``datasets`` and network), from a local JSON/JSONL file in the Hub's format, or
from an offline corpus of prose passages cut from Python's own bundled
documentation (``accord.envs.writing.corpus``). For TL;DR records the
``SUBREDDIT/TITLE/POST/TL;DR:`` scaffolding of the prompt is removed: ``text``
is the post body, the title goes to ``title`` and the reference TL;DR to
``reference``.
"""

from __future__ import annotations

import logging
import math
import random
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from accord.data import DataFileError, digest, hash_bucket, hash_split, hub_unavailable_reason, load_hub_dataset, read_records
from accord.envs.writing.corpus import stdlib_passages

logger = logging.getLogger(__name__)

__all__ = [
    "TLDR_AGENTS",
    "ARXIV_AGENTS",
    "VARIANTS",
    "REWARD_MAX",
    "STOP_WORDS",
    "TRANSITION_CATEGORIES",
    "WritingDataUnavailable",
    "writing_agents",
    "writing_min_words",
    "transition_categories",
    "transition_score",
    "content_jaccard",
    "writing_reward_levels",
    "writing_team_reward",
    "source_faithfulness",
    "writing_reward_parts",
    "record_to_row",
    "load_writing_rows",
    "writing_prompt",
]

TLDR_AGENTS = ("concise", "detailed")
ARXIV_AGENTS = ("background", "methods")
VARIANTS = ("tldr", "arxiv")
REWARD_MAX = 3.0

_AGENTS = {"tldr": TLDR_AGENTS, "arxiv": ARXIV_AGENTS}

# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------

STOP_WORDS = frozenset(
    """
    a an the and or but nor so yet of in on at to from by for with about into
    onto over under as than then too very is are was were be been being am do
    does did done have has had having it its this that these those there here
    i me my mine we our ours us you your yours he him his she her hers they
    them their theirs what which who whom whose when where why how not no if
    can could will would should may might must shall just all any some each
    also more most such only own same other both few many much
    """.split()
)

# Twelve categories of discourse markers; every phrase belongs to exactly one.
TRANSITION_CATEGORIES: dict[str, tuple[str, ...]] = {
    "addition": (
        "in addition", "furthermore", "moreover", "additionally", "also", "besides",
        "as well as",
    ),
    "contrast": (
        "however", "on the other hand", "in contrast", "by contrast", "whereas", "instead",
        "conversely",
    ),
    "cause": (
        "because", "since", "due to", "owing to", "given that", "on account of",
    ),
    "result": (
        "therefore", "thus", "consequently", "as a result", "hence", "accordingly",
    ),
    "example": (
        "for example", "for instance", "such as", "to illustrate", "namely", "in particular",
    ),
    "emphasis": (
        "indeed", "in fact", "above all", "notably", "especially", "certainly",
        "most importantly",
    ),
    "sequence": (
        "first", "firstly", "secondly", "next", "then", "finally", "afterwards", "meanwhile",
        "subsequently",
    ),
    "comparison": (
        "similarly", "likewise", "in the same way", "just as", "compared with", "compared to",
        "equally",
    ),
    "conclusion": (
        "in conclusion", "to sum up", "in summary", "overall", "in short", "ultimately",
        "all in all",
    ),
    "clarification": (
        "in other words", "to clarify", "put simply", "simply put", "more precisely",
        "specifically", "to be clear",
    ),
    "condition": (
        "if", "unless", "provided that", "as long as", "in case", "otherwise",
    ),
    "concession": (
        "although", "though", "even though", "despite", "in spite of", "nevertheless",
        "nonetheless", "admittedly",
    ),
}

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def _phrase_pattern(phrases: Sequence[str]) -> re.Pattern[str]:
    # Longest first so "even though" wins over "though"; boundaries are
    # "not a word character" so "if" does not fire inside "different".
    alternatives = "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True))
    return re.compile(rf"(?<![a-z0-9'])(?:{alternatives})(?![a-z0-9'])")


_CATEGORY_PATTERNS = {name: _phrase_pattern(words) for name, words in TRANSITION_CATEGORIES.items()}


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def transition_categories(text: str) -> set[str]:
    """Names of the TRANSITION_CATEGORIES with at least one phrase in ``text``.

    Matching is case-insensitive, on whole words, and ignores punctuation
    between the words of a phrase ("in fact," matches "in fact").
    """
    normalized = " ".join(_words(text))
    return {name for name, pattern in _CATEGORY_PATTERNS.items() if pattern.search(normalized)}


def transition_score(text: str) -> float:
    """0 with no category present, else 0.4 + 0.05 per extra category (max 1)."""
    k = len(transition_categories(text))
    if k == 0:
        return 0.0
    return min(1.0, 0.4 + 0.05 * (k - 1))


def content_jaccard(text1: str, text2: str) -> float:
    """Jaccard similarity of the distinct non-stop-words of two texts."""
    a = {w for w in _words(text1) if w not in STOP_WORDS}
    b = {w for w in _words(text2) if w not in STOP_WORDS}
    union = a | b
    if not union:
        return 0.0
    return len(a & b) / len(union)


# --------------------------------------------------------------------------
# Reward
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _RewardSpec:
    min_tokens: int
    max_tokens: int
    # (zero below, full from, full until, zero above): a trapezoid.
    length_ratio: tuple[float, float, float, float]
    unique_ratio: tuple[float, float, float, float]


_SPECS = {
    "tldr": _RewardSpec(8, 256, (1.1, 1.6, 3.2, 5.0), (1.3, 2.0, math.inf, math.inf)),
    "arxiv": _RewardSpec(128, 256, (0.8, 1.3, 1.6, 2.0), (0.5, 0.7, 1.3, 1.7)),
}

_L1, _L2, _L3, _L4 = 0.5, 1.0, 0.5, 1.0
_TRANSITION_WEIGHT, _JACCARD_WEIGHT, _JACCARD_CAP = 0.4, 0.6, 0.03


def _trapezoid(x: float, bounds: tuple[float, float, float, float]) -> float:
    lo_zero, lo_full, hi_full, hi_zero = bounds
    if lo_full <= x <= hi_full:
        return 1.0
    if lo_zero < x < lo_full:
        return (x - lo_zero) / (lo_full - lo_zero)
    if hi_full < x < hi_zero:
        return (hi_zero - x) / (hi_zero - hi_full)
    return 0.0


def _check_variant(variant: str) -> str:
    if variant not in _SPECS:
        raise ValueError(f"Unknown writing variant {variant!r}; use one of {VARIANTS}.")
    return variant


def writing_agents(variant: str = "tldr") -> tuple[str, ...]:
    """Agent names of a variant, agent 1 first."""
    return _AGENTS[_check_variant(variant)]


def writing_min_words(variant: str = "tldr") -> int:
    """L1's floor: the fewest whitespace-separated words each agent's text needs for any reward."""
    return _SPECS[_check_variant(variant)].min_tokens


def writing_reward_levels(text1: str, text2: str, variant: str = "tldr") -> dict[str, float]:
    """Per-level team reward of one joint action.

    ``text1`` is agent 1's output (concise / background), ``text2`` agent 2's
    (detailed / methods). Returns ``{"l1", "l2", "l3", "l4", "total"}``; a
    level not reached is 0. A level that scores 0 stops the sum; partial credit
    (> 0) on a ramp lets the next level count (see the module docstring).
    """
    spec = _SPECS[_check_variant(variant)]
    for name, value in (("text1", text1), ("text2", text2)):
        if not isinstance(value, str):
            raise TypeError(
                f"{name} must be a str, got {type(value).__name__}; decode completions to text first."
            )
    levels = {"l1": 0.0, "l2": 0.0, "l3": 0.0, "l4": 0.0, "total": 0.0}

    n1, n2 = len(text1.split()), len(text2.split())
    if not (spec.min_tokens <= n1 <= spec.max_tokens and spec.min_tokens <= n2 <= spec.max_tokens):
        return levels
    levels["l1"] = _L1

    levels["l2"] = _L2 * _trapezoid(n2 / n1, spec.length_ratio)
    if levels["l2"] > 0.0:
        u1, u2 = len(set(_words(text1))), len(set(_words(text2)))
        if u1 > 0:
            levels["l3"] = _L3 * _trapezoid(u2 / u1, spec.unique_ratio)
        if levels["l3"] > 0.0:
            jaccard = min(content_jaccard(text1, text2), _JACCARD_CAP) / _JACCARD_CAP
            levels["l4"] = _L4 * (_TRANSITION_WEIGHT * transition_score(text2) + _JACCARD_WEIGHT * jaccard)

    levels["total"] = levels["l1"] + levels["l2"] + levels["l3"] + levels["l4"]
    return levels


def _bigrams(words: list[str]) -> set[tuple[str, str]]:
    return set(zip(words, words[1:]))


def source_faithfulness(summary: str, source: str) -> float:
    """Lexical faithfulness of ``summary`` to ``source`` in [0, 1] (see the module docstring).

    Mean of the share of the summary's distinct content words found in the source and the share
    of its distinct word bigrams found in the source; a part with nothing to count scores 0."""
    for name, value in (("summary", summary), ("source", source)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    words, source_words = _words(summary), _words(source)
    content = {w for w in words if w not in STOP_WORDS}
    unigram = len(content & set(source_words)) / len(content) if content else 0.0
    pairs = _bigrams(words)
    bigram = len(pairs & _bigrams(source_words)) / len(pairs) if pairs else 0.0
    return (unigram + bigram) / 2


def writing_reward_parts(text1: str, text2: str, source: str | None, variant: str = "tldr",
                         faithfulness: float = 0.0) -> dict[str, float]:
    """The reward of one joint action in parts: the paper's levels ``l1``..``l4``, ``faithfulness``
    (the optional term, 0 when ``faithfulness`` is 0 or L1 fails), ``source_overlap`` (the pair's mean
    :func:`source_faithfulness`, a diagnostic that is not added unless the term is on) and ``total``
    (= l1 + l2 + l3 + l4 + faithfulness; with ``faithfulness=0`` exactly the paper's reward).
    ``source=None`` (no source text at hand) is allowed only with ``faithfulness=0``; there is no
    ``source_overlap`` then."""
    if not isinstance(faithfulness, (int, float)) or isinstance(faithfulness, bool) or not math.isfinite(faithfulness) \
            or faithfulness < 0:
        raise ValueError(f"faithfulness={faithfulness!r} must be a finite number >= 0 (0: the paper's reward)")
    parts = writing_reward_levels(text1, text2, variant)
    if source is None:
        if faithfulness:
            raise ValueError("the faithfulness term needs the source text; pass the row's 'text' column")
        parts["faithfulness"] = 0.0
        return parts
    overlap = (source_faithfulness(text1, source) + source_faithfulness(text2, source)) / 2
    parts["faithfulness"] = faithfulness * overlap if parts["l1"] > 0 else 0.0
    parts["source_overlap"] = overlap
    parts["total"] += parts["faithfulness"]
    return parts


def _as_text(completion: Any) -> str:
    """A completion as plain text: a str, or chat messages (contents joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and all(isinstance(m, Mapping) for m in completion):
        return "\n".join(str(m.get("content", "")) for m in completion)
    raise TypeError(
        f"A completion must be a str or a list of chat messages, got {type(completion).__name__}."
    )


def writing_team_reward(
    *,
    prompts: Sequence[Any] | None = None,
    completions: Mapping[str, Sequence[Any]],
    agents: Sequence[str],
    variant: str = "tldr",
    **kwargs: Any,
) -> list[float]:
    """Team reward per joint action (TRL-style keyword call).

    ``completions[agents[i]][j]`` is agent ``i``'s output in joint action
    ``j``; ``agents[0]`` is agent 1. Returns one float per joint action, in
    order. ``prompts`` and any other keyword are accepted and ignored.
    """
    _check_variant(variant)
    if len(agents) != 2:
        raise ValueError(f"The writing task has exactly 2 agents, got agents={tuple(agents)!r}.")
    missing = [a for a in agents if a not in completions]
    if missing:
        raise KeyError(
            f"completions has no entry for agent(s) {missing}; it has {sorted(completions)}. "
            "Key completions by the names passed in `agents`."
        )
    first, second = completions[agents[0]], completions[agents[1]]
    if len(first) != len(second):
        raise ValueError(
            f"Agents {agents[0]!r} and {agents[1]!r} have {len(first)} and {len(second)} completions; "
            "each joint action needs one completion from each agent."
        )
    return [
        writing_reward_levels(_as_text(c1), _as_text(c2), variant)["total"]
        for c1, c2 in zip(first, second)
    ]


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

_HUB_DATASETS = {"tldr": "trl-lib/tldr", "arxiv": "OpenMLRL/arXiv_abstract"}
_HUB_EVAL_SPLITS = ("test", "validation")  # first present one serves "eval"
_SPLITS = ("train", "eval")
_SOURCES = ("auto", "hub", "offline")
_EVAL_PERCENT = 25  # share of texts bucketed into "eval" when splitting by hash

# Text fields tried in order, per variant, when converting a record.
_TEXT_KEYS = {"tldr": ("prompt", "text", "post"), "arxiv": ("abstract", "text", "prompt")}
_REFERENCE_KEYS = {"tldr": ("completion", "summary"), "arxiv": ()}

_TLDR_FIELD = re.compile(r"(?m)^(SUBREDDIT|TITLE|POST):")


def _without_tldr_cue(text: str) -> str:
    r"""``text`` stripped, without a ``TL;DR:`` cue at its end (a pattern ``\s*TL;DR:\s*$`` took time quadratic
    in a run of blanks elsewhere in the text)."""
    text = text.strip()
    return text[:-len("TL;DR:")].strip() if text.endswith("TL;DR:") else text


class WritingDataUnavailable(RuntimeError):
    """The requested data source cannot be used here (message says what to do)."""


def _text_id(variant: str, text: str) -> str:
    return f"{variant}-{digest(text)[:16]}"


def _in_eval_bucket(text: str) -> bool:
    return hash_bucket(text, 100, salt="accord-writing-split:", digits=8) < _EVAL_PERCENT


def _parse_tldr_prompt(prompt: str) -> tuple[str, str]:
    """(post body, title) of a ``SUBREDDIT/TITLE/POST/TL;DR:`` prompt."""
    pieces = _TLDR_FIELD.split(prompt)
    if len(pieces) < 3:  # no scaffolding: keep the prompt, minus a TL;DR cue
        return _without_tldr_cue(prompt), ""
    fields = {pieces[i]: pieces[i + 1] for i in range(1, len(pieces) - 1, 2)}
    body = fields.get("POST", pieces[-1])
    return _without_tldr_cue(body), fields.get("TITLE", "").strip()


def record_to_row(variant: str, record: Mapping[str, Any]) -> dict[str, str] | None:
    """Convert one Hub-format record to a row, or None if it has no text.

    The single conversion used for Hub data, ``data_files`` and the offline
    corpus. TL;DR: ``{"prompt", "completion"}`` with the Reddit scaffolding
    stripped to the post body. arXiv: ``{"abstract"}`` (or ``"text"``).
    """
    _check_variant(variant)
    raw = next((record[k] for k in _TEXT_KEYS[variant] if isinstance(record.get(k), str)), None)
    if raw is None:
        return None
    title = str(record.get("title") or "").strip()
    if variant == "tldr":
        text, parsed_title = _parse_tldr_prompt(raw)
        title = title or parsed_title
    else:
        text = " ".join(raw.split())
    if not text:
        return None
    reference = next((record[k] for k in _REFERENCE_KEYS[variant] if isinstance(record.get(k), str)), "")
    return {"id": _text_id(variant, text), "text": text, "title": title, "reference": reference.strip()}


def _convert(variant: str, records: Any, source: str) -> list[dict[str, str]]:
    rows: dict[str, dict[str, str]] = {}
    for record in records:
        row = record_to_row(variant, record)
        if row is not None and row["id"] not in rows:
            row["source"] = source
            rows[row["id"]] = row
    return list(rows.values())


def _file_rows(variant: str, data_files: str) -> list[dict[str, str]]:
    """The rows of a local ``data_files`` file, every record checked: a file a user wrote loses no record silently
    (records whose text is the same are one row, as with the Hub's data)."""
    records = read_records(data_files, "task.options.data_files")
    text_keys, ref_keys = _TEXT_KEYS[variant], _REFERENCE_KEYS[variant]
    need = f"a {variant} record is an object with its text under {' or '.join(map(repr, text_keys))}" + (
        f" and its reference summary under {' or '.join(map(repr, ref_keys))}" if ref_keys else "")
    for n, record in enumerate(records, 1):
        where = f"task.options.data_files {data_files} record {n}"
        if not isinstance(record, dict):
            raise DataFileError(f"{where} holds {type(record).__name__}, not an object; {need}")
        wrong = [k for k in text_keys + ref_keys if k in record and not isinstance(record[k], str)]
        if wrong:
            raise DataFileError(f"{where}: {wrong[0]!r} holds {type(record[wrong[0]]).__name__}, not text; {need}")
        if not any(k in record for k in text_keys):
            raise DataFileError(f"{where} has no text (its keys: {sorted(record)}); {need}")
        if record_to_row(variant, record) is None:
            raise DataFileError(f"{where}: its text is empty once the TL;DR scaffolding (SUBREDDIT, TITLE, POST, "
                                "TL;DR) is removed; give the post's text, or remove the record"
                                if variant == "tldr" else f"{where}: its text is empty; remove the record")
    return _convert(variant, records, "data_files")


def _hub_error(variant: str, reason: str) -> WritingDataUnavailable:
    return WritingDataUnavailable(
        f"Cannot load {_HUB_DATASETS[variant]!r} from the Hugging Face Hub: {reason}. "
        "Use load_writing_rows(..., source='offline') for the bundled offline corpus, or "
        "data_files='<local JSON/JSONL in the Hub format>'; for Hub data, pip install datasets "
        "and make huggingface.co reachable."
    )


def _load_hub(variant: str, split: str) -> list[dict[str, str]]:
    splits = load_hub_dataset(_HUB_DATASETS[variant], error=lambda reason: _hub_error(variant, reason))
    eval_name = next((s for s in _HUB_EVAL_SPLITS if s in splits), None)
    if "train" in splits and eval_name is not None:
        train = _convert(variant, splits["train"], "hub")
        if split == "train":
            return train
        seen = {row["id"] for row in train}
        # Drop eval texts that also occur in train so the splits never overlap.
        return [row for row in _convert(variant, splits[eval_name], "hub") if row["id"] not in seen]
    only = "train" if "train" in splits else sorted(splits)[0]
    return _hash_split(_convert(variant, splits[only], "hub"), split)


def _hash_split(rows: list[dict[str, str]], split: str) -> list[dict[str, str]]:
    return hash_split(rows, split, lambda row: _in_eval_bucket(row["text"]))


def _load_offline(variant: str, split: str) -> list[dict[str, str]]:
    return _hash_split(_convert(variant, ({"text": p} for p in stdlib_passages()), "offline"), split)


_DATA_NAMES = {"tldr": "TL;DR posts", "arxiv": "arXiv abstracts"}


def _log_hub(variant: str, split: str, rows: list) -> None:
    logger.info("writing/%s %s: %d %s from the Hub dataset %s", variant, split, len(rows), _DATA_NAMES[variant],
                _HUB_DATASETS[variant])


def _log_offline(variant: str, split: str, rows: list, why: str) -> None:
    """Say plainly what the offline corpus is (not the paper's data) and, once, how to get the paper's data."""
    if split != "train":
        logger.info("writing/%s %s: %d passages of Python's own documentation (the offline corpus)", variant, split,
                    len(rows))
        return
    logger.info("writing/%s %s: %d passages of Python's own documentation (the offline corpus: %s), not %s; for "
                "%s: pip install 'accord[hub]' with huggingface.co reachable (task.options.source=hub), or a local "
                "file task.options.data_files=FILE.jsonl in the hub's format", variant, split, len(rows),
                re.sub(r" \(.*\)$", "", why), _DATA_NAMES[variant], _HUB_DATASETS[variant])


def load_writing_rows(
    variant: str,
    split: str,
    *,
    source: str = "auto",
    limit: int | None = None,
    seed: int = 0,
    data_files: str | None = None,
) -> list[dict]:
    """Rows ``{"id", "text", "title", "reference", "source"}`` for the writing task.

    ``split`` is ``"train"`` or ``"eval"``; the two never share a text.

    * ``data_files``: a local JSON/JSONL file of Hub-format records (TL;DR
      ``{"prompt", "completion"}``, arXiv ``{"abstract"}``), split by a stable
      hash of the text (25% eval). Takes precedence over ``source`` (which must
      not be ``"offline"`` then).
    * ``source="hub"``: ``trl-lib/tldr`` or ``OpenMLRL/arXiv_abstract`` via
      ``datasets``; the Hub's train split serves ``"train"`` and its test (or
      validation) split ``"eval"``, minus texts also in train. A dataset with a
      single split is split by hash. Raises ``WritingDataUnavailable`` when
      ``datasets`` is missing, ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` is
      set, or huggingface.co does not answer within 2 s.
    * ``source="offline"``: prose passages from Python's bundled documentation
      (``accord.envs.writing.corpus``), split by hash; the same corpus serves
      both variants.
    * ``source="auto"``: the Hub when it is usable, else offline; the choice is
      logged at INFO.

    Rows are put in id order, shuffled with ``random.Random(seed)`` and cut to
    ``limit``.
    """
    _check_variant(variant)
    if split not in _SPLITS:
        raise ValueError(f"Unknown split {split!r}; use one of {_SPLITS}.")
    if source not in _SOURCES:
        raise ValueError(f"Unknown source {source!r}; use one of {_SOURCES}.")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}.")

    if data_files is not None:
        if source == "offline":
            raise ValueError("source='offline' and data_files conflict; drop one of them.")
        rows = _hash_split(_file_rows(variant, data_files), split)
        logger.info("writing/%s %s: %d rows from data_files %s", variant, split, len(rows), data_files)
    elif source == "hub":
        rows = _load_hub(variant, split)
        _log_hub(variant, split, rows)
    elif source == "offline":
        rows = _load_offline(variant, split)
        _log_offline(variant, split, rows, "task.options.source=offline")
    else:
        reason = hub_unavailable_reason()
        rows = None
        if reason is None:
            try:
                rows = _load_hub(variant, split)
                _log_hub(variant, split, rows)
            except WritingDataUnavailable as exc:
                logger.warning(
                    "writing/%s: Hub load failed, falling back to the offline corpus: %s", variant, exc
                )
                reason = "the Hub load failed"
        if rows is None:
            rows = _load_offline(variant, split)
            _log_offline(variant, split, rows, reason)

    rows = sorted(rows, key=lambda row: row["id"])
    random.Random(seed).shuffle(rows)
    return rows if limit is None else rows[:limit]


# --------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------

_MAX_PROMPT_WORDS = 450  # keeps prompt + answers inside a ~2048-token context

_INSTRUCTIONS = {
    ("tldr", "concise"): (
        "Summarize the text below in 1-3 sentences (about 20-40 words). "
        "Be brief and keep only the main point. Reply with the summary only."
    ),
    ("tldr", "detailed"): (
        "Write a detailed summary of the text below, about two to three times as long as a "
        "1-3 sentence summary (roughly 50-100 words). Cover the key details with varied wording "
        "and link ideas with transition words (e.g. however, because, for example, therefore). "
        "Reply with the summary only."
    ),
    ("arxiv", "background"): (
        "Below is a paper abstract. Write the background and motivation of this work: the "
        "problem, why it matters and what earlier work lacks. Write one paragraph of about "
        "140-170 words. Reply with the paragraph only."
    ),
    ("arxiv", "methods"): (
        "Below is a paper abstract. Describe the methodology of this work and its implications: "
        "how the approach works and what the results mean. Write about 190-240 words, somewhat "
        "longer than a background paragraph, and link ideas with transition words (e.g. first, "
        "however, therefore, for example). Reply with the text only."
    ),
}


def writing_prompt(agent: str, row: Mapping[str, Any], variant: str = "tldr") -> list[dict]:
    """Chat messages asking ``agent`` to write its part for ``row``.

    A single user message (works with chat templates that lack a system
    role). Texts longer than 450 words are cut, marked with "...".
    """
    agents = writing_agents(variant)
    if agent not in agents:
        raise ValueError(f"Unknown agent {agent!r} for the {variant!r} writing task; valid agents: {agents}.")
    text = row.get("text") if isinstance(row, Mapping) else None
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            "row must be a dict with a non-empty 'text' string (as returned by load_writing_rows)."
        )
    words = text.split()
    if len(words) > _MAX_PROMPT_WORDS:
        text = " ".join(words[:_MAX_PROMPT_WORDS]) + " ..."
    label = "Abstract" if variant == "arxiv" else "Text"
    title = str(row.get("title") or "").strip()
    header = f"Title: {title}\n" if title else ""
    content = f"{_INSTRUCTIONS[(variant, agent)]}\n\n{header}{label}:\n{text}"
    return [{"role": "user", "content": content}]

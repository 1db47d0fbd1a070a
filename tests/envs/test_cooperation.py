"""The cooperation tasks (``signal``, ``handoff``): protocol conformance, hedge-proof scores, local rewards that
read neither the secret nor the partner, the chance bound, and their options' errors."""

import itertools
import random

import pytest

from accord.envs.centralized import centralize
from accord.envs.check import GARBAGE, check_env
from accord.envs.cooperation.handoff import HandoffEnv, HandoffTask, path
from accord.envs.cooperation.items import SHOWN, items, names, naming, vote, walk
from accord.envs.cooperation.signalling import SignalEnv
from accord.envs.registry import TaskError, make_env, make_task

# texts an agent might write: clean items of each letter, hedges, noise, empty
TEXTS = ["b", "p", "bob", "pip pop", "bp", "bob pip", "g", "bag", "pig gab", "the cat", "", "   ", "b p g",
         "bbb ppp", "gig", "pub", "x y z", *GARBAGE]


# --- how texts are read -------------------------------------------------------------------------------

def test_items_are_the_candidate_letters_each_word_carries():
    assert items("Bob hid a pup, apple", "bp") == ["b", "p", "p"]   # "hid", "a" carry neither; "apple" carries p
    assert items("bop", "bp") == ["bp"]                             # one word carrying both: a hedge item
    # read up to the first SHOWN (60) characters, what a partner's view shows: 30 words of "b "
    assert items("lorem " * 2000, "bp") == [] and len(items("b " * 500, "bp")) == SHOWN // 2 == 30
    assert items("x" * (SHOWN - 1) + "b", "bp") == ["b"] and items("x" * SHOWN + " b", "bp") == []


def test_an_unequal_hedge_scores_no_more_in_expectation_than_committing():
    """A mix of candidates scores above 0 for its majority letter, but over any belief about the secret its
    expected vote is at most that of naming the likeliest candidate alone."""
    mix = items("b b b p", "bp")
    assert vote(mix, "b") == 0.5 and vote(mix, "p") == -0.5
    for q in (0.0, 0.25, 0.5, 0.75, 1.0):   # q: the probability that the secret is b
        expected = q * vote(mix, "b") + (1 - q) * vote(mix, "p")
        assert expected <= max(q * vote(["b"], "b") + (1 - q) * vote(["b"], "p"),
                               q * vote(["p"], "b") + (1 - q) * vote(["p"], "p"))


def test_a_hedge_never_scores_above_silence():
    """Naming every candidate (in one word or several) is worth at most 0, what an empty answer earns."""
    for letters in ("bp", "bdg", "bdgmp"):
        for secret in letters:
            assert vote(items(letters, letters), secret) <= 0         # one word with every letter
            assert vote(items(" ".join(letters), letters), secret) <= 0   # one word per letter
            assert not names(items(" ".join(letters), letters), secret)
            assert vote([], secret) == 0.0
    assert vote(["b", "b"], "b") == 1.0 and vote(["b", "p"], "b") == 0.0 and vote(["p"], "b") == -1.0


def test_any_answer_names_at_most_one_secret():
    """The chance bound: an answer that does not depend on the secret is a success for at most one of the M
    secrets, so over a uniform secret its success rate is at most 1/M; its vote sums to at most 1."""
    rng = random.Random(0)
    pool = "bdgmp"
    for _ in range(300):
        text = " ".join("".join(rng.choice(pool + "aeo") for _ in range(rng.randint(1, 3)))
                        for _ in range(rng.randint(0, 4)))
        for m in (2, 3, 5):
            letters = pool[:m]
            found = items(text, letters)
            assert sum(names(found, s) for s in letters) <= 1
            assert sum(max(0.0, vote(found, s)) for s in letters) <= 1.0 + 1e-9


def test_naming_and_walk():
    assert naming(items("bob bib", "bp")) == 1.0 and naming(items("bop", "bp")) == -1.0 and naming([]) == 0.0
    assert walk(["b", "g"], ["b", "g"]) == 1.0 and walk([], ["b"]) == 0.0
    assert walk(["b", "g", "p"], ["b", "g"]) == pytest.approx(1 / 3)    # an extra item costs one match
    assert walk(["bg"], ["b"]) == -1.0                                   # a hedge matches nothing
    assert path("bgp", "p", 3) == ["p", "b", "g"]


# --- conformance --------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [{}, {"rounds": 2}, {"single_agent": True}, {"num_items": 3, "letters": "bdgmp"},
                                     {"hint": 0.0, "gate": False}],
                         ids=["default", "rounds2", "single_agent", "m3", "pure"])
def test_signal_conforms(options):
    check_env(lambda: make_env("signal", options), actions=["b b", "p", "bob?", "pip"])


@pytest.mark.parametrize("options", [{}, {"start": "given"}, {"single_turn": True}, {"single_agent": True},
                                     {"single_turn": True, "single_agent": True}, {"length": 2, "letters": "bdgmp"}],
                         ids=["free", "given", "single_turn", "single_agent", "single_turn_solo", "length2"])
def test_handoff_conforms(options):
    check_env(lambda: make_env("handoff", options), actions=["b", "g", "p", "b g", "g p b"])


@pytest.mark.parametrize("name,options", [("signal", {}), ("handoff", {}), ("handoff", {"single_turn": True})])
def test_centralized_wrapper_conforms(name, options):
    check_env(lambda: centralize(make_env(name, options)),
              actions=["<speaker>b</speaker><listener>b</listener>", "<first>b</first><second>g</second>"])


def test_splits_are_disjoint_and_secrets_balanced():
    env = SignalEnv()
    train, held = env.tasks("train"), env.tasks("eval", limit=200)
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    share = sum(r["secret"] == "b" for r in train) / len(train)
    assert 0.45 < share < 0.55


# --- the signalling game -------------------------------------------------------------------------------

def play_signal(env, row, *texts):
    env.reset(row)
    results = [env.step({env.acting()[0]: t}) for t in texts]
    return results


def _row(secret="b", candidates="bp"):
    return {"id": "t", "number": 0, "candidates": candidates, "secret": secret}


def test_signal_rewards():
    env = SignalEnv(hint=0.5)
    speak, listen = play_signal(env, _row("b"), "bob bib", "bub")
    assert speak.team_reward == 0.5 and listen.team_reward == 0.5 and listen.done and listen.info["success"]
    # a hedging listener earns nothing, whatever the message
    _, hedge = play_signal(env, _row("b"), "bob", "bop")
    assert hedge.team_reward <= 0 and not hedge.info["success"]
    # the gate: an answer the message did not support earns nothing (a lucky guess is not credited)
    _, lucky = play_signal(env, _row("b"), "the cat", "bob")
    assert lucky.team_reward == 0.0 and lucky.info["success"]
    # without the gate (the pure game) the answer alone counts
    _, pure = play_signal(SignalEnv(hint=0.0, gate=False), _row("b"), "the cat", "bob")
    assert pure.team_reward == 1.0


def test_signal_scores_the_message_as_the_listener_sees_it():
    """A letter past the SHOWN characters of the message never reaches the listener: it points at nothing, so
    the speaker earns no hint for it and the gate credits no guess."""
    env = SignalEnv(hint=0.5, echo=1)
    hidden = "x" * SHOWN + " b"
    speak, guess = play_signal(env, _row("b"), hidden, "b")
    assert "b" not in speak.observations["listener"].split("Message:")[1]
    assert speak.team_reward == 0.0 and guess.team_reward == 0.0
    # the same letter inside the shown part is a message
    speak, answer = play_signal(env, _row("b"), "x" * (SHOWN - 2) + " b", "b")
    assert speak.team_reward == 0.5 and answer.team_reward == 0.5
    # a question mark the speaker cannot see is no question
    *_, late = play_signal(SignalEnv(rounds=2), _row("b"), "bob", "x" * SHOWN + "?")
    assert "asked" not in late.info and late.done


def test_signal_observations_hide_the_secret_from_the_listener():
    env = SignalEnv(emphasis=4, echo=2)
    obs = env.reset(_row("p"))
    assert obs["speaker"].endswith("Secret: p p p p") and "Secret" not in obs["listener"]
    res = env.step({"speaker": "pup"})
    assert res.observations["listener"] == "Letters: b p. Message: pup | pup"


def test_signal_multi_round_question_and_reply():
    env = SignalEnv(rounds=2, hint=0.5, ask_cost=0.05)
    speak, ask, reply, answer = play_signal(env, _row("b"), "the cat", "which?", "bob", "bib")
    assert ask.info["asked"] and ask.team_reward == -0.05 and not ask.done
    assert "Question: which?" in ask.observations["speaker"]
    assert "the cat | bob" in reply.observations["listener"]
    # the hint is a potential: its increments sum to hint * vote(the last speaker text)
    assert speak.team_reward + reply.team_reward == 0.5
    assert answer.done and answer.info["success"] and answer.team_reward == 0.5
    # in the last round a question mark is an answer, not a question
    *_, last = play_signal(SignalEnv(rounds=1), _row("b"), "bob", "bob?")
    assert last.done and last.info["success"]


def test_signal_local_rewards_read_neither_secret_nor_partner():
    """Independent learners' signal: each agent's local reward is a function of its own text only."""
    for text in TEXTS:
        speaker_locals, listener_locals = set(), set()
        for secret, message in itertools.product("bp", TEXTS[:8]):
            env = SignalEnv()
            env.reset(_row(secret))
            speaker_locals.add(env.clone().step({"speaker": text}).local_rewards["speaker"])
            env.step({"speaker": message})
            listener_locals.add(env.step({"listener": text}).local_rewards["listener"])
        assert len(speaker_locals) == 1 and len(listener_locals) == 1, text


def test_signal_single_agent_names_the_secret():
    env = SignalEnv(single_agent=True)
    (res,) = play_signal(env, _row("p"), "pup")
    assert env.agents == ("solo",) and res.done and res.team_reward == 1.0 and res.info["success"]


@pytest.mark.parametrize("options,match", [
    ({"single_turn": True}, "no single-turn"),
    ({"hint": 0.0}, "gate=true needs hint > 0"),
    ({"letters": "bb"}, "distinct ASCII letters"),
    ({"num_items": 3}, r"num_items=3: must be an integer in \[2, 2\]"),
    ({"emphasis": 0}, "emphasis=0"),
    ({"colour": 1}, "has no option 'colour'"),
])
def test_signal_bad_options_are_one_line_errors(options, match):
    with pytest.raises(TaskError, match=match) as info:
        make_env("signal", options)
    assert "\n" not in str(info.value)


# --- the hand-off -------------------------------------------------------------------------------------

def play_handoff(env, row, *texts):
    env.reset(row)
    return [env.step({env.acting()[0]: t}) for t in texts]


def test_handoff_scores_the_second_against_what_the_first_wrote():
    env = make_env("handoff", {"letters": "bgp", "start": "given"})
    row = {"id": "t", "number": 0, "start": "g"}     # the path begins at the letter after g: p, then b
    first, second = play_handoff(env, row, "pip", "bob")
    assert first.team_reward == 0.5 and second.team_reward == 0.5 and second.info["success"]
    # a wrong first half costs the first its half; the second still scores for continuing consistently
    first, second = play_handoff(env, row, "bob", "gig")
    assert first.team_reward == -0.5 and second.team_reward == 0.5 and not second.info["success"]
    # the second continuing the true path instead of the first's is inconsistent
    _, second = play_handoff(env, row, "bob", "bib")
    assert second.team_reward == -0.5
    # the second never sees the start; it sees the first's text
    obs = env.reset(row)
    assert "g g g" in obs["first"] and "Start" not in obs["second"]
    # the instructions say what is scored: the path begins after Start, which is not written (writing it costs)
    assert "begins at the letter after Start (do not write Start itself)" in env.instructions("first")
    assert "Start" not in env.instructions("second")
    assert "Start" not in make_env("handoff", {"letters": "bgp"}).instructions("first")
    assert "First wrote: gag | gag" in env.step({"first": "gag"}).observations["second"]


def test_handoff_continues_what_the_second_can_see():
    """The second is scored against the part of the first's text its view shows (SHOWN characters)."""
    env = make_env("handoff", {"letters": "bgp", "start": "free", "echo": 1})
    first, second = play_handoff(env, {"id": "t", "number": 0}, "x" * SHOWN + " b", "g")
    assert "b" not in first.observations["second"].split("First wrote:")[1]
    assert second.team_reward == 0.0 and not second.info["success"]   # nothing shown to continue
    first, second = play_handoff(env, {"id": "t", "number": 0}, "x" * (SHOWN - 2) + " b", "g")
    assert first.team_reward == 0.5 and second.team_reward == 0.5 and second.info["success"]


def test_handoff_single_agent_local_reward_is_the_whole_path():
    """The solo writes 2 * length letters: its format reward is highest for the whole path, not for a half."""
    for length in (1, 2):
        env = make_env("handoff", {"single_agent": True, "length": length, "local_scale": 0.1})
        whole = " ".join(path("bgp", "b", 2 * length))
        half = " ".join(path("bgp", "b", length))
        (full,) = play_handoff(env, {"id": "t", "number": 0}, whole)
        (part,) = play_handoff(env, {"id": "t", "number": 0}, half)
        assert full.info["success"] and full.local_rewards["solo"] == pytest.approx(0.1)
        assert part.local_rewards["solo"] < full.local_rewards["solo"]


def test_handoff_free_start_and_single_turn():
    env = make_env("handoff")
    first, second = play_handoff(env, {"id": "t", "number": 0}, "pip", "bob")
    assert first.team_reward == 0.5 and second.team_reward == 0.5 and second.info["success"]
    task = make_task("handoff", {"single_turn": True})
    assert isinstance(task, HandoffTask)
    comps = {"first": ["pip", "pip", "bop", ""], "second": ["bob", "gig", "bob", "bob"]}
    assert task.reward(completions=comps, agents=("first", "second")) == [1.0, 0.0, -0.5, 0.0]
    assert task.success(completions=comps, agents=("first", "second")) == [1.0, 0.0, 0.0, 0.0]


def test_handoff_local_rewards_read_neither_start_nor_partner():
    for text in TEXTS:
        firsts, seconds = set(), set()
        for start, partner in itertools.product("bgp", TEXTS[:8]):
            env = HandoffEnv(make_env("handoff", {"start": "given"}).rules)
            env.reset({"id": "t", "number": 0, "start": start})
            firsts.add(env.clone().step({"first": text}).local_rewards["first"])
            env.step({"first": partner})
            seconds.add(env.step({"second": text}).local_rewards["second"])
        assert len(firsts) == 1 and len(seconds) == 1, text


def test_signal_fingerprint_is_a_clones_and_follows_the_episode():
    env = make_env("signal", {"rounds": 2})
    env.reset(env.tasks("train", 1)[0])
    clone = env.clone()
    assert clone.fingerprint() == env.fingerprint()
    clone.step({"speaker": "bob"})
    assert clone.fingerprint() != env.fingerprint()
    other = make_env("signal", {"rounds": 2, "echo": 4})
    other.reset(env.tasks("train", 1)[0])
    assert other.fingerprint() != env.fingerprint()


def test_handoff_fingerprint_is_a_clones_and_follows_the_episode():
    """The audit's fingerprint of a handoff environment: a clone's equals the original's, a step or another row
    changes it, and so do other settings."""
    env = make_env("handoff", {"start": "given"})
    env.reset({"id": "t", "number": 0, "start": "b"})
    clone = env.clone()
    assert clone.fingerprint() == env.fingerprint()
    clone.step({"first": "pip"})
    assert clone.fingerprint() != env.fingerprint()
    other = env.clone()
    other.reset({"id": "t", "number": 0, "start": "g"})
    assert other.fingerprint() != env.fingerprint()
    echo = make_env("handoff", {"start": "given", "echo": 4})
    echo.reset({"id": "t", "number": 0, "start": "b"})
    assert echo.fingerprint() != env.fingerprint()


@pytest.mark.parametrize("options,match", [
    ({"single_turn": True, "start": "given"}, "single_turn=true with start=given cannot work"),
    ({"start": "anywhere"}, "task.options.start='anywhere'"),
    ({"length": 0}, "length=0"),
    ({"single_turn": "yes"}, "single_turn='yes': must be true or false"),
])
def test_handoff_bad_options_are_one_line_errors(options, match):
    with pytest.raises(TaskError, match=match) as info:
        make_env("handoff", options)
    assert "\n" not in str(info.value)


def test_handoff_fixed_start_scores_the_first_from_the_cycle_start():
    """start=fixed: the first must begin at the cycle's first letter; the second still continues what it wrote."""
    env = make_env("handoff", {"letters": "ao", "start": "fixed"})
    first, second = play_handoff(env, {"id": "t", "number": 0}, "an", "on")
    assert first.team_reward == 0.5 and second.team_reward == 0.5 and second.info["success"]
    first, second = play_handoff(env, {"id": "t", "number": 0}, "on", "an")   # consistent, but not from the start
    assert first.team_reward == -0.5 and second.team_reward == 0.5 and not second.info["success"]
    assert "from its first letter" in env.instructions("first")
    task = make_task("handoff", {"letters": "ao", "start": "fixed", "single_turn": True})
    both = {"first": ["a", "o"], "second": ["o", "o"]}
    assert task.reward(completions=both, agents=("first", "second")) == [1.0, -1.0]
    check_env(lambda: make_env("handoff", {"start": "fixed"}), actions=["b", "g", "p"])


@pytest.mark.parametrize("start", ["free", "fixed", "given"])
def test_handoff_oracle_answers_score_and_noisy_ones_do_not(start):
    """The oracle (accord sft's demonstrations): exact answers succeed, also as the centralized baseline's tagged
    sections; a noisy answer has one letter wrong."""
    from accord.envs.oracles import oracle_for

    rng = random.Random(0)
    env = make_env("handoff", {"start": start, "length": 2})
    for row in env.tasks("train", limit=6):
        env.reset(row)
        oracle = oracle_for(env)
        first = oracle(env, "first", row, rng, False)
        env.step({"first": first})
        done = env.step({"second": oracle(env, "second", row, rng, False)})
        assert done.info["success"], (row, first)
        env.reset(row)
        noisy = oracle(env, "first", row, rng, True)
        assert env.step({"first": noisy}).team_reward < 0.5
    central = centralize(make_env("handoff", {"start": start}))
    row = central.tasks("train", limit=1)[0]
    central.reset(row)
    assert central.step({"central": oracle_for(central)(central, "central", row, rng, False)}).info["success"]


# --- the synthetic tasks' options (letters, relay) ------------------------------------------------------

@pytest.mark.parametrize("name,options,match", [
    ("letters", {"size": "abc"}, r"size='abc': must be an integer in \[1, 1000000\]"),
    ("letters", {"size": 1.5}, r"size=1.5: must be an integer in \[1, 1000000\]"),
    ("letters", {"size": True}, r"size=True: must be an integer in \[1, 1000000\]"),
    ("letters", {"size": -5}, r"size=-5: must be an integer in \[1, 1000000\]"),
    ("relay", {"simultaneous": "false"}, r"simultaneous='false': must be true or false"),
    ("relay", {"single_agent": 1}, r"single_agent=1: must be true or false"),
    ("relay", {"success_at": "abc"}, r"success_at='abc': must be a number in \[0.0, 1.0\]"),
    ("relay", {"success_at": 5}, r"success_at=5: must be a number in \[0.0, 1.0\]"),
    ("relay", {"size": 0}, r"size=0: must be an integer in \[1, 1000000\]"),
    ("relay", {"num_agents": 6}, r"num_agents=6: must be an integer in \[1, 5\]"),
])
def test_synthetic_task_bad_options_are_one_line_errors(name, options, match):
    """A string for a flag would be truthy, a string for a size would fail mid-run: each is refused when the
    task is built, naming the option and its range."""
    with pytest.raises(TaskError, match=match) as info:
        make_env(name, options)
    assert "\n" not in str(info.value)

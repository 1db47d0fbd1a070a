"""The centralized baseline: one model writes every role's output in one completion.

The wrapped environment (or single-turn task) keeps its roles; the model sees all their views and must
answer with one tagged section per role::

    <planner>...</planner>
    <executor>...</executor>

The sections are parsed and passed to the roles in turn order. A role whose section is missing, empty
or duplicated gets an empty action (which the wrapped environment treats as unparseable text, with its
own penalty), and the completion is additionally charged ``parse_penalty`` per failed role, in the team
reward, so that a format failure is never cheaper than a wrong answer. ``info["parse_failures"]``
counts failed roles.

One wrapper, :class:`CentralizedEnv`, serves both kinds of environment (:func:`centralize` builds it):
over a multi-turn environment it plays one turn per step; over a single-turn task's one-turn
:class:`~accord.envs.single_turn.SingleTurnEnv` it also has the single-turn form (``rows`` /
``prompt`` / ``reward``, one user message showing every role's prompt), which :func:`centralize` wraps
in a :class:`~accord.envs.single_turn.SingleTurnEnv` again, so that the team reward of a batch stays
one call of the wrapped environment's batched :meth:`~accord.envs.single_turn.SingleTurnEnv.score`.
"""

from __future__ import annotations

from typing import Any

from accord.envs.protocol import Env, StepResult
from accord.envs.text import tag_spans

CENTRAL = "central"


def _sections(text: str, role: str) -> list[str]:
    """The ``<role>...</role>`` sections of ``text`` (tags case-insensitive), each from an opening tag to the
    first closing tag after it, scanning on after that closing tag (:func:`accord.envs.text.tag_spans`: one pass,
    where a lazy ``<role>(.*?)</role>`` regex takes quadratic time on a text of many opening tags)."""
    return [text[begin:end] for _, begin, end, _ in tag_spans(text, f"<{role}>", f"</{role}>")]


def parse_roles(text: str, roles: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """Split ``text`` into ``<role>...</role>`` sections; return the sections and the roles that failed."""
    out, failed = {}, []
    for role in roles:
        found = _sections(text, role)
        if len(found) != 1 or not found[0].strip():
            out[role] = ""
            failed.append(role)
        else:
            out[role] = found[0].strip()
    return out, failed


def format_hint(roles: tuple[str, ...]) -> str:
    return "Answer with one section per role, in this order: " + " ".join(f"<{r}>...</{r}>" for r in roles) + "."


class CentralizedEnv:
    """One agent (``central``) acting for every role of an environment: one turn per step, or (over a
    :class:`~accord.envs.single_turn.SingleTurnEnv`) one completion for every role of a single-turn task."""

    simultaneous = False   # one agent: turn-based and simultaneous coincide; False lets AT-GRPO run it

    def __init__(self, inner: Env, parse_penalty: float = 1.0):
        if parse_penalty < 0:
            raise ValueError(f"parse_penalty={parse_penalty} is subtracted per failed role; give a value >= 0")
        self.inner, self.parse_penalty = inner, parse_penalty
        self.name = f"{inner.name}-centralized"
        self.agents = (CENTRAL,)
        self.max_turns = inner.max_turns
        self.roles = tuple(inner.agents)
        self._obs: dict[str, str] = {}

    def tasks(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        return self.inner.tasks(split, limit=limit, seed=seed)

    def instructions(self, agent: str) -> str:
        parts = [f"You act for every role of a team: {', '.join(self.roles)}."]
        parts += [f"Role {r}: {self.inner.instructions(r)}" for r in self.roles]
        parts.append(format_hint(self.roles))
        return "\n".join(parts)

    def _observation(self) -> str:
        # roles usually see the same state: show each line once, under the first role that sees it
        seen: set[str] = set()
        parts = []
        for r in self.roles:
            lines = [ln for ln in self._obs[r].splitlines() if ln not in seen]
            seen.update(lines)
            parts.append(f"[{r}]\n" + "\n".join(lines))
        return "\n".join(parts)

    def reset(self, task: dict[str, Any], seed: int = 0) -> dict[str, str]:
        self._obs = dict(self.inner.reset(task, seed=seed))
        return {CENTRAL: self._observation()}

    def acting(self) -> tuple[str, ...]:
        return self.agents

    def step(self, actions: dict[str, str]) -> StepResult:
        if set(actions) != {CENTRAL}:
            raise ValueError(f"centralized env takes one action under {CENTRAL!r}, got {sorted(actions)}")
        sections, failed = parse_roles(actions[CENTRAL] if isinstance(actions[CENTRAL], str) else "", self.roles)
        team, local, info = -self.parse_penalty * len(failed), 0.0, {"parse_failures": len(failed)}
        done = False
        if self.inner.simultaneous:
            res = self.inner.step(sections)
            team += float(res.team_reward)
            local += sum(float(v) for v in res.local_rewards.values())
            self._obs, done = dict(res.observations), res.done
            info.update(res.info)
        else:
            for role in self.roles:
                res = self.inner.step({role: sections[role]})
                team += float(res.team_reward)
                local += sum(float(v) for v in res.local_rewards.values())
                self._obs, done = dict(res.observations), res.done
                info.update(res.info)
                if done:
                    break
        info["parse_failures"] = len(failed)
        return StepResult({CENTRAL: self._observation()}, team, {CENTRAL: local}, done, info)

    # --- the single-turn form (rows / prompt / reward), over a SingleTurnEnv's batched form -------------
    def rows(self, split: str, limit: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        return self.inner.tasks(split, limit=limit, seed=seed)

    def prompt(self, agent: str, row: dict[str, Any]) -> list[dict[str, str]]:
        """One user message: every role's prompt of the wrapped single-turn task, then the format."""
        views = []
        for r in self.roles:
            msgs = self.inner.prompt(r, row)
            views.append(f"Role {r}:\n" + "\n".join(m["content"] for m in msgs))
        text = f"You write for every role of a team: {', '.join(self.roles)}.\n\n" + "\n\n".join(views)
        return [{"role": "user", "content": text + "\n\n" + format_hint(self.roles)}]

    def reward(self, *, prompts: dict, completions: dict, agents: tuple[str, ...], **columns) -> list[float]:
        """The wrapped task's team reward of the parsed sections (one batched call), minus ``parse_penalty``
        per failed role."""
        texts = completions[CENTRAL]
        parsed = [parse_roles(t, self.roles) for t in texts]
        inner_completions = {r: [p[0][r] for p in parsed] for r in self.roles}
        inner_prompts: dict[str, list[str]] = {r: [] for r in self.roles}
        rows = [dict(zip(columns, vals)) for vals in zip(*columns.values())] if columns else [{} for _ in texts]
        for row in rows:
            for r in self.roles:
                inner_prompts[r].append(self.inner.prompt(r, row)[-1]["content"] if row else "")
        base, _ = self.inner.score(rows, inner_prompts, inner_completions, agents=self.roles)
        return [float(v) - self.parse_penalty * len(p[1]) for v, p in zip(base, parsed)]

    def clone(self) -> "CentralizedEnv":
        c = CentralizedEnv(self.inner.clone(), self.parse_penalty)
        c._obs = dict(self._obs)
        return c


def centralize(env, parse_penalty: float = 1.0):
    """The centralized baseline of an environment, a :class:`CentralizedEnv` over it. A one-turn one (a
    single-turn task's :class:`~accord.envs.single_turn.SingleTurnEnv`) comes back as a
    :class:`~accord.envs.single_turn.SingleTurnEnv` again, over the wrapper's single-turn form, so that
    its batched team reward stays one call per step."""
    from accord.envs.single_turn import SingleTurnEnv

    if isinstance(env, SingleTurnEnv):
        return SingleTurnEnv(CentralizedEnv(env, parse_penalty=parse_penalty))
    return CentralizedEnv(env, parse_penalty=parse_penalty)

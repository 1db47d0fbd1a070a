"""Rollout integrity audit (``training.audit`` and ``accord audit RUN_DIR``).

Group-relative methods fail silently when a group is not what the method says it is: a group that pools
different prompts, a state shown to the model that is not the state stepped, a reward attached to the
wrong sample. The training curve still moves. The audit checks every group of every step against what the
rollout recorded *when it scored*, independently of the code that later turned scores into samples.

What the rollouts record (only with ``training.audit`` on; :class:`AuditRecorder`), per scored unit (a
joint action of a single-turn step or of a tree node, an AT-GRPO candidate), under a key the unit's
samples carry in ``extra["audit_keys"]``:

- ``texts``: a hash of each agent's text exactly as it was passed to the reward or ``env.step``;
- ``states``: per agent, a fingerprint of what was scored: the instance id passed to the reward
  (single-turn) or the environment object stepped (multi-turn: :func:`state_fingerprint` of the clone,
  taken just before ``step``);
- ``reward``: the value it got (team reward; AT-GRPO: ``alpha * team + local``).

Each sample carries ``extra["prompt_state"]``, the fingerprint of the instance or environment its prompt
was rendered from, and ``extra["prompt_shared"]``, whether the method samples its group from one prompt.

The checks, per group (a violation names the group, its agent, instance and turn):

1. **prompt**: where the method says the group's members come from one prompt (single-turn MAGRPO,
   simultaneous tree nodes, the first agent of a turn-based tree node, AT-GRPO), their prompt-token hashes
   are equal; and every member of a group is the same agent on the same instance;
2. **state**: the state each member's action was scored on is the state its prompt was rendered from;
3. **reward**: each member's text is the text that was scored under its keys, and its reward is the
   (mean) reward recorded for them.

Reported besides, not violations: the share of singleton groups and of all-equal groups (every member has
the same return: every advantage is 0, no learning signal).

``training.audit``: ``record`` (default) writes ``RUN_DIR/audit/step_N.jsonl`` every step and logs
``audit/*`` metrics; ``accord audit RUN_DIR`` checks the files after the fact. ``strict`` also checks every
step as it happens and stops the run on the first violation with a one-line :class:`AuditError`. ``off``
records nothing. The cost is measured by ``bench/coop_overheads.py`` and given in docs/audit.md.

Environments whose state holds something that cannot be walked (a sandbox handle, a large dataset) may
define ``fingerprint() -> str``; the audit then uses it instead of walking the object.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from accord import metric_names as mn

logger = logging.getLogger(__name__)

AUDIT_DIR = "audit"
# a step's records larger than this are not read: a step writes some megabytes (its samples and scored units)
MAX_STEP_BYTES = 1 << 30
_MAX_DEPTH = 16


class AuditError(RuntimeError):
    """A rollout broke an invariant of its method; the message names the group and what differs."""


def text_hash(text: str) -> str:
    """A short hash of a text (16 hex digits)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def ids_hash(ids: Iterable[int]) -> str:
    """A short hash of a token-id sequence."""
    return hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=8).hexdigest()


def state_fingerprint(obj: Any) -> str:
    """A hash of an object's state, equal for an object and a faithful copy of it: ``obj.fingerprint()`` when
    it defines one, else a walk over its attributes (dicts and sets in sorted order, numpy arrays by their
    bytes, random generators by their state; functions, modules and other opaque objects by their type)."""
    fn = getattr(obj, "fingerprint", None)
    if callable(fn) and not isinstance(obj, type):
        return str(fn())
    h = hashlib.blake2b(digest_size=8)
    _feed(h, obj, 0, set())
    return h.hexdigest()


def _feed(h, x: Any, depth: int, seen: set[int]) -> None:
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(x).__name__}:{x!r};".encode("utf-8", "surrogatepass"))
        return
    if depth > _MAX_DEPTH or id(x) in seen:
        h.update(f"<{type(x).__name__}>".encode())
        return
    seen = seen | {id(x)}
    if isinstance(x, dict):
        h.update(b"{")
        for key in sorted(x, key=repr):
            _feed(h, key, depth + 1, seen)
            _feed(h, x[key], depth + 1, seen)
        h.update(b"}")
    elif isinstance(x, (list, tuple)):
        h.update(b"[" if isinstance(x, list) else b"(")
        for item in x:
            _feed(h, item, depth + 1, seen)
        h.update(b"]")
    elif isinstance(x, (set, frozenset)):
        h.update(b"<set>")
        for item in sorted(x, key=repr):
            _feed(h, item, depth + 1, seen)
    elif isinstance(x, random.Random):
        _feed(h, x.getstate(), depth + 1, seen)
    elif type(x).__module__ == "numpy" and hasattr(x, "tobytes"):   # arrays and numpy scalars
        h.update(f"{getattr(x, 'dtype', '')}{getattr(x, 'shape', '')}".encode())
        h.update(x.tobytes())
    elif type(x).__name__ == "Generator" and hasattr(x, "bit_generator"):   # numpy's random generator
        _feed(h, x.bit_generator.state, depth + 1, seen)
    elif callable(getattr(x, "fingerprint", None)) and not isinstance(x, type):
        h.update(str(x.fingerprint()).encode())
    elif hasattr(x, "__dict__") and not isinstance(x, type) and not callable(x):
        h.update(type(x).__qualname__.encode())
        _feed(h, vars(x), depth + 1, seen)
        for slot in getattr(type(x), "__slots__", ()):
            _feed(h, getattr(x, slot, None), depth + 1, seen)
    elif hasattr(type(x), "__slots__") and not callable(x):
        h.update(type(x).__qualname__.encode())
        for slot in type(x).__slots__:
            _feed(h, getattr(x, slot, None), depth + 1, seen)
    else:   # functions, classes, modules, locks, C objects: their type only
        h.update(f"<{type(x).__qualname__}>".encode())


@dataclass
class AuditRecorder:
    """What a rollout scored during one step (see the module docstring); :meth:`take` empties it."""

    scored: dict[str, dict] = field(default_factory=dict)
    prefix: str = ""   # set by the trainer for a dynamic-sampling round after the first (its keys start over)

    def score(self, key: str, texts: dict[str, str], states: dict[str, str], reward: float) -> None:
        """Record one scored unit: each agent's text as passed to the reward or step, the state each was
        scored on, and the reward."""
        key = self.prefix + key
        if key in self.scored:
            raise RuntimeError(f"audit key {key!r} recorded twice in one step (a rollout bug)")
        self.scored[key] = {"texts": {a: text_hash(t) for a, t in texts.items()}, "states": dict(states),
                            "reward": float(reward)}

    def take(self) -> dict[str, dict]:
        out, self.scored = self.scored, {}
        return out


def sample_record(s, prompt_hashes: dict | None = None) -> dict:
    """The audit's view of one training sample; ``prompt_hashes``: the hashes of prompts seen before (samples
    of one prompt share it), filled in as it goes."""
    if prompt_hashes is None:
        prompt = ids_hash(s.prompt_ids)
    else:
        key = tuple(s.prompt_ids)
        prompt = prompt_hashes.get(key)
        if prompt is None:
            prompt = prompt_hashes[key] = ids_hash(key)
    return {"group": s.group, "agent": s.agent, "turn": s.turn, "instance": s.instance,
            "prompt": prompt, "completion": text_hash(s.completion_text),
            "reward": float(s.extra.get("team_reward", s.reward)), "ret": float(s.ret),
            "keys": list(s.extra.get("audit_keys", [])), "prompt_state": s.extra.get("prompt_state"),
            "prompt_shared": bool(s.extra.get("prompt_shared", False))}


@dataclass
class Violation:
    step: int
    group: int
    kind: str        # prompt | state | reward | record
    where: str       # agent, instance, turn
    problem: str

    def line(self) -> str:
        return f"audit: step {self.step}, group {self.group} ({self.where}): {self.kind}: {self.problem}"


@dataclass
class StepAudit:
    """The result of auditing one step."""

    step: int
    groups: int
    singleton: int
    all_equal: int
    violations: list[Violation]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def audit_records(step: int, samples: list[dict], scored: dict[str, dict], instances: list[str] | None = None,
                  first_only: bool = False) -> StepAudit:
    """Check one step's sample records against what was scored (see the module docstring)."""
    groups: dict[int, list[dict]] = defaultdict(list)
    for rec in samples:
        groups[rec["group"]].append(rec)
    violations: list[Violation] = []
    singleton = all_equal = 0
    for gid, members in groups.items():
        head = members[0]
        inst = instances[head["instance"]] if instances else head["instance"]
        where = f"agent {head['agent']!r}, instance {inst!r}, turn {head['turn']}"

        def bad(kind: str, problem: str) -> None:
            violations.append(Violation(step, gid, kind, where, problem))

        singleton += len(members) == 1
        all_equal += len(members) > 1 and len({m["ret"] for m in members}) == 1
        for m_idx, m in enumerate(members):
            if (m["agent"], m["instance"]) != (head["agent"], head["instance"]):
                bad("prompt", f"member {m_idx} is agent {m['agent']!r} on instance {m['instance']!r}: a group pools "
                              "one agent's samples of one instance")
            elif head["prompt_shared"] and m["prompt"] != head["prompt"]:
                bad("prompt", f"member {m_idx}'s prompt tokens differ from member 0's, but the method samples this "
                              "group from one prompt")
            if not m["keys"]:
                bad("record", f"member {m_idx} has no scored joint action or step recorded")
                continue
            rewards = []
            for key in m["keys"]:
                unit = scored.get(key)
                if unit is None:
                    bad("record", f"member {m_idx}'s scored unit {key!r} was never recorded")
                    break
                if unit["states"].get(m["agent"]) != m["prompt_state"]:
                    bad("state", f"member {m_idx}'s action was scored on state {unit['states'].get(m['agent'])} but "
                                 f"its prompt shows state {m['prompt_state']} (the environment stepped is not the "
                                 "one rendered in the prompt)")
                    break
                if unit["texts"].get(m["agent"]) != m["completion"]:
                    bad("reward", f"member {m_idx}'s completion is not the text scored under {key!r}")
                    break
                rewards.append(unit["reward"])
            else:
                expected = sum(rewards) / len(rewards)
                if not _close(expected, m["reward"]):
                    bad("reward", f"member {m_idx} carries reward {m['reward']!r} but its own text scored "
                                  f"{expected!r} (a reward attached to another sample)")
            if first_only and violations:
                break
        if first_only and violations:
            break
    return StepAudit(step, len(groups), singleton, all_equal, violations)


def step_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / AUDIT_DIR / f"step_{step:06d}.jsonl"


def write_step(run_dir: Path, step: int, samples: list[dict], scored: dict[str, dict], instances: list[str]) -> Path:
    """``RUN_DIR/audit/step_N.jsonl``: a header line (instances, and how many scored units and samples follow, so
    that a file cut back at a line's end is found), then one line per scored unit and per sample."""
    path = step_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"kind": "step", "step": step, "instances": instances, "scored": len(scored),
                         "samples": len(samples)})]
    lines += [json.dumps({"kind": "scored", "key": key, **unit}) for key, unit in scored.items()]
    lines += [json.dumps({"kind": "sample", **rec}) for rec in samples]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def prune_after(run_dir: Path, step: int) -> None:
    """Resume: drop the records of steps after the checkpoint (they are re-run; a shorter resumed run must not
    leave the killed run's later steps for ``accord audit``)."""
    for path in (Path(run_dir) / AUDIT_DIR).glob("step_*.jsonl"):
        number = path.stem[len("step_"):]
        if number.isdigit() and int(number) > step:   # a user's copy (step_backup.jsonl) is not a step's file
            path.unlink()


def read_step(path: Path) -> tuple[int, list[dict], dict[str, dict], list[str]]:
    """Step, sample records, scored units and instances of one step's file; :class:`AuditError` when the file is
    damaged, or holds fewer records than its header counts (cut short)."""
    step, samples, scored, instances, counts = -1, [], {}, [], {}
    if not path.is_file() or path.stat().st_size > MAX_STEP_BYTES:   # a pipe never ends; a huge file fills memory
        what = "not a regular file" if not path.is_file() else f"larger than {MAX_STEP_BYTES >> 20} MiB"
        raise AuditError(f"{path} is {what}, not a step's records; move it out of {AUDIT_DIR}/ or delete it")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise AuditError(f"{path} is not UTF-8 text (byte {err.start}); the file is damaged: delete it or re-run the "
                         "step") from err
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            kind = rec.pop("kind")
            if kind == "step":
                step, instances = rec["step"], rec["instances"]
                counts = {k: int(rec[k]) for k in ("scored", "samples") if k in rec}
            elif kind == "scored":
                scored[rec.pop("key")] = rec
            else:
                samples.append(rec)
        except (ValueError, RecursionError, KeyError, AttributeError, TypeError, OverflowError) as err:
            raise AuditError(f"{path}:{n} is not an audit record ({type(err).__name__}); the file is damaged: "
                             "delete it or re-run the step") from err
    if not isinstance(step, int) or isinstance(step, bool):
        raise AuditError(f"{path}'s header gives the step as {str(step)[:40]!r}, not a number; the file is damaged: "
                         "delete it or re-run the step")
    held = {"scored": len(scored), "samples": len(samples)}
    for kind, want in counts.items():
        if held[kind] != want:
            raise AuditError(f"{path} holds {held[kind]} {kind} records but its header counts {want} (cut short?); the "
                             "file is damaged: delete it or re-run the step")
    return step, samples, scored, instances


def audit_step(run, step: int, samples: list, rows: list[dict], acc) -> None:
    """The trainer's audit phase of one step (``training.audit`` record or strict): write the records, log the
    ``audit/*`` metrics and, in strict mode, stop on the first violation."""
    recorder = run.rollout.recorder
    if recorder is None:
        return
    hashes: dict[tuple, str] = {}
    records = [sample_record(s, hashes) for s in samples]
    scored = recorder.take()
    instances = [str(r.get("id", i)) for i, r in enumerate(rows)]
    write_step(run.run_dir, step, records, scored, instances)
    strict = run.cfg.training.audit == "strict"
    result = audit_records(step, records, scored, instances, first_only=strict)
    if result.violations and strict:
        raise AuditError(result.violations[0].line() + "; training.audit=strict stops here (see docs/audit.md)")
    for v in result.violations[:3]:
        logger.warning("%s", v.line())
    acc.add(mn.AUDIT_VIOLATIONS, float(len(result.violations)))
    if result.groups:
        acc.add(mn.AUDIT_SINGLETON_GROUP_SHARE, result.singleton / result.groups)
        acc.add(mn.AUDIT_ALL_EQUAL_GROUP_SHARE, result.all_equal / result.groups)


@dataclass
class RunAudit:
    steps: int = 0
    groups: int = 0
    singleton: int = 0
    all_equal: int = 0
    violations: list[Violation] = field(default_factory=list)


def audit_run(run_dir: str | Path) -> RunAudit:
    """Check every recorded step of a run (``accord audit RUN_DIR``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise AuditError(f"{run_dir} is not a directory; pass the run directory of `accord train`")
    files = sorted((run_dir / AUDIT_DIR).glob("step_*.jsonl"))
    if not files:
        raise AuditError(f"{run_dir} has no audit records ({AUDIT_DIR}/step_N.jsonl); train with training.audit=record "
                         "(the default) or strict to record them")
    out = RunAudit()
    seen: dict[int, Path] = {}
    records = []
    for path in files:
        step, samples, scored, instances = read_step(path)
        if step in seen:   # a copy beside the records (step_1.jsonl of step_000001.jsonl) would count twice
            raise AuditError(f"{path} and {seen[step]} both hold the records of step {step}; keep one")
        seen[step] = path
        if step < 0:   # an empty file: not even its header
            raise AuditError(f"{path} holds no records of a step (cut short?); the file is damaged: delete it or "
                             "re-run the step")
        records.append((path, step, samples, scored, instances))
    for path, step, samples, scored, instances in records:
        try:
            result = audit_records(step, samples, scored, instances)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:   # a record without its fields
            raise AuditError(f"{path} holds a record without its fields ({type(err).__name__}: {err}); the file is "
                             "damaged: delete it or re-run the step") from err
        out.steps += 1
        out.groups += result.groups
        out.singleton += result.singleton
        out.all_equal += result.all_equal
        out.violations += result.violations
    return out


def format_run_audit(run_dir: Path, result: RunAudit, limit: int = 20) -> str:
    """A short report of :func:`audit_run`."""
    g = max(result.groups, 1)
    by_kind: dict[str, int] = defaultdict(int)
    for v in result.violations:
        by_kind[v.kind] += 1
    lines = [f"audit of {run_dir}: {result.steps} steps, {result.groups} groups",
             f"  singleton groups: {result.singleton} ({result.singleton / g:.1%})",
             f"  all-equal groups (zero advantage): {result.all_equal} ({result.all_equal / g:.1%})",
             f"  violations: {len(result.violations)}" + (
                 " (" + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())) + ")" if by_kind else "")]
    lines += [f"  {v.line()}" for v in result.violations[:limit]]
    if len(result.violations) > limit:
        lines.append(f"  ... and {len(result.violations) - limit} more")
    return "\n".join(lines) + "\n"

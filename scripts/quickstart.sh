#!/usr/bin/env bash
# Set up .venv, train the default job (two SmolLM2-135M writers, MAGRPO), then write its report.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
. .venv/bin/activate
accord train "$@"   # runs/writing-pydoc; again: pass --overwrite (deletes it) or --resume runs/writing-pydoc
accord report runs/writing-pydoc

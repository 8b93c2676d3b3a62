#!/usr/bin/env bash
# Wheels for running the GPU checks (run_gpu_checks.sh) on a machine with no package index:
# one whose Python already has a CUDA torch, transformers, accelerate, safetensors, tokenizers,
# numpy, psutil, py-cpuinfo, msgpack, nvidia-ml-py, ninja, einops and pytest (a typical CUDA
# image), but not the rest of what the checks import. Run it HERE (with network), copy DEST
# there, and run_gpu_checks.sh installs from it.
#
#   bash tests/gpu/offline_wheels.sh [DEST (default .whl)] [that machine's Python, e.g. 3.12]
#
# Versions are this venv's, so the GPU machine runs what CI tests. deepspeed and antlr4 ship
# only source on PyPI: they are built here into pure-Python wheels (deepspeed with no op
# compiled, as on CPU). pydantic-core is the one compiled wheel: it is fetched for that Python.
set -euo pipefail
dest=${1:-.whl}
target_python=${2:-3.12}
python=${PYTHON:-.venv/bin/python}
version() { "$python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p "$dest"
pure=(hydra-core omegaconf pydantic annotated-types typing-inspection hjson)
built=(deepspeed antlr4-python3-runtime)
pins() { for name in "$@"; do echo "$name==$(version "$name")"; done; }
"$python" -m pip download -q --no-deps --only-binary=:all: -d "$dest" $(pins "${pure[@]}")
"$python" -m pip download -q --no-deps --only-binary=:all: -d "$dest" \
    --python-version "$target_python" --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "pydantic-core==$(version pydantic-core)"
DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps -w "$dest" $(pins "${built[@]}")
ls -l "$dest"

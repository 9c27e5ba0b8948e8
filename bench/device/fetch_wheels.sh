#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for AReaL 1.0.4's archon actor (~4.5 MB; the machine has torch and
# transformers, no network), for its Python 3.12, into DIR (default .bench-wheels, git-ignored).
set -euo pipefail
dir="${1:-.bench-wheels}"
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dir" areal==1.0.4 pydantic==2.12.5 pydantic_core==2.41.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 hydra-core==1.4.0.dev1 omegaconf==2.4.0.dev2 lark==1.3.1 colorlog==6.12.0 \
  tenacity==9.2.1 orjson==3.13.0 pybase64==1.5.1 torchdata==0.11.0 flask==3.1.3 blinker==1.9.0 \
  itsdangerous==2.2.0
du -sh "$dir"

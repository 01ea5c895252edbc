#!/usr/bin/env bash
# Decode engine throughput on the CPU backend (batch x s x commit mode) and slot memory.
# Run with `bazel run //tests/bench:engine`; results: tests/bench/results/engine_cpu.{json,md}.
set -euo pipefail
rf=${RUNFILES_DIR:-$0.runfiles}
top=${BUILD_WORKSPACE_DIRECTORY:?run through bazel run}
commit=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p "$top/tests/bench/results"
"$rf/kdecode/tests/bench/engine_bench" "$top/tests/bench/results/engine_cpu" "$commit" \
  "bazel run //tests/bench:engine" "$rf/kdecode/deploy/demo-model"
cat "$top/tests/bench/results/engine_cpu.md"

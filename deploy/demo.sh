#!/usr/bin/env bash
# Runs kdecode on the embedded default: the CPU backend with the bundled demo model.
# Extra arguments go to `kdecode run` (e.g. --max-tokens 64 --temperature 0.8 --seed 7).
set -euo pipefail
here=${RUNFILES_DIR:-$0.runfiles}/kdecode
[[ -d $here ]] || here=.
model=$here/deploy/demo-model
echo "kdecode: CPU backend, bundled model $(basename "$model") (preset demo, seed 1)" >&2
exec "$here/worker/kdecode" run --model "$model" --prompt-ids 1,17,42,99,7,256,3 --max-tokens 32 "$@"

#!/usr/bin/env bash
# Runs the GPU checks and benchmarks on a machine with an NVIDIA GPU, from binaries built
# elsewhere with Bazel (the GPU machine needs no Bazel):
#   tests/cuda/run_device.sh BIN_DIR OUT_DIR [ORACLE_DIR]
#   BIN_DIR: kda_check, cuda_test, cuda_bench, gemm_bench, gemm_lt_bench (the backend's other
#            test binaries as they come)
#   OUT_DIR: results (kda_h200.json/.md, kimi48b_cuda_h200.json/.md, gemm_h200.json/.md,
#            gemm_lt_h200.json/.md) and logs
#   ORACLE_DIR: the oracle checkpoints (tiny/, small/) for cuda_test; default $KDECODE_ORACLE,
#               else ../shared/oracle beside the checkout
# Checks run first (against float64 references), then compute-sanitizer memcheck and
# racecheck on the check-only mode, then the benchmarks. Any failure stops the script.
# A build packed by tests/cuda/pack.sh (KD_PACK_ORACLE for the oracle), re-checked and timed
# without the sanitizers (KD_KDA_SANITIZE=0 KD_CUDA_TEST_SANITIZE=0, below), from the checkout:
#   tar -C /tmp -xJf PACK.tar.xz
#   LD_LIBRARY_PATH=/tmp/pk/lib KD_KDA_SANITIZE=0 KD_CUDA_TEST_SANITIZE=0 \
#     KD_COMMIT=C tests/cuda/run_device.sh /tmp/pk/bin OUT /tmp/pk/oracle
set -euo pipefail
bin=${1:?BIN_DIR}
out=${2:?OUT_DIR}
commit=${KD_COMMIT:-unknown}
mkdir -p "$out"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
san=/usr/local/cuda/bin/compute-sanitizer
# KD_KDA_SANITIZE=0 skips the sanitizers on kda_check; KD_KDA_BENCH=0 runs its checks only
# (no timing table): for runs that re-check kernels already timed and sanitized.
# KD_KDA_CHECK_NEW (passed through to kda_check) limits its checks, e.g. to sanitize a change
# to some kernels alone in less time: 1 the split and one-pass verify, 2 the CUDA-core
# kernels, 3 the one-kernel tensor-core verify, 4 the one-pass verify.
# KD_KDA_PROFILE=B,T makes kda_check skip its checks and time that one size only (to run it
# under a profiler: ncu --clock-control none -k regex:"tc_prologue|verify_split" ...).
if [[ ${KD_KDA_SANITIZE:-1} != 0 && -x $san ]]; then
  "$san" --tool memcheck --error-exitcode 3 "$bin/kda_check" "$out" "$commit" check 2>&1 | tail -4 | tee "$out/memcheck.txt"
  "$san" --tool racecheck --error-exitcode 3 "$bin/kda_check" "$out" "$commit" check 2>&1 | tail -4 | tee "$out/racecheck.txt"
elif [[ ! -x $san ]]; then
  echo "compute-sanitizer not found at $san" | tee "$out/memcheck.txt"
fi
if [[ ${KD_KDA_BENCH:-1} != 0 ]]; then
  "$bin/kda_check" "$out" "$commit" 2>&1 | tee "$out/kda_check.log"
else
  "$bin/kda_check" "$out" "$commit" check 2>&1 | tee "$out/kda_check.log"
fi

# The CUDA backend against the CPU backend (random models: every op, every commit mode, fp32
# and bf16 activations) and the oracle checkpoints (kernels/cuda/cuda_test.cu). memcheck
# on the quick mode (random models only), racecheck on the skinny GEMM's checks, the conv +
# prepare cases and the prefill recurrence's cases, then the full run.
oracle=${3:-${KDECODE_ORACLE:-$(cd "$(dirname "$0")/../.." && pwd)/../shared/oracle}}
# KD_CUDA_TEST_SANITIZE=0 skips these sanitizer runs (for a run that re-checks a build whose kernels were
# sanitized before: with KD_KDA_SANITIZE=0 the script's checks take a few minutes instead of many)
if [[ ${KD_CUDA_TEST_SANITIZE:-1} != 0 && -x $san ]]; then
  "$san" --tool memcheck --error-exitcode 3 "$bin/cuda_test" "$oracle" quick > "$out/cuda_test_memcheck.log" 2>&1 \
    || { tail -40 "$out/cuda_test_memcheck.log"; exit 3; }
  tail -4 "$out/cuda_test_memcheck.log"
  # racecheck on the skinny GEMM's checks alone (its shared-memory sums; the quick mode's models
  # take minutes under racecheck)
  "$san" --tool racecheck --error-exitcode 3 "$bin/cuda_test" "$oracle" skinny > "$out/cuda_test_racecheck.log" 2>&1 \
    || { tail -40 "$out/cuda_test_racecheck.log"; exit 3; }
  tail -4 "$out/cuda_test_racecheck.log"
  # and on the conv + prepare cases and the one-pass verify's store hint (cuda_test's fused mode)
  "$san" --tool racecheck --error-exitcode 3 "$bin/cuda_test" "$oracle" fused \
    > "$out/cuda_test_racecheck_conv.log" 2>&1 || { tail -40 "$out/cuda_test_racecheck_conv.log"; exit 3; }
  tail -4 "$out/cuda_test_racecheck_conv.log"
  # and on the prefill recurrence's forms (cuda_test's prefill mode; the quick mode's cuBLASLt checks end in
  # an internal error of racecheck)
  "$san" --tool racecheck --error-exitcode 3 "$bin/cuda_test" "$oracle" prefill \
    > "$out/cuda_test_racecheck_prefill.log" 2>&1 || { tail -40 "$out/cuda_test_racecheck_prefill.log"; exit 3; }
  tail -4 "$out/cuda_test_racecheck_prefill.log"
fi
"$bin/cuda_test" "$oracle" 2>&1 | tee "$out/cuda_test.log"

# The Kimi-Linear-48B KDA preset: the decode step against its roofline and end-to-end tokens/s
# (tests/bench/cuda_bench.cu; random bf16 weights built on the machine), when built.
if [[ -x $bin/cuda_bench ]]; then
  "$bin/cuda_bench" "$out/kimi48b_cuda_h200" "$commit" "tests/cuda/run_device.sh BIN OUT" 2>&1 | tee "$out/cuda_bench.log"
fi

# The decode-step matrix products of the same preset: cuBLAS against the skinny GEMM kernel's
# forms (tests/bench/gemm_bench.cu), when built.
if [[ -x $bin/gemm_bench ]]; then
  "$bin/gemm_bench" "$out/gemm_h200" "$commit" "tests/cuda/run_device.sh BIN OUT" 2>&1 | tee "$out/gemm_bench.log"
fi

# The same products at 2-512 rows: cublasGemmEx against cuBLASLt's algorithms and the backend's
# table (tests/bench/gemm_lt_bench.cu, kernels/cuda/gemm_lt.cuh), when built.
if [[ -x $bin/gemm_lt_bench ]]; then
  "$bin/gemm_lt_bench" "$out/gemm_lt_h200" "$commit" "tests/cuda/run_device.sh BIN OUT" \
    > "$out/gemm_lt_bench.log" 2>&1 || { tail -20 "$out/gemm_lt_bench.log"; exit 1; }
  grep -E "gemmEx|MISMATCH|DONE" "$out/gemm_lt_bench.log"
fi

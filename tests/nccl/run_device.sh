#!/usr/bin/env bash
# The NCCL state handoff on a machine with 2 NVIDIA GPUs, from binaries built elsewhere with
# Bazel (the GPU machine needs no Bazel):
#   tests/nccl/run_device.sh BIN_DIR OUT_DIR
#   BIN_DIR: kdecode, kdctl, peer_bench and lib/ (the non-CUDA shared libraries they need;
#            a .xz there is unpacked first)
#   OUT_DIR: results (nccl_device.json, peer.json, the summary) and logs/
# 1. peer_bench: sum64 on the GPU vs the CPU, the cudaMemcpyPeer floor, NCCL in one process.
# 2. device_test.py: token equality NCCL == gRPC == aggregated, faults, the handoff benchmark.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): point-to-point transfers do not use it.
set -euo pipefail
bin=$(cd "${1:?BIN_DIR}" && pwd)
out=${2:?OUT_DIR}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
lib=/tmp/kd-nccl-lib
mkdir -p "$lib"
for f in "$bin"/lib/*; do
  case $f in
    *.xz) [[ -e $lib/$(basename "${f%.xz}") ]] || xz -dc "$f" > "$lib/$(basename "${f%.xz}")" ;;
    *) [[ -e $lib/$(basename "$f") ]] || cp "$f" "$lib/" ;;
  esac
done
export LD_LIBRARY_PATH=$lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$out/gpus.txt"
nvidia-smi topo -m > "$out/topo.txt" 2>&1 || true
"$bin/peer_bench" | tee "$out/peer.json" || echo "peer_bench failed" >&2
# NCCL between two processes, one GPU each (as the workers run): idle gaps between transfers or
# none, plain cudaMalloc buffers or ncclMemAlloc buffers registered with the communicator
# (zero-copy), and the copy-engine path; each bounded, a hang costs 30 s.
: > "$out/xproc.jsonl"
for v in "0 0" "20 0" "0 2" "20 2"; do
  timeout 30 "$bin/peer_bench" xproc 44892160 $v 1 2>>"$out/xproc.err" | tee -a "$out/xproc.jsonl" || echo "xproc $v failed" >&2
done
NCCL_P2P_USE_CUDA_MEMCPY=1 timeout 30 "$bin/peer_bench" xproc 44892160 0 0 1 2>>"$out/xproc.err" \
  | sed 's/^{/{"ce":1,/' | tee -a "$out/xproc.jsonl" || echo "xproc with NCCL_P2P_USE_CUDA_MEMCPY=1 failed" >&2
NCCL_DEBUG=INFO timeout 30 "$bin/peer_bench" xproc 44892160 0 0 1 2>&1 | grep -E " via |Connected" | head -6 > "$out/xproc_transport.txt" || true
python3 "$(dirname "$0")/device_test.py" --bin "$bin" --out "$out" --floor-json "$out/peer.json" "${@:3}"

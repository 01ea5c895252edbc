#!/usr/bin/env bash
# Installs the Debian 12 packages kdecode builds and tests with, only those missing
# (idempotent: a second run installs nothing and needs no network). The CUDA toolkit is
# expected at /usr/local/cuda (part of the build machine image, not a Debian package).
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java            # the build (offline Bazel 4.2.3)
  pkg-config gcc g++ python3-numpy            # compilers; numpy for the float64 reference
  libjansson-dev libopenblas-dev libxxhash-dev # JSON, CPU BLAS, checksums
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev protobuf-compiler  # the API
  check                                        # unit tests
)

missing=()
for p in "${packages[@]}"; do
  [[ $p == \#* ]] && continue
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present" >&2
fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: the CUDA toolkit is missing at /usr/local/cuda (needed to build kernels/cuda)" >&2
  exit 1
fi

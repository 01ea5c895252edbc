#!/usr/bin/env bash
# Installs the Debian 12 packages kdecode builds and tests with, only those missing
# (idempotent: a second run installs nothing and needs no network). The CUDA toolkit is
# expected at /usr/local/cuda (part of the build machine image, not a Debian package).
set -euo pipefail

packages=(
  bazel-bootstrap bazel-rules-java            # the build (offline Bazel 4.2.3)
  pkg-config gcc g++ python3-numpy            # compilers; numpy for the float64 reference
  libjansson-dev libopenblas-dev libxxhash-dev libmicrohttpd-dev # JSON, CPU BLAS, checksums, metrics HTTP
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev protobuf-compiler  # the API
  python3-protobuf python3-grpcio              # the API's reflection data (proto/gen_reflection.py); Python test clients
  check yamllint                               # unit tests; YAML lint (deploy/k8s)
  clang libclang-rt-14-dev                     # fuzz tests (libFuzzer, ASan, UBSan): tests/fuzz
  libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc # reference C++ gRPC server: tests/bench/grpc
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

# Node.js dependencies of the service tests (tests/service/node: @grpc/grpc-js, proto-loader),
# pinned by its package-lock.json; installed once, from the npm registry.
node_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/service/node"
if [[ -f $node_dir/package-lock.json && ! -d $node_dir/node_modules ]]; then
  if command -v npm >/dev/null 2>&1; then
    echo "setup: installing the Node test dependencies (npm ci --prefix tests/service/node)" >&2
    npm ci --prefix "$node_dir" --ignore-scripts --no-audit --no-fund
  else
    echo "setup: npm is missing; the Node service tests need it (apt-get install nodejs npm)" >&2
    exit 1
  fi
fi

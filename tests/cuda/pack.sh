#!/usr/bin/env bash
# Packs GPU binaries built here (Bazel) for a GPU machine that has the NVIDIA driver and CUDA toolkit but not
# this build's Debian packages: the binaries (stripped) and the shared libraries they load that are neither
# the C runtime nor CUDA's own (cudart, cuBLAS, cuBLASLt, NCCL and the driver come from that machine), as
# pk/bin and pk/lib in one xz tarball.
#   tests/cuda/pack.sh OUT.tar.xz [BINARY ...]
# Without binaries: kda_check, cuda_test, cuda_bench, gemm_bench, gemm_lt_bench, kdecode and kdctl from
# bazel-bin (build them first). A pack of several binaries (and the oracle) fits a device call's size limit when
# they are built with SASS only, in an output base of their own (kernels/cuda.bzl; the default build's outputs
# stay): bazel --output_base=DIR build --define=cuda_slim=1 TARGETS, then pass DIR's bazel-bin paths here (five
# binaries and the oracle: 20 MB, where kda_check and cuda_bench alone took 15 MB with their PTX). KD_PACK_ORACLE=DIR: that folder (the oracle checkpoints, tiny/ and small/) as
# pk/oracle too, for cuda_test on a machine without the checkout's ../shared. On the GPU machine:
#   tar -C DIR -xJf OUT.tar.xz
#   LD_LIBRARY_PATH=DIR/pk/lib:/usr/local/cuda/lib64 tests/cuda/run_device.sh DIR/pk/bin RESULTS [DIR/pk/oracle]
set -euo pipefail
out=$(realpath -m "${1:?usage: tests/cuda/pack.sh OUT.tar.xz [BINARY ...]}")
shift
oracle=${KD_PACK_ORACLE:+$(realpath -m "$KD_PACK_ORACLE")}
if [[ -n $oracle && ! ( -d $oracle/tiny && -d $oracle/small ) ]]; then
  echo "pack: KD_PACK_ORACLE=$KD_PACK_ORACLE: no tiny/ and small/ there" >&2
  exit 1
fi
bins=()
for b in "$@"; do bins+=("$(realpath -m "$b")"); done
cd "$(dirname "$0")/../.."
if ((${#bins[@]} == 0)); then
  bins=(bazel-bin/kernels/kda_check bazel-bin/kernels/cuda_test bazel-bin/tests/bench/cuda_bench
        bazel-bin/tests/bench/gemm_bench bazel-bin/tests/bench/gemm_lt_bench bazel-bin/worker/kdecode
        bazel-bin/worker/kdctl)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/pk/bin" "$tmp/pk/lib"
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "pack: $b: not built" >&2; exit 1; }
  cp -L "$b" "$tmp/pk/bin/"
  chmod u+w "$tmp/pk/bin/$(basename "$b")"
  strip "$tmp/pk/bin/$(basename "$b")"
  # the libraries it loads, by path (ldd: "name => path (address)")
  while read -r lib; do
    case $(basename "$lib") in
      libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++* | libgcc_s*) ;;
      libcuda.so* | libcudart* | libcublas* | libnccl* | libnvidia*) ;;
      *) cp -Ln "$lib" "$tmp/pk/lib/" ;;
    esac
  done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
done
[[ -z $oracle ]] || cp -rL "$oracle" "$tmp/pk/oracle"
# xz at its strongest: the binaries' fat images repeat across them (about 2/3 of the default level's size)
tar -C "$tmp" -cf - pk | xz -9e -T0 > "$out"
echo "pack: $out ($(du -h "$out" | cut -f1)): $(ls "$tmp/pk/bin" | tr '\n' ' ')+ $(ls "$tmp/pk/lib" | wc -l) libraries$(
  [[ -d $tmp/pk/oracle ]] && echo " + the oracle")"

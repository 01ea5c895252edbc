#!/usr/bin/env bash
# Builds tests/fuzz/api_fuzz.c with clang (libFuzzer + ASan + UBSan) against worker/api.c and
# the protobuf-c code generated from proto/kdecode/v1/decoder.proto, writes a seed corpus
# (tests/fuzz/seeds.txt through `protoc --encode`) and fuzzes for a bounded time.
# Fails on a crash, a leak, undefined behaviour, a broken invariant or a timeout.
# Environment: FUZZ_SECONDS (default 20), FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail

rf=${RUNFILES_DIR:-${TEST_SRCDIR:-$0.runfiles}}/kdecode
[[ -d $rf ]] || rf=$(cd "$(dirname "$0")/../.." && pwd)
tmp=${TEST_TMPDIR:-$(mktemp -d)}
artifacts=${TEST_UNDECLARED_OUTPUTS_DIR:-$tmp}
seconds=${FUZZ_SECONDS:-20}

cc=
for c in /usr/bin/clang /usr/bin/clang-14; do [[ -x $c ]] && { cc=$c; break; }; done
[[ -n $cc ]] || { echo "api_fuzz: clang is missing (deploy/setup.sh installs it)" >&2; exit 1; }

# 1. the fuzzer binary
bin=$tmp/api_fuzz
san=('-fsanitize=fuzzer,address,undefined' -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
inc=(-I"$rf" -I"$rf/proto" -I"$rf/kernels/include")
compile() { # src obj extra-flags...
  local src=$1 obj=$2; shift 2
  "$cc" -std=gnu11 -Wall -Wextra "$@" "${san[@]}" "${inc[@]}" -c "$src" -o "$obj"
}
t0=$SECONDS
compile "$rf/tests/fuzz/api_fuzz.c" "$tmp/api_fuzz.o" -Werror & p1=$!
compile "$rf/worker/api.c" "$tmp/api.o" & p2=$!
compile "$rf/proto/kdecode/v1/decoder.pb-c.c" "$tmp/decoder.pb-c.o" & p3=$!
wait $p1; wait $p2; wait $p3
"$cc" "${san[@]}" -o "$bin" "$tmp/api_fuzz.o" "$tmp/api.o" "$tmp/decoder.pb-c.o" -lprotobuf-c
echo "api_fuzz: built with $("$cc" --version | head -1) in $((SECONDS - t0)) s" >&2

# 2. the seed corpus
corpus=$tmp/corpus
mkdir -p "$corpus"
n=0
while IFS=$'\t' read -r first type text; do
  [[ -z $first || $first == \#* ]] && continue
  [[ $first =~ ^[0-9a-fA-F]{2}$ ]] || { echo "api_fuzz: bad first byte '$first' in seeds.txt" >&2; exit 1; }
  n=$((n + 1))
  { printf '%b' "\\x$first"
    printf '%s\n' "$text" | /usr/bin/protoc --encode="kdecode.v1.$type" --proto_path="$rf/proto" \
      "$rf/proto/kdecode/v1/decoder.proto"
  } >"$corpus/seed-$n" || { echo "api_fuzz: cannot encode seed $n: $text" >&2; exit 1; }
done <"$rf/tests/fuzz/seeds.txt"
echo "api_fuzz: $n seeds" >&2

# 3. fuzz (the seeds run first: a seed that breaks an invariant fails at once)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$tmp"
# shellcheck disable=SC2086
"$bin" -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" ${FUZZ_ARGS:-} "$corpus" 2>&1 | tail -n 60 >"$tmp/log" || {
  cat "$tmp/log" >&2
  echo "api_fuzz: FAILED; the failing input is in $artifacts (crash-*/leak-*/timeout-*)" >&2
  for f in "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*; do
    [[ -f $f ]] && { echo "== $f (hex):" >&2; od -An -tx1 -v "$f" | head -n 20 >&2; }
  done
  exit 1
}
cat "$tmp/log" >&2
echo "api_fuzz: no findings in ${seconds} s" >&2

#!/usr/bin/env bash
# trace_ab.sh: an A/B of two builds of onepass_trace (tests/bench/trace/onepass_trace.cu, built by hand from two
# trees; for times, built without -DKD_KDA_TRACE: the kernels as the backend compiles them) in one run on the GPU
# machine: each binary twice, alternated, on all SMs and on KD_GREEN_SMS SMs (default 88: an H200's bandwidth an SM
# on an H100, tests/bench/results/h200_proxy_h100.md), then one table of the faster of each pair's times and their
# ratio. Takes ~10 s for B = 128 512 at every window.
#   tests/bench/trace/trace_ab.sh A_BIN B_BIN [B ...]     (env: GREEN=88, "" for all SMs only; T=4|8 for one window;
#                                                           SCHEDS=1, the load orders, as KD_TRACE_SCHEDS)
# Prints the raw lines first (prefixed "##" per run), then the table.
# Kernels a change should leave alone: tests/bench/trace/ptx_same.py on nvcc -ptx of kernels/cuda/kda.cu from each tree.
set -euo pipefail
a=${1:?usage: trace_ab.sh A_BIN B_BIN [B ...]}
b=${2:?usage: trace_ab.sh A_BIN B_BIN [B ...]}
shift 2
sizes=("$@")
((${#sizes[@]})) || sizes=(128 512)
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for g in "" ${GREEN-88}; do
  for bin in "$a" "$b" "$a" "$b"; do
    tag=$([[ $bin == "$a" ]] && echo A || echo B)
    echo "## sms=${g:-all} $tag" >> "$raw"
    env KD_GREEN_SMS="$g" ${T:+KD_TRACE_T=$T} KD_TRACE_SCHEDS="${SCHEDS:-1}" "$bin" "${sizes[@]}" | grep '^B=' | cut -c1-200 >> "$raw"
  done
done
cat "$raw"
awk '
  /^##/ { split($2, s, "="); sms = s[2]; tag = $3; next }
  match($0, /^B= *[0-9]+ T=[0-9] [a-z]+ +sched [0-9] +[0-9.]+ us/) {
    line = substr($0, RSTART, RLENGTH); gsub(/B= */, "B=", line); n = split(line, f, / +/)
    key = sms " " substr(f[1], 3) " " substr(f[2], 3) " " f[3] " " f[5]; us = f[6] + 0
    if (!(key in seen)) { seen[key] = 1; order[++nk] = key }
    k2 = key SUBSEP tag
    if (!(k2 in best) || us < best[k2]) best[k2] = us
  }
  END {
    print "| SMs | B | T | step | order | A us | B us | B / A |"
    print "|---|---|---|---|---|---|---|---|"
    for (i = 1; i <= nk; i++) {
      split(order[i], k, " ")
      ta = best[order[i], "A"]; tb = best[order[i], "B"]
      printf "| %s | %s | %s | %s | %s | %.1f | %.1f | %.3f |\n", k[1], k[2], k[3], k[4], k[5], ta, tb, (ta > 0 ? tb / ta : 0)
    }
  }' "$raw"

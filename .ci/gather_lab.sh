#!/usr/bin/env bash
# Build and run the gather bandwidth lab (.ci/gather_lab.cu) once, on the H200:
#   OUT_DIR=/some/dir bash .ci/gather_lab.sh        (OUT_DIR defaults to $OUT, else /tmp/gather_lab)
# Leaves in $OUT_DIR: gather_lab (the binary), build.log, gather_lab.log (nvidia-smi + every line).
# If the full run dies (a sticky CUDA error, e.g. a TMA fault, ends the process), the CTA/TMA
# families are re-run one per process, so one faulting design does not hide the others.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-${OUT:-/tmp/gather_lab}}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gather_lab.log"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit \
  --format=csv >"$LOG" 2>&1 || true
nvcc -O3 -std=c++17 -arch=sm_90a -o "$OUT_DIR/gather_lab" .ci/gather_lab.cu >"$OUT_DIR/build.log" 2>&1
rc=$?
cat "$OUT_DIR/build.log"
if [ "$rc" -ne 0 ]; then
  echo "gather_lab: build failed (rc=$rc)" | tee -a "$LOG"
  exit "$rc"
fi

timeout 240 "$OUT_DIR/gather_lab" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "gather_lab: full run exited rc=$rc; re-running the CTA/TMA families one per process" | tee -a "$LOG"
  for fam in cta_plain bulk_store tma_load tma_full_u64_s16 tma_full_u64_s8 tma_full_u32 tma_full_u16; do
    echo "== $fam ==" | tee -a "$LOG"
    timeout 40 "$OUT_DIR/gather_lab" "$fam" 2>&1 | tee -a "$LOG"
    echo "(rc=${PIPESTATUS[0]})" | tee -a "$LOG"
  done
fi
exit "$rc"

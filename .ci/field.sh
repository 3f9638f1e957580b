#!/usr/bin/env bash
# What a user's run gets on a GPU runner, measured as issue 29 asks (the device tool, one call):
#   bash .ci/field.sh STAGE...     stages: cold warm ops startup profile lookalike bench basebench surfaces knee redzone
#   mutants gputests tier nvfp4
# cold: every cache removed (listed in the log), then the README's main job as printed
#   (bash .ci/setup && .venv/bin/mlafuzz fuzz --budget 60): its "first case done" line and case count.
# warm: the same command again. ops: each op with default flags. lookalike: the constexpr-specializing
# Triton convert (tests/support/planted/vllm_like_convert.py) beside ours. bench/basebench: bench --fuzz
# of this tree and of BASELINE (a `git archive` tarball), one machine. Logs go to $OUT/field.log.
set -u
OUT=${OUT:-/tmp/mlafuzz-field}; W=${W:-/tmp/mlafuzz-field-work}; mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1
M=.venv/bin/mlafuzz
L=tests/support/planted/vllm_like_convert.py
CACHES="$HOME/.triton/cache $HOME/.cache/mlafuzz $HOME/.cache/torch_extensions $HOME/.nv/ComputeCache ${TRITON_CACHE_DIR:-} ${MLAFUZZ_CACHE:-} ${TORCH_EXTENSIONS_DIR:-} .venv"
LOG="$OUT/field.log"
say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }
run() {  # run NAME LIMIT CMD...: the command's stderr+stdout to $W/NAME.log, its last lines to the log
  local name=$1 limit=$2; shift 2
  local t0=$EPOCHREALTIME
  timeout "$limit" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  printf '%s rc=%s %.1fs\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{print b-a}')" >>"$LOG"
  grep -E "first case|workers on|summary|cases|seed|finding|OOB|ACCEPTED|busy|error|Error|built|build" "$W/$name.log" \
    | grep -v "^\s*$" | tail -n "${TAIL:-8}" | sed 's/^/    /' >>"$LOG"
}
pack() { wait; tar czf "$OUT/field-logs.tgz" -C "$W" . 2>/dev/null; }
trap pack EXIT
for s in "$@"; do
  case "$s" in
    cold)
      say "cold: removing $CACHES"; rm -rf $CACHES
      run setup 300 bash .ci/setup
      run cold 150 $M fuzz --budget 60 ;;
    warm) run warm 150 $M fuzz --budget 60 ;;
    ops) for op in ${OPS:-convert gather writer}; do run "op-$op" 120 $M fuzz --op "$op" --out "$W/op-$op"; done ;;  # default flags: 60 s
    startup)  # where a warm start's seconds go: torch import, CUDA context, then a short run's first case
      run startup-torch 60 .venv/bin/python -c "import time; t=time.time(); import torch; a=time.time(); torch.zeros(1, device='cuda'); b=time.time(); import triton; c=time.time(); print(f'build import torch {a-t:.2f}s, cuda init {b-a:.2f}s, import triton {c-b:.2f}s')"
      run startup-run 90 $M fuzz --cases 400 --out "$W/startup" ;;
    profile) TAIL=20 run profile 300 .venv/bin/python .ci/profile_fuzz.py --cases 300 --top 20 ;;
    lookalike)
      run ours-convert 90 $M fuzz --op convert --budget "${LOOK_SECONDS:-30}" --out "$W/oc"
      run lookalike 120 $M fuzz --op convert --impl "convert=$L:convert" --budget "${LOOK_SECONDS:-30}" --out "$W/vl" ;;
    bench) TAIL=8 run bench 300 $M bench --fuzz --seconds "${BENCH_SECONDS:-15}" --workers 8 $(for o in ${BENCH_OPS:-}; do echo --op $o; done) ;;
    basebench)
      mkdir -p "$W/base" && tar xf "${BASELINE:?BASELINE=FILE.tar}" -C "$W/base"
      run base_install 180 .venv/bin/python -m pip install -q --no-deps --no-build-isolation --target "$W/basepkg" "$W/base"
      TAIL=8 run basebench 300 env PYTHONPATH="$W/basepkg" .venv/bin/python -m mlafuzz.harness.cli bench --fuzz \
        --seconds "${BENCH_SECONDS:-15}" --workers 8 ;;
    surfaces)
      for op in plan dcp dcp_peer; do run "surf-$op" 60 $M fuzz --op "$op" --budget 15 --out "$W/s-$op"; done
      run surf-step-2026-10 90 $M fuzz --op step --revision 2026-10 --budget 20 --out "$W/s-step" ;;
    knee) for n in 4 8 12 15; do run "knee-$n" 60 $M fuzz --op gather --workers "$n" --budget 15 --shrink-budget 0 --out "$W/k$n"; done ;;
    redzone)
      run redzone 150 $M fuzz --op convert --impl "convert=$L:convert_prefix_bug" --redzone --workers 8 --budget 30 \
        --shrink-budget 0 --out "$W/rz" ;;
    mutants) TAIL=40 run mutants "${MUTANT_LIMIT:-400}" $M mutants --device cuda $(for o in ${MUTANT_OPS:-}; do echo --op $o; done) --budget-per-mutant "${MUTANT_BUDGET:-10}" --shrink-budget "${MUTANT_SHRINK:-3}" --out "$W/mutants" ;;
    gputests) TAIL=12 run gputests "${TESTS_LIMIT:-400}" .venv/bin/python -m pytest -v -m gpu -p no:cacheprovider -n "${TESTS_N:-8}" --timeout 150 -rfE --tb=short tests ;;
    tier)  # the release tier on CUDA (docs/vllm.md), the extracted trees carried in .mlafuzz-cache
      TAIL=40 run tier "${TIER_LIMIT:-400}" env MLAFUZZ_CACHE="$PWD/.mlafuzz-cache" bash .ci/vllm_releases.sh --device cuda \
        --jobs "${TIER_JOBS:-4}" --workers 2 --cases "${TIER_CASES:-convert=200,dcp=200,plan=1000}" --out "$W/releases" ;;
    nvfp4)  # issue 39's GPU figures: each nvfp4 op at default flags, and the bench rows beside fp8_ds_mla's
      for op in nvfp4_gather nvfp4_writer; do run "op-$op" 60 $M fuzz --op "$op" --budget 30 --out "$W/op-$op"; done
      TAIL=20 run bench-nvfp4 180 $M bench --op gather --op nvfp4_gather --op writer --op nvfp4_writer ;;
    *) echo "unknown stage $s" >>"$LOG" ;;
  esac
done
cat "$LOG"

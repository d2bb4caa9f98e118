#!/usr/bin/env bash
# The GPU half of the validation (and the measured profiles and throughput figures), in phases that
# each fit one 10-minute device command. Run from the repository root on the GPU machine:
#   bash validation/run_gpu.sh PHASE OUT_DIR
# Phases: diagnose (a replay with step timings, GPU clocks and CPU counters), check (GPU tests, decode-split benchmark, qwen3-0.6b profile), calibrate (serving runs on slices
# disjoint from the validation ones; QPS_CAL, QPS_CAL_MOONCAKE), tp-and-profiles (needs 2 GPUs for its TP
# parts), throughput, offline, capacity, online (QPS_* in the environment; validation/README.md gives the
# values used and how they were chosen), kv-pressure (the ~70 % Azure run and the Mooncake run with a KV
# cache small enough that the scheduler preempts: KV_BLOCKS_AZURE, default 300 blocks, 76 preemptions in
# simulation; KV_BLOCKS_MOONCAKE, default 600, 27 preemptions), prefill-heavy (the synthetic ~2k/~28 trace at
# ~30, ~70 and ~95 % of the ~111 req/s the simulator puts its saturation at: QPS_PH_LIGHT 35, QPS_PH_70 80,
# QPS_PH_95 106 by default), decode-heavy (the synthetic ~300/~350 bursty trace, QPS_DH_*), model-8b (qwen3-8b on
# the Azure slices, QPS_8B_*), longctx and longout (the held-out long-context and
# long-output traces on an H100, QPS_LC_*, QPS_LO_*). RUN_TAG (default empty) is appended to
# every run folder's name, so that a phase can be repeated into the same OUT_DIR (real-vs-real spread).
# Needs validation/traces/ (python validation/make_traces.py) and, where polars is missing, its
# wheels in .whl/ (see validation/README.md). Every step runs even if an earlier one failed.
set -u
phase=$1
out=$2
tag=${RUN_TAG:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && ! python3 -c 'import polars' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else  # keep a caller's path: it may hold the wheels it installed (replacing it lost polars in every replay)
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
step() { echo "=== $* ($(date +%T))"; "$@" || echo "!!! failed: $*"; }
# ONLY (default empty: every run of the phase) names the runs of a phase to make, e.g. ONLY="e-prefill-p70 d-azure-kv",
# so that the runs of several phases fit into one 10-minute device command.
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
pack() { tar -czf "$out/$1.tgz" -C "$out" "$1" && rm -r "${out:?}/$1"; }
# replay_loads PREFIX TRACE MODEL NAME:QPS:LIMIT...: one online replay of validation/traces/TRACE per load, into
# PREFIX-NAME (plus RUN_TAG), packed; the loads ONLY leaves out are skipped.
replay_loads() {
  local prefix=$1 trace=$2 model=$3 spec name qps limit
  shift 3
  for spec in "$@"; do
    IFS=: read -r name qps limit <<< "$spec"
    want "$prefix-$name" || continue
    step timeout 170 python3 -m engine.replay "validation/traces/$trace" --qps "$qps" --limit "$limit" \
      --model "$model" --load-format dummy --max-model-len 16384 --out "$out/$prefix-$name$tag" --quiet
    pack "$prefix-$name$tag"
  done
}

case "$phase" in
check)
  step timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu_kernels.py tests/engine/test_gpu_llm.py -k "not tp2"
  step timeout 60 python3 benchmarks/decode_splits.py --json "$out/decode-splits.json"
  step timeout 180 python3 -m sim.profile --model qwen3-0.6b --gpu h200 --out "$out/qwen3-0.6b.json"
  ;;
calibrate)
  # Serving step logs for the cost model, from trace slices the validation never replays.
  step timeout 150 python3 -m engine.replay validation/traces/azure_conv_calibration.parquet --qps "$QPS_CAL" --limit 2400 \
    --model qwen3-0.6b --load-format dummy --max-model-len 16384 --out "$out/cal-azure" --quiet
  pack cal-azure
  step timeout 150 python3 -m engine.replay validation/traces/mooncake_calibration.parquet --qps "$QPS_CAL_MOONCAKE" --limit 200 \
    --model qwen3-0.6b --load-format dummy --max-model-len 65536 --allow-long-max-model-len --out "$out/cal-mooncake" --quiet
  pack cal-mooncake
  ;;
diagnose)
  # The ~70% Azure run again, with per-step host/GPU times, GPU clocks and host CPU counters sampled beside it.
  mkdir -p "$out/diag"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 250 > "$out/diag/smi.csv" &
  smi=$!
  (while true; do echo "$(date +%s.%N) $(head -1 /proc/stat) mhz $(awk '/MHz/ {s+=$4; n++} END {print s/n}' /proc/cpuinfo)"; sleep 0.25; done) > "$out/diag/cpu.txt" &
  cpu=$!
  date +%s.%N > "$out/diag/start.txt"
  step timeout 170 python3 -m engine.replay validation/traces/azure_conv_slice.parquet --qps "$QPS_70" --limit 2200 \
    --model qwen3-0.6b --load-format dummy --max-model-len 16384 --step-timings --out "$out/diag/b-azure-p70" --quiet
  kill $smi $cpu
  tar -czf "$out/diag.tgz" -C "$out" diag && rm -r "$out/diag"
  ;;
tp-and-profiles)
  step timeout 180 python3 -m sim.profile --model qwen3-0.6b --gpu h200 --out "$out/qwen3-0.6b.json"
  if [ "$ngpu" -ge 2 ]; then
    step timeout 240 python3 -m pytest -q -x -s -p no:cacheprovider tests/engine/test_gpu_llm.py -k tp2
    step timeout 150 python3 benchmarks/throughput.py --model qwen3-8b --tensor-parallel-size 2 --json "$out/throughput-qwen3-8b-tp2.json"
    step timeout 200 python3 -m sim.profile --model qwen3-8b --gpu h200 --tensor-parallel-size 2 --repeats 3 --out "$out/qwen3-8b-tp2.json"
  fi
  step timeout 200 python3 -m sim.profile --model qwen3-8b --gpu h200 --repeats 3 --out "$out/qwen3-8b.json"
  ;;
throughput)
  step timeout 300 python3 benchmarks/throughput.py --peer --json "$out/throughput-qwen3-0.6b.json"
  ;;
offline)
  # (a) the throughput benchmark's workload, offline, both policies (temperature 0.6 as in the benchmark).
  for policy in mixed nano; do
    step timeout 180 python3 -m engine.replay validation/traces/bench_workload.parquet --offline --model qwen3-0.6b \
      --load-format dummy --max-model-len 4096 --temperature 0.6 --policy "$policy" --out "$out/a-bench-$policy" --quiet
    pack "a-bench-$policy"
  done
  ;;
capacity)
  # Capacity of the Azure slice measured on the GPU: its first 3000 requests offline.
  step timeout 180 python3 -m engine.replay validation/traces/azure_conv_slice.parquet --offline --limit 3000 \
    --model qwen3-0.6b --load-format dummy --max-model-len 16384 --out "$out/b-azure-offline" --quiet
  pack b-azure-offline
  ;;
online)
  # (b) Azure at three loads (QPS_LIGHT, QPS_70, QPS_95 given in the environment), (c) Mooncake at one.
  replay_loads b-azure azure_conv_slice.parquet qwen3-0.6b "light:$QPS_LIGHT:600" "p70:$QPS_70:2200" "p95:$QPS_95:2700"
  if want c-mooncake; then
  step timeout 200 python3 -m engine.replay validation/traces/mooncake_slice.parquet --qps "$QPS_MOONCAKE" --limit 200 \
    --model qwen3-0.6b --load-format dummy --max-model-len 65536 --allow-long-max-model-len --out "$out/c-mooncake$tag" --quiet
  pack "c-mooncake$tag"
  fi
  ;;
prefill-heavy)
  replay_loads e-prefill prefill_heavy.parquet qwen3-0.6b \
    "light:${QPS_PH_LIGHT:-35}:3000" "p70:${QPS_PH_70:-80}:3000" "p95:${QPS_PH_95:-106}:3000"
  ;;
decode-heavy)
  # (f) The synthetic decode-heavy trace (~300-token prompts, ~350-token outputs, bursty gamma arrivals) at
  # ~25, ~70 and ~95 % of the ~62 req/s where the simulator fills max_num_seqs: QPS_DH_LIGHT 15, QPS_DH_70 43,
  # QPS_DH_95 58 by default.
  replay_loads f-decode decode_heavy.parquet qwen3-0.6b \
    "light:${QPS_DH_LIGHT:-15}:1000" "p70:${QPS_DH_70:-43}:2000" "p95:${QPS_DH_95:-58}:2500"
  ;;
model-8b)
  # (g) A second model: qwen3-8b on the Azure slice at ~20 and ~70 % of the ~18 req/s the simulator puts its
  # saturation at (QPS_8B_LIGHT 4, QPS_8B_70 12.5), and its calibration slice (g-cal-azure-8b, QPS_8B_CAL 12.5).
  replay_loads g-azure-8b azure_conv_slice.parquet qwen3-8b "light:${QPS_8B_LIGHT:-4}:400" "p70:${QPS_8B_70:-12.5}:1200"
  # The prefill-heavy trace at ~70 % of the ~17 req/s the simulator saturates qwen3-8b at (QPS_8B_PH_70 12).
  replay_loads g-prefill-8b prefill_heavy.parquet qwen3-8b "p70:${QPS_8B_PH_70:-12}:1000"
  replay_loads g-cal azure_conv_calibration.parquet qwen3-8b "azure-8b:${QPS_8B_CAL:-12.5}:1200"
  ;;
longctx)
  # (i) The held-out long-context trace at ~70 and ~90 % of the ~10.5 req/s the H100 profile saturates it at
  # (QPS_LC_70 7.5, QPS_LC_90 9.5); on an H200 its knee is ~12.8 req/s (h-longctx-*, 9 and 11.5).
  replay_loads i-longctx heldout_longctx.parquet qwen3-0.6b "p70:${QPS_LC_70:-7.5}:600" "p90:${QPS_LC_90:-9.5}:600"
  ;;
longout)
  # (i) The held-out bursty long-output trace (outputs ~800) at ~70 and ~90 % of the ~25 req/s the H100 profile
  # saturates it at (QPS_LO_70 17.5, QPS_LO_90 22.5); on an H200 h-longout-* ran 16 and 20 req/s.
  replay_loads i-longout heldout_longout.parquet qwen3-0.6b "p70:${QPS_LO_70:-17.5}:800" "p90:${QPS_LO_90:-22.5}:800"
  ;;
kv-pressure)
  # (d) Preemptions and prefix hits under KV pressure: compare their counts, not only latencies.
  if want d-azure-kv; then
  step timeout 170 python3 -m engine.replay validation/traces/azure_conv_slice.parquet --qps "$QPS_70" --limit 2200 \
    --model qwen3-0.6b --load-format dummy --max-model-len 16384 --num-gpu-blocks "${KV_BLOCKS_AZURE:-300}" \
    --out "$out/d-azure-kv$tag" --quiet
  pack "d-azure-kv$tag"
  fi
  if want d-mooncake-kv; then
  step timeout 200 python3 -m engine.replay validation/traces/mooncake_slice.parquet --qps "$QPS_MOONCAKE" --limit 200 \
    --model qwen3-0.6b --load-format dummy --max-model-len 65536 --allow-long-max-model-len \
    --num-gpu-blocks "${KV_BLOCKS_MOONCAKE:-600}" --out "$out/d-mooncake-kv$tag" --quiet
  pack "d-mooncake-kv$tag"
  fi
  ;;
*)
  echo "unknown phase $phase (check, calibrate, tp-and-profiles, throughput, offline, capacity, online, kv-pressure, prefill-heavy, decode-heavy, model-8b, longctx, longout, diagnose)"
  exit 2 ;;
esac
ls -la "$out"

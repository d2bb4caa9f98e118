#!/bin/bash
# Where does TP=2 stop on NCCL? One device command, about 5 minutes, on a 2-GPU machine, from the repo root:
#   bash validation/tp_nccl/tp_hang_plan.sh            (writes A-env.txt A-check.log B-graphs.log C-eager.log [D-fail.log] smi.csv fr.txt under $OUT)
set -u
OUT=${OUT:-/tmp/tp-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
# Workplace rule: NVLink multicast off; exported here so every spawned rank inherits it (the probe prints it per rank).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV
# c10d: a short process-group timeout (the probe sets COLLECTIVE_TIMEOUT from PROBE_PG_TIMEOUT_S in every rank),
# tear the process down on a timed-out collective, record the last collectives of each rank and dump them on timeout.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=3 TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_NCCL_DESYNC_DEBUG=1
export TORCH_NCCL_TRACE_BUFFER_SIZE=4000 TORCH_FR_BUFFER_SIZE=4000
export PROBE_PG_TIMEOUT_S=60 PROBE_DUMP_EVERY=20 PROBE_SYNC=1
rm -rf /tmp/fr && mkdir -p /tmp/fr
{ nvidia-smi -L; nvidia-smi topo -m; df -h /dev/shm; hostname; getent hosts "$(hostname)"; ip -brief addr 2>/dev/null
  env | grep -E '^(NCCL|TORCH_|NVSHMEM|CUDA_VISIBLE)' | sort
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())'; } > "$OUT/A-env.txt" 2>&1
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -l 5 > "$OUT/smi.csv" 2>&1 &
SMI=$!
run() {  # run TAG LIMIT_S CMD...: the command in its own process group, killed whole at the limit; all stacks appended
  local tag=$1 limit=$2; shift 2
  rm -rf /tmp/stk; mkdir -p "/tmp/fr/$tag"; echo "=== $tag: $* (limit ${limit}s, t=${SECONDS}s)" > "$OUT/$tag.log"
  TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/tmp/fr/$tag/fr_ TORCH_FR_DUMP_TEMP_FILE=/tmp/fr/$tag/fr_ PROBE_STACK_DIR=/tmp/stk timeout -k 10 "$limit" "$@" >> "$OUT/$tag.log" 2>&1; echo "=== rc=$? t=${SECONDS}s" >> "$OUT/$tag.log"
  for f in /tmp/stk/*; do [ -s "$f" ] && { echo "=== faulthandler stacks: $f"; cat "$f"; }; done >> "$OUT/$tag.log" 2>/dev/null
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$OUT/$tag.log" 2>&1  # a leftover rank shows here
}
run A-check 60 python3 validation/tp_nccl/nccl_graph_check.py
run B-graphs 150 python3 validation/tp_nccl/tp_hang_probe.py            # as the tp2 test: default buckets, CUDA graphs on
run C-eager 60 python3 validation/tp_nccl/tp_hang_probe.py --eager      # same, no CUDA graphs at all
left=$((290 - SECONDS))
if [ "$left" -ge 60 ]; then  # error path: rank 0 fails after its decode-graph capture; does close() hang?
  PROBE_FAIL_AT=_capture_graphs run D-fail "$left" python3 validation/tp_nccl/tp_hang_probe.py
fi
kill "$SMI" 2>/dev/null
for d in /tmp/fr/*/; do  # flight-recorder dumps exist only where a collective timed out
  [ -n "$(ls "$d")" ] || continue; echo "=== $d: $(ls "$d")"
  python3 -m torch.distributed.flight_recorder.fr_trace "$d" -p fr_ -j --allow-incomplete-ranks --print_stack_trace
done > "$OUT/fr.txt" 2>&1
echo "plan done in ${SECONDS}s"

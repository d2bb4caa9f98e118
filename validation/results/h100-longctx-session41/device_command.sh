#!/bin/bash
# Session 41: held-out long-context trace on this GPU at ~70 % (twice) and ~90 % of the simulator's knee.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
{ nvidia-smi --query-gpu=name --format=csv,noheader | head -1; nproc; lscpu | grep "Model name"; } | tee $OUT/gpu.txt
run() { echo "=== $1 $(date +%T)"; s=$SECONDS
  timeout 170 python3 -m engine.replay validation/traces/heldout_longctx.parquet --qps $2 --limit 600 --model qwen3-0.6b \
    --load-format dummy --max-model-len 16384 --out $OUT/$1 --quiet > $OUT/$1.log 2>&1; echo "rc=$? $((SECONDS-s)) s"; tail -2 $OUT/$1.log
  tar -czf $OUT/$1.tgz -C $OUT $1 && rm -r $OUT/$1; }
run lc-p70 7.5; run lc-p90 9.5; run lc-p70b 7.5

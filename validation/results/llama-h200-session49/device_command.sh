#!/bin/bash
# A model no profile was measured for (llama-3.1-8b, dummy weights) on the Azure slice at two loads: held-out GPU runs
# for the roofline estimate's constants (validation/roofline_fit.py).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep "Model name"; echo "HEAD $(cat .devcmd/HEAD)"
for spec in light:4:400:azure_conv_slice mid:12:1200:azure_conv_slice pfx:6:600:prefill_heavy; do
  IFS=: read -r name qps limit tr <<< "$spec"; trace=validation/traces/$tr.parquet
  echo "=== $name $(date +%T)"
  timeout 200 python3 -m engine.replay $trace --qps $qps --limit $limit \
    --model llama-3.1-8b --load-format dummy --max-model-len 16384 --out $OUT/llama-$name --no-report 2>&1 | tail -22
done

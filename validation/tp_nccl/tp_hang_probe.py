"""TP=2 hang probe for nanoserve (diagnostic only; changes no engine file).

Run from the repository root:  [PROBE_SYNC=1] python3 validation/tp_nccl/tp_hang_probe.py [--eager] [--idle S] ...
Spawn re-imports this file as __mp_main__ in every worker before the worker starts, so everything at
top level (faulthandler, phase markers, a shorter process-group timeout) applies to every rank.
"""
import faulthandler
import os
import sys
import time
from datetime import timedelta

ROLE = "driver" if __name__ == "__main__" else f"worker-{os.getpid()}"
STACK_DIR = os.environ.get("PROBE_STACK_DIR", "/tmp/probe-stacks")
os.makedirs(STACK_DIR, exist_ok=True)
_STACKS = open(os.path.join(STACK_DIR, f"{ROLE}.txt"), "a")  # stays open: faulthandler writes from a C thread
faulthandler.enable(file=sys.stderr, all_threads=True)  # SIGSEGV/SIGABRT (e.g. the NCCL watchdog) dump all threads
faulthandler.dump_traceback_later(float(os.environ.get("PROBE_DUMP_EVERY", "30")), repeat=True, file=_STACKS)


def mark(msg: str) -> None:  # wall-clock stamps, so that the ranks' lines can be lined up
    now = time.time()
    print(f"[probe {ROLE} {time.strftime('%H:%M:%S', time.localtime(now))}.{int(now % 1 * 1000):03d}] {msg}",
          file=sys.stderr, flush=True)


mark("env " + " ".join(f"{k}={os.environ.get(k)}" for k in (
    "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "NCCL_DEBUG",
    "NCCL_P2P_DISABLE", "NCCL_CUMEM_ENABLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES")))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import engine.gpu.distributed as D  # noqa: E402
import engine.gpu.model_runner as MR  # noqa: E402
import engine.gpu.parallel as P  # noqa: E402
import engine.gpu.piecewise_graphs as PG  # noqa: E402

D.COLLECTIVE_TIMEOUT = timedelta(seconds=int(os.environ.get("PROBE_PG_TIMEOUT_S", "60")))
SYNC = os.environ.get("PROBE_SYNC") == "1"
# PROBE_FAIL_AT=_capture_graphs (any traced name) [PROBE_FAIL_ROLE=driver|worker]: raise there, to watch the error path.


def traced(owner, name, show=None):
    orig = getattr(owner, name)

    def wrapper(*args, **kwargs):
        label = f"{getattr(owner, '__name__', owner)}.{name}"
        mark(f"-> {label}")
        pending = sys.exc_info()
        if pending[0] is not None:  # called from an except block: say what failed before anything can hang
            import traceback

            mark(f"   (called while handling {pending[0].__name__}: {pending[1]})")
            traceback.print_exception(*pending, file=sys.stderr)
        started = time.monotonic()
        result = orig(*args, **kwargs)
        mark(f"<- {label} {time.monotonic() - started:.1f}s" + (f" {show(args, result)}" if show else ""))
        if name == os.environ.get("PROBE_FAIL_AT") and ROLE.startswith(os.environ.get("PROBE_FAIL_ROLE", "driver")):
            raise RuntimeError(f"probe: injected failure after {label} on {ROLE}")
        return result

    setattr(owner, name, wrapper)


traced(D, "_init")
traced(MR.ModelRunner, "_size_kv_cache",
       lambda a, r: f"num_gpu_blocks={r}" + (f" free/total={torch.cuda.mem_get_info(a[0].device)}"
                                             if a[0].device.type == "cuda" else ""))
traced(MR.ModelRunner, "_warmup_forward")
traced(MR.ModelRunner, "_capture_graphs", lambda a, r: f"decode graphs={len(a[0].graphs)}")
traced(PG.PiecewiseGraphs, "capture", lambda a, r: f"buckets={len(a[0].graphs)} pool={a[0].pool_bytes >> 20} MiB")
traced(MR.ModelRunner, "_warm_up_kernels")
traced(P.ParallelContext, "min_across_ranks", lambda a, r: f"mine={a[1]} min={r}")
traced(MR.ModelRunner, "close")
traced(dist, "destroy_process_group")
traced(D.TensorParallelRunner, "close")

_execute = MR.ModelRunner.execute
_count = [0]


def execute(self, inputs, sampling):
    n = _count[0] = _count[0] + 1
    kind = (f"graph bs={inputs.graph_batch_size}" if inputs.graph_batch_size else
            f"piecewise {inputs.piecewise_size}" if inputs.piecewise_size else "eager")
    loud = n <= 3 or n % 25 == 0
    if loud:
        mark(f"step {n}: {kind}, {inputs.input_ids.shape[0]} tokens, {inputs.num_logits} logits")
    out = _execute(self, inputs, sampling)
    if SYNC and self._is_cuda:  # a GPU-side stall (a graph replay, which no watchdog times) shows here, per step
        torch.cuda.synchronize()
        if loud:
            mark(f"step {n} done on the GPU")
    return out


MR.ModelRunner.execute = execute


def main() -> int:
    from engine.core.config_args import OneLineErrorParser

    ap = OneLineErrorParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--eager", action="store_true", help="enforce_eager: no CUDA graphs at all")
    ap.add_argument("--max-cuda-graph-tokens", type=int, default=None, help="0: decode graphs only")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--idle", type=float, default=0.0, help="seconds to wait between start-up and generate")
    args = ap.parse_args()
    from engine import LLM, SamplingParams
    from engine.core.model_config import ModelShape
    from engine.options import EngineOptions

    options = dict(load_format="dummy", tensor_parallel_size=2, max_model_len=args.max_model_len,
                   enforce_eager=args.eager, device=args.device)
    if args.max_cuda_graph_tokens is not None:
        options["max_cuda_graph_tokens"] = args.max_cuda_graph_tokens
    if args.max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = args.max_num_batched_tokens
    try:  # the engine's own checks, as engine.serve makes them: a bad option is one line, before any worker starts
        EngineOptions.from_kwargs(args.model, **options).check_model(ModelShape.load(args.model))
    except (ValueError, FileNotFoundError) as exc:
        ap.exit(2, f"error: {exc}\n")
    mark(f"LLM({args.model}, {options}); torch {torch.__version__}, nccl "
         f"{torch.cuda.nccl.version() if torch.cuda.is_available() else '-'}, {torch.cuda.device_count()} GPUs")
    llm = LLM(args.model, **options)
    mark(f"LLM ready, num_gpu_blocks={llm.runner.num_gpu_blocks}")
    if args.idle:
        time.sleep(args.idle)
        mark(f"idled {args.idle:.0f}s; workers alive: {[w.is_alive() for w in llm.runner._workers]}")
    g = torch.Generator().manual_seed(1)
    lengths = [n for n in (4, 33, 200, 700, 1300) if n < args.max_model_len - 20]
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in lengths]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    mark(f"generated {[len(o['token_ids']) for o in outs]} tokens, finish reasons "
         f"{[o.get('finish_reason') for o in outs]}; closing")
    llm.close()
    ok = all(len(o["token_ids"]) == 16 for o in outs)
    mark(f"closed; {'PASS' if ok else 'FAIL: some requests errored'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

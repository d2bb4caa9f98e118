"""Two-rank check of exactly the NCCL patterns nanoserve's TP uses, without the engine (diagnostic only).

python3 validation/tp_nccl/nccl_graph_check.py        # 2 GPUs, NCCL (as engine.gpu.distributed sets it up)
python3 validation/tp_nccl/nccl_graph_check.py --cpu  # gloo on CPU: syntax check only, skips the CUDA-graph steps
python3 validation/tp_nccl/nccl_graph_check.py --keep-graphs  # destroy with captured graphs alive (should hang)
Every step prints per rank with a wall-clock stamp; a step that never prints '<-' is where it stops.
"""
import faulthandler
import gc
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.core.config_args import OneLineErrorParser  # noqa: E402


def mark(rank, msg):
    now = time.time()
    print(f"[check r{rank} {time.strftime('%H:%M:%S', time.localtime(now))}.{int(now % 1 * 1000):03d}] {msg}",
          file=sys.stderr, flush=True)


def step(rank, name, fn):
    mark(rank, f"-> {name}")
    t = time.monotonic()
    out = fn()
    mark(rank, f"<- {name} {time.monotonic() - t:.2f}s {'' if out is None else out}")
    return out


def run(rank, world, port, cpu, keep_graphs=False):
    faulthandler.dump_traceback_later(20, repeat=True)  # to stderr, every 20 s, all threads
    dev = torch.device("cpu") if cpu else torch.device("cuda", rank)
    if not cpu:
        torch.cuda.set_device(dev)
    backend = "gloo" if cpu else "nccl"
    kwargs = {} if cpu else {"device_id": dev}
    step(rank, f"init_process_group({backend})", lambda: dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=30), **kwargs))
    ctl = step(rank, "new_group(gloo)", lambda: dist.new_group(backend="gloo", timeout=timedelta(seconds=30)))
    msg = [{"plan": list(range(5))} if rank == 0 else None]
    step(rank, "broadcast_object_list(gloo)", lambda: dist.broadcast_object_list(msg, src=0, group=ctl) or msg[0])
    dt = torch.float32 if cpu else torch.bfloat16
    for rows in (8, 8192):
        x = torch.full((rows, 1024), float(rank + 1), dtype=dt, device=dev)
        step(rank, f"all_reduce [{rows},1024]", lambda x=x: (dist.all_reduce(x), x[0, 0].item())[1])  # expect 3
    t = torch.tensor([100 + rank], dtype=torch.int64, device=dev)
    step(rank, "all_reduce MIN int64 + item", lambda: (dist.all_reduce(t, op=dist.ReduceOp.MIN), int(t.item()))[1])

    def gather():
        logits = torch.full((4, 75968), float(rank), dtype=dt, device=dev)
        parts = [torch.empty_like(logits) for _ in range(world)] if rank == 0 else None
        dist.gather(logits, parts, dst=0)
        return torch.cat(parts, -1).sum().item() if rank == 0 else None

    step(rank, "gather [4,75968] to rank 0", gather)
    if cpu:
        mark(rank, "CPU: CUDA-graph steps skipped")
    else:
        w = torch.randn(1024, 1024, dtype=dt, device=dev) / 32
        inp = torch.randn(512, 1024, dtype=dt, device=dev)
        graphs, outs, pool = {}, {}, None
        for bs in (512, 16):  # largest first into one pool, as _capture_graphs does

            def capture(bs=bs):
                nonlocal pool
                y = inp[:bs] @ w
                dist.all_reduce(y)  # eager warm-up, as before every capture in the engine
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool):
                    out = inp[:bs] @ w
                    dist.all_reduce(out)
                pool = pool or g.pool()
                graphs[bs], outs[bs] = g, out
                torch.cuda.synchronize()

            step(rank, f"capture mm+all_reduce bs={bs}", capture)

        def replay():
            for _ in range(50):
                for bs in graphs:
                    graphs[bs].replay()
            torch.cuda.synchronize()
            ref = inp[:16] @ w
            dist.all_reduce(ref)
            return f"max|graph-eager|={(outs[16] - ref).abs().max().item():.3g}"

        step(rank, "replay 2 graphs x50 (+sync)", replay)

        def mixed():  # a decode step: graph replay, then the LM head's eager gather, then the host waits
            for _ in range(50):
                graphs[16].replay()
                rows = outs[16][:4].contiguous()
                parts = [torch.empty_like(rows) for _ in range(world)] if rank == 0 else None
                dist.gather(rows, parts, dst=0)
                if rank == 0:
                    torch.cat(parts, -1).float().sum().item()
            torch.cuda.synchronize()

        step(rank, "graph replay + eager gather x50", mixed)

        def piecewise():  # many small graphs in one pool with eager work between, as PiecewiseGraphs does
            pieces = []
            buf = torch.randn(256, 1024, dtype=dt, device=dev)
            out = torch.empty_like(buf)

            def piece():
                torch.mm(buf, w, out=out)
                dist.all_reduce(out)
                buf.copy_(out)

            for _ in range(29):
                piece()  # eager warm-up
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool):
                    piece()
                pieces.append(g)
            for _ in range(20):
                for g in pieces:
                    g.replay()
                    buf.mul_(0.5)  # eager work between pieces (attention's place)
            torch.cuda.synchronize()
            return f"{len(pieces)} pieces"

        step(rank, "29 piecewise graphs x20 with eager work between", piecewise)
        if not keep_graphs:  # NCCL's destroy waits for every graph that captured a collective
            del graphs, outs
            step(rank, "free graphs", lambda: (gc.collect(), torch.cuda.synchronize()) and None)
    # Teardown in the engine's order: the worker destroys at once, the driver only after worker.join(30).
    if rank == 0:
        step(rank, "driver sleeps 8 s before destroying (as close() joins first)", lambda: time.sleep(8))
    step(rank, "destroy_process_group", dist.destroy_process_group)
    mark(rank, "PASS")
    faulthandler.cancel_dump_traceback_later()


def main(argv=None):
    parser = OneLineErrorParser(prog="python3 validation/tp_nccl/nccl_graph_check.py",
                                description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU: syntax check only, skips the CUDA-graph steps")
    parser.add_argument("--keep-graphs", action="store_true",
                        help="destroy the process group with captured graphs alive (should hang)")
    args = parser.parse_args(argv)  # unknown options were ignored: a typo ran the whole check without what it asked
    cpu = args.cpu
    print(f"torch {torch.__version__}; cuda {torch.version.cuda}; "
          f"nccl {torch.cuda.nccl.version() if torch.cuda.is_available() else '-'}; "
          f"GPUs {torch.cuda.device_count()}; "
          f"peer access 0->1 {torch.cuda.can_device_access_peer(0, 1) if torch.cuda.device_count() > 1 else '-'}",
          flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(2, port, cpu, args.keep_graphs), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()

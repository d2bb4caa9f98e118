"""Cheap launches of our Triton kernels where no CUDA graph applies (eager prefill and mixed steps).

``kernel[grid](...)`` goes through ``JITFunction.run`` on every call: it re-binds every argument,
derives its specialisation, formats that into a string cache key, and re-checks the globals the
kernel read. An eager 8,192-token mixed step launches a few hundred Triton kernels, so that host
work, not the GPU, set the step's time. ``BoundKernel`` pays it once per specialisation: the first
call compiles through Triton as usual and keeps the compiled kernel; later calls with the same key
call the compiled kernel's launcher directly.

The key holds everything that can change Triton's specialisation for our callers: the constexprs
and launch options, each tensor's dtype and 16-byte alignment, and for each integer whether it is 1,
a multiple of 16, or beyond int32 (Triton specialises integers and pointers on exactly these).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT32_MAX = 2**31 - 1


def _arg_key(arg) -> object:
    if isinstance(arg, int):  # bool too: Triton treats it as an integer of its own type, so keep the type
        return (type(arg), arg == 1, arg % 16 == 0, -_INT32_MAX - 1 <= arg <= _INT32_MAX)
    if isinstance(arg, float):
        return float
    return (arg.dtype, arg.data_ptr() % 16 == 0)


class BoundKernel:
    """A ``@triton.jit`` function called as ``bound(grid, args, constexprs, num_warps=..., num_stages=...)``.

    ``args`` are the runtime arguments in signature order and ``constexprs`` a dict of the constexpr
    arguments, which must be the signature's last parameters, in order (checked at the first call).
    """

    def __init__(self, fn) -> None:
        self.fn = fn
        self._compiled: dict[tuple, object] = {}

    def __call__(self, grid: tuple[int, ...], args: tuple, constexprs: dict, num_warps: int = 4,
                 num_stages: int | None = None) -> None:
        device = torch.cuda.current_device()
        key = self._key(device, args, constexprs, num_warps, num_stages)
        kernel = self._compiled.get(key)
        if kernel is None:
            self._bind(key, grid, args, constexprs, num_warps, num_stages)
            return
        _run(kernel, grid, torch._C._cuda_getCurrentRawStream(device), args, key[1])

    @staticmethod
    def _key(device: int, args: tuple, constexprs: dict, num_warps: int, num_stages: int | None) -> tuple:
        return (device, tuple(constexprs.values()), num_warps, num_stages, tuple(map(_arg_key, args)))

    def _bind(self, key, grid, args, constexprs, num_warps, num_stages) -> None:
        names = self.fn.arg_names
        expected = names[len(args):]
        if len(args) + len(constexprs) != len(names) or list(constexprs) != expected:
            raise TypeError(f"{self.fn.__name__}: constexprs must be the last parameters, in order: "
                            f"expected {expected}, got {list(constexprs)}")
        options = {"num_warps": num_warps}
        if num_stages is not None:
            options["num_stages"] = num_stages
        # Compiles (or loads from Triton's cache) and launches through Triton's own path this once.
        # Later launches skip Triton's launch hooks (only its own profiler sets them).
        self._compiled[key] = self.fn[grid](*args, **constexprs, **options)


def _run(kernel, grid: tuple[int, ...], stream: int, args: tuple, const_values: tuple) -> None:
    grid_1 = grid[1] if len(grid) > 1 else 1
    grid_2 = grid[2] if len(grid) > 2 else 1
    kernel.run(grid[0], grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, None, None, None,
               *args, *const_values)


@dataclass
class Launch:
    """One kernel launch with its arguments, built once and issued later (possibly many times)."""

    kernel: BoundKernel
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    num_warps: int = 4
    num_stages: int | None = None
    takes_kv_cache: bool = False  # args 1 and 2 are a layer's K and V cache (replaced per layer)

    def __call__(self) -> None:
        self.kernel(self.grid, self.args, self.constexprs, self.num_warps, self.num_stages)


class PerLayerLaunches:
    """A step's attention launches, issued once per layer with that layer's KV cache.

    Every layer of a step attends with the same query rows, metadata and output buffer; only the cache
    differs, and all layers' caches are views of one allocation with the same dtype and alignment, so
    they share one specialisation. The first layer goes through ``BoundKernel`` (compiling if needed);
    later layers call the compiled kernels directly, skipping the per-call key: a piecewise-graph step
    issues these two or three launches 28-36 times, and that was most of its host time.
    """

    def __init__(self, launches: list[Launch]) -> None:
        self.launches = launches
        self._direct: list[tuple[object, tuple, tuple, bool]] | None = None
        self._stream = 0

    def __call__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        if self._direct is not None:
            stream = self._stream
            for kernel, grid, args, const_values, takes_cache in self._direct:
                _run(kernel, grid, stream, _with_cache(args, k_cache, v_cache) if takes_cache else args, const_values)
            return
        device = torch.cuda.current_device()
        direct = []
        for launch in self.launches:
            args = _with_cache(launch.args, k_cache, v_cache) if launch.takes_kv_cache else launch.args
            launch.kernel(launch.grid, args, launch.constexprs, launch.num_warps, launch.num_stages)
            key = launch.kernel._key(device, args, launch.constexprs, launch.num_warps, launch.num_stages)
            direct.append((launch.kernel._compiled[key], launch.grid, args, key[1], launch.takes_kv_cache))
        self._direct = direct
        self._stream = torch._C._cuda_getCurrentRawStream(device)


def _with_cache(args: tuple, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple:
    """An attention kernel's arguments with another layer's cache (arguments 1 and 2)."""
    return (args[0], k_cache, v_cache, *args[3:])


class OverlappedLaunches:
    """A mixed step's attention with its decode rows on a side stream, beside its prefill chunks.

    Decode attention reads every decode row's whole context once (memory-bound) while prefill attention
    is compute-bound; issued one after the other, each leaves the other's resource idle. Each layer, the
    side stream waits for the main stream (the piece before stored this layer's K/V), runs the decode
    launches while the main stream runs the prefill launches, and the main stream waits for the side
    stream before the next piece reads the attention output. The two write disjoint rows of it, so the
    result is the same bits as in sequence; only the kernels' placement on the GPU changes.
    """

    def __init__(self, decode: list[Launch], prefill: list[Launch], side_stream: torch.cuda.Stream) -> None:
        self.decode = PerLayerLaunches(decode)
        self.prefill = PerLayerLaunches(prefill)
        self.side = side_stream
        self.ready = torch.cuda.Event()
        self.done = torch.cuda.Event()

    def __call__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        main = torch.cuda.current_stream()
        self.ready.record(main)
        self.side.wait_event(self.ready)
        with torch.cuda.stream(self.side):
            self.decode(k_cache, v_cache)
        self.done.record(self.side)
        self.prefill(k_cache, v_cache)
        main.wait_event(self.done)

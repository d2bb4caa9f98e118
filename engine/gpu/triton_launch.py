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
        const_values = tuple(constexprs.values())
        key = (device, const_values, num_warps, num_stages, tuple(map(_arg_key, args)))
        kernel = self._compiled.get(key)
        if kernel is None:
            self._bind(key, grid, args, constexprs, num_warps, num_stages)
            return
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        kernel.run(grid[0], grid_1, grid_2, torch._C._cuda_getCurrentRawStream(device), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *const_values)

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

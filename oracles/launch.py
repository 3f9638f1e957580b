"""Launching the fused checks' Triton kernels with less host time.

``kernel[grid](*args)`` costs 20-30 us of Python per launch in Triton 3.x: the
binder specializes every argument, a cache key is built, hooks and global
values are checked. A fast-path check (harness.runner) makes three to five of
these launches, and at realistic sizes its host time, not the GPU's, is most of
its cost.

``launch(kernel, grid, *args, **constexprs)`` does Triton's first launch of each
argument signature the normal way, keeps the compiled kernel it returns, and
for later launches with the same signature calls that kernel's launcher
directly, the same call ``JITFunction.run`` ends with. The signature is at least
as fine as Triton's own specialization, so a kept kernel is only reused for
arguments Triton would have compiled the same kernel for:

- a tensor: its dtype, and whether its address is 16-byte aligned (unless the
  parameter is in the kernel's ``do_not_specialize_on_alignment``);
- an int: its Triton type (i32, i64, u64), and whether it is 1 or divisible by
  16 (unless the parameter is in ``do_not_specialize``);
- a bool, float or None: its type and value;
- the constexprs and launch options by value; the current device.

Anything else (the CPU interpreter, another argument type, a Triton without
these internals) takes the normal launch.
"""

from __future__ import annotations

from typing import Any

import torch

_KEPT: dict[tuple, Any] = {}
_PLANS: dict[int, list | None] = {}  # id(kernel) -> per parameter: (name, is_constexpr, specialize, align)
_MAX_KEPT = 512


def _plan(kernel: Any) -> list | None:
    plan = _PLANS.get(id(kernel), False)
    if plan is False:
        try:
            from triton import knobs  # noqa: F401  (the hooks the direct launch passes on)

            plan = [(p.name, bool(p.is_constexpr), not p.do_not_specialize, not p.do_not_specialize_on_alignment)
                    for p in kernel.params]
            if not hasattr(kernel, "run") or not hasattr(kernel, "device_caches"):
                plan = None
        except (AttributeError, ImportError):  # an interpreted kernel, or another Triton's internals
            plan = None
        _PLANS[id(kernel)] = plan
    return plan


def _arg_key(a: Any, specialize: bool, align: bool) -> Any:
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0 if align else None)
    if isinstance(a, bool) or a is None or isinstance(a, float):
        return (type(a), a)
    if isinstance(a, int):
        kind = 0 if -2**31 <= a < 2**31 else (2 if a >= 2**63 else 1)
        return (kind, a == 1, a % 16 == 0) if specialize else (kind,)
    raise TypeError(type(a))


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, num_warps: int | None = None, **constexprs: Any) -> None:
    """``kernel[grid](*args, num_warps=..., **constexprs)``, with the compiled kernel of an argument
    signature seen before launched directly. ``args``: the parameters before the constexprs,
    in order; ``constexprs``: every constexpr, by name."""
    options = {} if num_warps is None else {"num_warps": num_warps}
    plan = _plan(kernel)
    if plan is None or not args or not isinstance(args[0], torch.Tensor) or not args[0].is_cuda:
        kernel[grid](*args, **options, **constexprs)
        return
    try:
        sig = [_arg_key(a, spec, align) for a, (_, _, spec, align) in zip(args, plan)]
        values = list(args) + [constexprs[name] for name, is_cx, _, _ in plan[len(args):]]
        if (len(values) != len(plan) or any(cx for _, cx, _, _ in plan[:len(args)])
                or not all(cx for _, cx, _, _ in plan[len(args):])):
            raise TypeError("arguments do not fill the kernel's parameters")
        key = (id(kernel), torch.cuda.current_device(), tuple(sig), tuple(sorted(constexprs.items())), num_warps)
    except (TypeError, KeyError):
        kernel[grid](*args, **options, **constexprs)
        return
    compiled = _KEPT.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **options, **constexprs)
        if len(_KEPT) >= _MAX_KEPT:
            _KEPT.clear()
        if compiled is not None and all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata",
                                                                       "launch_metadata")):
            _KEPT[key] = compiled
        return
    from triton import knobs

    g = tuple(grid) + (1, 1)
    stream = torch.cuda.current_stream().cuda_stream
    compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *values), knobs.runtime.launch_enter_hook,
                 knobs.runtime.launch_exit_hook, *values)

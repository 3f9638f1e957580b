"""Cheaper host-side launches of the fused checks' Triton kernels, for the GPU fast path.

A fast-path check is host-bound: on the H200's host, ``kernel[grid](...)`` costs ~28 us for the
25-argument fingerprint launch, of which ~14 us is Triton binding the arguments, specializing
each and looking the variant up. ``Launcher`` asks Triton once per variant (the normal launch,
which compiles or finds it) and from then on calls that compiled kernel's own launcher,
``CompiledKernel[grid](*args)``, which takes the same positional arguments.

The variant's key must determine everything Triton specializes the kernel on. ``arg_key``
spells that for an argument, and ``Launcher.key`` for a launch, from the kernel's own
do_not_specialize lists:

- a tensor: its dtype, and for a pointer Triton may specialize on alignment, whether its address
  is a multiple of 16;
- an int: whether it fits in int32 (Triton's i32 / i64 choice), and, unless the parameter is in
  ``do_not_specialize``, whether it is 1 and whether it is a multiple of 16.

Constexprs, launch options (num_warps) and the device go into the key too. A coarser key
would launch a variant compiled for other arguments (say, aligned loads on an unaligned
pointer), so the keys are computed from the arguments each time, never assumed.

Under the CPU interpreter there is no compiled kernel: every launch is Triton's own.

The caches belong to one process's fast path (``Launchers``, held by its
resources), not to module globals.
"""

from __future__ import annotations

from typing import Any, Hashable

import torch

_I32 = 2**31


def arg_key(arg: Any, *, specialized: bool = True) -> Hashable:
    """What Triton can specialize a kernel on for this argument (see the module docstring);
    ``specialized=False`` for parameters in do_not_specialize / do_not_specialize_on_alignment."""
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0) if specialized else arg.dtype
    if isinstance(arg, bool) or not isinstance(arg, int):
        return (type(arg), arg)
    fits = -_I32 <= arg < _I32
    return (fits, arg == 1, arg % 16 == 0) if specialized else fits


class Launcher:
    """``Launcher(jit_fn)(grid, args, constexprs, **options)``: launch jit_fn on a 1-D grid with
    positional ``args`` followed by ``constexprs`` (the kernel's last parameters, in order). The
    variant is keyed by ``arg_key`` of each argument, as the kernel's do_not_specialize and
    do_not_specialize_on_alignment lists say (the device, constexprs and options are added
    here); ``key=`` gives a caller's own, cheaper spelling of the same key."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        self._interpreted = type(fn).__name__ == "InterpretedFunction"  # decorated under TRITON_INTERPRET=1
        self._kernels: dict[Hashable, Any] = {}
        self._specialized: list[tuple[bool, bool]] | None = None  # per argument: (value, alignment)

    def key(self, args: tuple | list) -> tuple:
        """What Triton can specialize this kernel on for these arguments."""
        if self._specialized is None:
            params = [p for p in getattr(self._fn, "params", ()) if not p.is_constexpr]
            self._specialized = [(not p.do_not_specialize, not p.do_not_specialize_on_alignment) for p in params]
        flags = self._specialized or [(True, True)] * len(args)  # a stand-in with no params: everything
        return tuple(
            arg_key(a, specialized=align if isinstance(a, torch.Tensor) else value)
            for a, (value, align) in zip(args, flags)
        )

    def __call__(
        self, grid: int, args: tuple | list, constexprs: dict[str, Any], *, key: tuple | None = None, **options: Any
    ) -> None:
        if self._interpreted:
            self._fn[(grid,)](*args, **constexprs, **options)
            return
        full = (
            torch.cuda.current_device(),
            self.key(args) if key is None else key,
            *constexprs.values(),
            *options.values(),
        )
        kernel = self._kernels.get(full)
        if kernel is not None:
            kernel[(grid, 1, 1)](*args, *constexprs.values())
            return
        kernel = self._fn[(grid,)](*args, **constexprs, **options)  # Triton's own: compiles or finds it
        if hasattr(kernel, "result"):  # compiled asynchronously: keep the outcome
            kernel = kernel.result()
        if hasattr(kernel, "packed_metadata"):  # a CompiledKernel (a stand-in in a test launches only so)
            self._kernels[full] = kernel


class Launchers:
    """One Launcher per kernel, for one process's fast path: ``launchers(jit_fn)``."""

    def __init__(self) -> None:
        self._by_fn: dict[int, Launcher] = {}

    def __call__(self, fn: Any) -> Launcher:
        launcher = self._by_fn.get(id(fn))
        if launcher is None:
            launcher = self._by_fn[id(fn)] = Launcher(fn)
        return launcher

"""A convert that raises, on every prefill-workspace case, a plain ValueError whose message reads
like Triton's interpreter's: the implementation's own exception, which must stay an EXCEPTION
finding (only an error the interpreter itself raised is the environment's)."""

from mlafuzz.kernels.torch_impl import convert_torch


def convert(*args, **kwargs):
    if kwargs.get("HAS_PREFILL_WORKSPACE"):
        raise ValueError("mask has unsupported dtype")
    return convert_torch(*args, **kwargs)

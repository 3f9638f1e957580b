"""Convert wrappers with a ``*args, **kwargs`` signature, as a user's shim around vLLM's convert
is often written: the signature names no optional keyword, so the harness cannot tell which it
takes and draws none unless ``--features convert=...`` declares them.

- ``convert``: passes everything through to our torch convert (correct, with every surface);
- ``convert_ignores_out``: drops caller-owned outputs (``out=``, ``valid_counts_out=``) and returns
  fresh tensors: correct everywhere except on cases that give it caller-owned outputs.

Both wrap our torch convert as the newest revision has it (a counted row compacted, as vLLM
0.30.0 on does): a shim around an installed vLLM wraps that release's rule.
"""

from mlafuzz.kernels.revisions import NEWEST
from mlafuzz.kernels.torch_impl import convert_torch


def convert(*args, **kwargs):
    return convert_torch(*args, revision=NEWEST, **kwargs)


def convert_ignores_out(*args, **kwargs):
    kwargs.pop("out", None)
    kwargs.pop("valid_counts_out", None)
    return convert_torch(*args, revision=NEWEST, **kwargs)

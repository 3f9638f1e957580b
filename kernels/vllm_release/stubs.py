"""Our stand-ins for the vLLM modules the released op modules import but the ops never use.

vLLM's ``sparse_utils.py`` imports its config, distributed group, warm-up helpers and Triton
wrapper at module level; the warm-up helpers import vLLM's environment variables, platform and
logger. The fuzzed functions use none of them except the Triton wrapper (``triton``, ``tl``) and
the warm-up launcher's two settings (a thread count, the device type). Each stand-in below
provides exactly the names those imports ask for, in each release 0.27.0-0.34.0 (found by
building each release's tree and importing it), and one that only warm-up or model code would
call raises, naming itself, instead of returning something made up.

Keys are paths inside the tree; values are module sources. None of this is vLLM's code.
"""

from __future__ import annotations

from typing import Mapping

__all__ = ["STUBS", "version_module"]

_HEAD = '"""mlafuzz shim (kernels/vllm_release/stubs.py): {what}"""\n'


def _unused(name: str) -> str:
    return (
        f"def {name}(*args, **kwargs):\n"
        f"    raise NotImplementedError('mlafuzz shim: {name} is vLLM runtime machinery that the fuzzed ops never call')\n"
    )


STUBS: Mapping[str, str] = {
    "vllm/envs.py": _HEAD.format(what="the vLLM environment settings the warm-up launcher reads.")
    + "VLLM_TRITON_JIT_WARMUP_NUM_THREADS = 1  # compile in the calling thread\n"
    + "VLLM_TRITON_FORCE_FIRST_CONFIG = False\n",
    "vllm/logger.py": _HEAD.format(what="vLLM's logger is the standard library's.")
    + "import logging\n\n\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/platforms/__init__.py": _HEAD.format(what="the platform: CUDA when torch sees a GPU, else the CPU.")
    + "import torch\n\n\n"
    + "class _Platform:\n"
    + "    device_type = 'cuda' if torch.cuda.is_available() else 'cpu'\n\n"
    + "    def is_cuda(self):\n        return self.device_type == 'cuda'\n\n"
    + "    def is_rocm(self):\n        return False\n\n"
    + "    def is_cpu(self):\n        return self.device_type == 'cpu'\n\n\n"
    + "current_platform = _Platform()\n\n\n"
    + "def vllm_version_matches_substr(substr):\n    return False\n",
    "vllm/triton_utils/__init__.py": _HEAD.format(what="vLLM's Triton wrapper is the installed Triton.")
    + "import triton\nimport triton.language as tl\n\nHAS_TRITON = True\n",
    "vllm/config/__init__.py": _HEAD.format(what="vLLM's config (only warm-up planning reads one).")
    + "class VllmConfig:\n    pass\n\n\n"
    + _unused("get_current_vllm_config"),
    "vllm/distributed/__init__.py": _HEAD.format(
        what="no distributed group: the fuzzed ops take D and the rank as arguments."
    )
    + _unused("get_dcp_group")
    + "\n\ndef is_global_first_rank():\n    return True\n",
    "vllm/v1/kv_cache_interface.py": _HEAD.format(what="the KV cache spec types (only warm-up planning reads them).")
    + "class AttentionSpec:\n    pass\n\n\n"
    + _unused("get_block_table_width"),
    "vllm/v1/worker/block_table.py": _HEAD.format(what="the block table helpers (only warm-up planning reads them).")
    + _unused("get_block_table_width"),
}


def version_module(version: str) -> str:
    """``vllm/__init__.py``: the release's version, which ``--revision auto`` reads."""
    return _HEAD.format(what=f"vLLM {version}'s modules, extracted from its wheel.") + f"__version__ = {version!r}\n"

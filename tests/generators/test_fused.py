"""The fused generation room (generators/fused) makes a case's bytes exactly as the torch builders
do, for every op, value mode, top-k mode and view: switching it off, or deleting it, loses only
speed. On the CPU its kernels run under Triton's interpreter; on the GPU (where it is on by default)
the same comparison runs at realistic sizes."""

from __future__ import annotations

import collections
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlafuzz.generators.draw import LARGE  # noqa: E402
from mlafuzz.generators.fused import SWITCH, kernels, room  # noqa: E402
from mlafuzz.generators.rng import fill  # noqa: E402
from mlafuzz.generators.rng.pool import Draws  # noqa: E402
from mlafuzz.tests.support.gen_cases import MEDIUM, differences, every_layout_spec  # noqa: E402
from mlafuzz.tests.support.helpers import draw_spec, materialize, specs  # noqa: E402

FUSED = ("block_table", "topk_indices", "fill_records", "writer_rows")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def launches(monkeypatch):
    """Counts the fused kernels' launches (so a comparison that never reached them fails)."""
    seen: collections.Counter[str] = collections.Counter()
    for name in FUSED:
        real = getattr(kernels, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)
    return seen


def _both(monkeypatch, spec, seed: int, device: str = DEV):
    monkeypatch.setenv(SWITCH, "0")
    torch_made = materialize(spec, seed, device)
    monkeypatch.setenv(SWITCH, "1")
    return torch_made, materialize(spec, seed, device)


@pytest.mark.parametrize("base_block", [0, 300], ids=["low", "high"])
def test_every_op_mode_and_view_is_the_same_bytes_fused_or_not(monkeypatch, launches, base_block):
    for i, spec in enumerate(every_layout_spec(base_block=base_block)):
        slow, fast = _both(monkeypatch, spec, 5 + i)
        assert differences(slow, fast) == [], spec
    assert set(launches) == set(FUSED)  # every kernel took part


def test_drawn_cases_at_the_large_presets_code_paths_are_the_same_bytes_fused_or_not(monkeypatch, launches):
    for op in ("convert", "gather", "writer", "step"):
        for i in range(6):
            slow, fast = _both(monkeypatch, draw_spec(op, seed=i, knobs=MEDIUM), i)
            assert differences(slow, fast) == [], (op, i)
    assert sum(launches.values()) > 24


@pytest.mark.parametrize("op", ("convert", "gather", "writer"))
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=15, deadline=None)
def test_small_drawn_cases_are_the_same_bytes_fused_or_not(op, data, seed):
    spec = data.draw(specs(op))
    with pytest.MonkeyPatch.context() as mp:
        slow, fast = _both(mp, spec, seed)
    assert differences(slow, fast) == []


def test_a_stream_too_long_for_the_word_table_is_the_same_error_fused_or_not(monkeypatch):
    per_row = torch.ones(((1 << 18) + 1, 8), dtype=torch.int32)  # 4 words a row: one row too many
    call = lambda: fill.topk_indices(
        Draws(1, "t"), per_row=per_row, width=4, block_size=16, topk=32, mode="padded", device="cpu"
    )
    errors = []
    for switch in ("0", "1"):
        monkeypatch.setenv(SWITCH, switch)
        with pytest.raises(ValueError) as info:
            call()
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "at most" in errors[0]


def test_the_room_is_off_on_the_cpu_unless_asked_and_off_everywhere_when_switched_off(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    assert room("cpu") is None  # the interpreter is slower than torch: never by default
    monkeypatch.setenv(SWITCH, "0")
    assert room("cpu") is None and room("cuda") is None
    monkeypatch.setenv(SWITCH, "1")
    assert (room("cpu") is kernels) == kernels.INTERPRETED


@pytest.mark.gpu
@pytest.mark.parametrize("op", ("convert", "gather", "writer", "step"))
def test_large_cases_on_the_gpu_are_the_same_bytes_fused_or_not(monkeypatch, launches, op):
    monkeypatch.delenv(SWITCH, raising=False)
    assert room("cuda") is kernels  # on by default on a GPU
    for i in range(12):
        slow, fast = _both(monkeypatch, draw_spec(op, seed=100 + i, knobs=LARGE), i, "cuda")
        assert differences(slow, fast) == [], (op, i)
    assert sum(launches.values()) > 0


def test_without_the_room_every_case_is_still_made_by_the_torch_builders():
    # The room deleted (its import fails): the builders fall back, nothing else changes.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['mlafuzz.generators.fused'] = None\n"
        "from mlafuzz.generators.rng.fusing import fused_room\n"
        "from mlafuzz.tests.support.helpers import draw_spec, materialize\n"
        "assert fused_room('cuda') is None\n"
        "for op in ('convert', 'gather', 'writer', 'step'):\n"
        "    materialize(draw_spec(op, seed=3), 3, 'cpu')\n"
        "print('OK')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "OK", res.stderr

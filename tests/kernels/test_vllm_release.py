"""The release tier's import shim, on a synthetic wheel of our own (no vLLM code, nothing downloaded).

The synthetic wheel has the layout of a vLLM release: ``mla_attention.py`` holds the planner
beside imports of vLLM's models and config that would never import here, ``sparse_utils.py``
imports the config, distributed group, Triton wrapper and math helpers at module level. Built
into a tree, ``--impl plan=vllm`` must then load and run exactly as from an installed vLLM of
that version, with ``--revision auto`` picking that release's revision.
"""

from __future__ import annotations

import json
import sys
import textwrap
import zipfile

import pytest

from mlafuzz.harness.cli.main import main
from mlafuzz.kernels.vllm_release.__main__ import main as build_main
from mlafuzz.kernels.vllm_release.slice import SliceError, slice_module
from mlafuzz.kernels.vllm_release.tree import build_tree

MLA = textwrap.dedent('''
    """A module shaped like vLLM's mla_attention.py: heavy imports beside one pure function."""
    from dataclasses import dataclass

    import vllm.model_executor.models.deepseek_v2 as deepseek  # never importable here
    from vllm.config import get_current_vllm_config
    from vllm.utils.math_utils import round_down
    from mlafuzz.kernels.planner import plan_context_chunks as _ours

    LIMIT = 4


    def _checked(value):
        assert round_down(value, 1) == value
        return value


    @dataclass
    class Unused:
        layer: object = deepseek


    def plan_mla_context_chunks(context_lens, row_budget, max_context_chunk, split_alignment, padded_rows):
        return _ours(context_lens, _checked(row_budget), max_context_chunk, split_alignment, padded_rows)


    def build(config=get_current_vllm_config):
        return Unused()
''')

SPARSE = textwrap.dedent("""
    import torch

    from vllm.config import VllmConfig
    from vllm.distributed import get_dcp_group
    from vllm.triton_utils import tl, triton
    from vllm.utils.math_utils import cdiv


    def rows_of(n):
        return cdiv(n, 2)
""")

MATH = "def cdiv(a, b):\n    return -(-a // b)\n\n\ndef round_down(x, m):\n    return x // m * m\n"


def _wheel(tmp_path, *, planner: bool = True):
    path = tmp_path / "vllm-0.28.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/model_executor/layers/attention/mla_attention.py", MLA if planner else "X = 1\n")
        z.writestr("vllm/v1/attention/backends/mla/sparse_utils.py", SPARSE)
        z.writestr("vllm/utils/math_utils.py", MATH)
        z.writestr("vllm/_C_stable_libtorch.abi3.so", b"\x7fELF not for this torch")
    return path


@pytest.fixture
def on_path(monkeypatch):
    """Put a built tree first on sys.path, as PYTHONPATH would, with no vllm imported before it."""
    monkeypatch.delenv("MLAFUZZ_VLLM_VERSION", raising=False)

    def put(root):
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(root))

    return put


def test_a_sliced_module_keeps_the_function_and_what_it_needs_and_drops_the_heavy_imports():
    text = slice_module(MLA, ["plan_mla_context_chunks"])
    assert "def plan_mla_context_chunks" in text and "def _checked" in text and "round_down" in text
    assert "deepseek" not in text and "get_current_vllm_config" not in text and "class Unused" not in text
    with pytest.raises(SliceError, match="no absent_fn"):
        slice_module(MLA, ["absent_fn"])


def test_the_tree_imports_with_our_stubs_and_runs_the_release_planner_under_its_revision(tmp_path, on_path, capsys):
    root = build_tree(wheel=_wheel(tmp_path), root=tmp_path / "cache" / "0.28.0" / "tree", version="0.28.0")
    on_path(root)
    import vllm
    import vllm.v1.attention.backends.mla.sparse_utils as sparse

    assert vllm.__version__ == "0.28.0" and sparse.rows_of(5) == 3
    with pytest.raises(NotImplementedError, match="mlafuzz shim: get_dcp_group"):
        sparse.get_dcp_group()
    origins = json.loads((root / "tree.json").read_text())["modules"]
    assert origins["vllm/model_executor/layers/attention/mla_attention.py"].startswith("sliced from the wheel")
    assert origins["vllm/config/__init__.py"] == "mlafuzz stub"
    assert not list(root.rglob("*.so"))  # the compiled extension stays in the wheel
    out = tmp_path / "run"
    assert main(["fuzz", "--impl", "plan=vllm", "--cases", "30", "--in-process", "--out", str(out)]) == 0
    assert "vLLM 0.28.0: revision vllm-0.28" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["cases"] == 30


def test_a_release_without_the_planner_says_so_in_one_line(tmp_path, on_path, capsys):
    root = build_tree(wheel=_wheel(tmp_path, planner=False), root=tmp_path / "tree", version="0.27.0")
    on_path(root)
    assert (
        "absent from this release"
        in json.loads((root / "tree.json").read_text())["modules"][
            "vllm/model_executor/layers/attention/mla_attention.py"
        ]
    )
    assert main(["fuzz", "--impl", "plan=vllm", "--cases", "3", "--in-process", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no plan implementation" in err[0]


def test_a_file_that_is_no_wheel_is_one_line(tmp_path, capsys):
    bad = tmp_path / "vllm-0.30.0.whl"
    bad.write_text("not a zip")
    assert build_main(["--wheel", str(bad), "--root", str(tmp_path / "t"), "--version", "0.30.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a readable wheel" in err[0]


def test_the_dcp_filter_without_the_length_check_of_every_release_is_a_mutant_the_cpu_kills(tmp_path):
    # vLLM 0.27.0-0.34.0's triton_filter_and_convert_dcp_index (the release tier's ledger): its look-alike.
    from mlafuzz.harness.check.session import Session
    from mlafuzz.harness.drive.fuzz import FuzzConfig, fuzz
    from mlafuzz.harness.drive.workers import InProcess
    from mlafuzz.harness.ops.table import OPS

    config = FuzzConfig(ops=("dcp",), impls={"dcp": "dcp_no_length_check"}, cases=40, seed=0, out_dir=tmp_path)
    fuzz(config, executor=InProcess(session=Session(table=OPS)))
    found = [json.loads(line) for line in (tmp_path / "findings.jsonl").read_text().splitlines()]
    assert found and {(f["kind"], f["cause"]) for f in found} == {
        ("ACCEPTED_INVALID_INPUT", "contract:length_mismatch")
    }

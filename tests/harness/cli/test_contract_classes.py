"""``--contract`` takes every error-input class docs/contract.md lists for an op, and the docs list
exactly the classes the op's generator has: one source of truth. A class out of the rotation
(gather's host value preconditions) is drawn once a run's contract names it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlafuzz.harness.cli.fuzz_cmd import parse_contracts
from mlafuzz.harness.cli.main import main
from mlafuzz.harness.drive.fuzz import FuzzConfig
from mlafuzz.harness.ops.table import OPS

CONTRACT = Path(__file__).parents[3] / "docs" / "contract.md"


def _documented() -> dict[str, set[str]]:
    """op -> the classes the table under 'Error inputs and `--contract`' lists for it."""
    section = CONTRACT.read_text(encoding="utf-8").split("## Error inputs and `--contract`", 1)[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1].strip() not in ("op", "---", ""):
            for op in cells[1].split(","):
                rows[op.strip()] = set(re.findall(r"`([a-z0-9_]+)`", cells[2]))
    return rows


def test_the_docs_list_exactly_each_ops_contract_classes():
    documented = _documented()
    assert {op: {k.name for k in OPS.get(op).contract_classes} for op in OPS.names} == {
        op: documented.get(op, set()) for op in OPS.names
    }


@pytest.mark.parametrize("op", [op for op in OPS.names if OPS.get(op).contract_classes])
def test_contract_accepts_every_documented_class_of_an_op(op):
    classes = sorted(_documented()[op])
    assert parse_contracts([f"{op}={','.join(classes)}"], OPS) == {op: tuple(classes)}


def test_the_cli_accepts_a_host_value_class_that_docs_list(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        ["fuzz", "--op", "gather", "--impl", "gather=torch", "--contract", "gather=slot_past_row_map"]
        + ["--device", "cpu", "--cases", "1", "--out", str(out), "--quiet", "--in-process"]
    )
    assert rc == 0, capsys.readouterr().err


def test_a_class_out_of_the_rotation_is_drawn_once_the_contract_names_it():
    def drawn(rejects: dict) -> set:
        config = FuzzConfig(ops=("gather",), impls={"gather": "torch"}, cases=400, rejects=rejects)
        return {config.task(i).contract for i in range(400)} - {None}

    assert "slot_past_row_map" not in drawn({})
    assert "slot_past_row_map" in drawn({"gather": ("wrong_dtype", "slot_past_row_map")})

"""The cache format table and the nvfp4 writer revisions (oracles/formats/table.py, writer_rules.py):
the layouts SPEC 2 and 11.1 give, checked against the oracles that read them."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from mlafuzz.oracles import codec
from mlafuzz.oracles.formats import table, writer_rules
from mlafuzz.oracles.formats.table import Format, Plane


def test_fp8_ds_mla_row_is_the_layout_the_fp8_codec_reads() -> None:
    f = table.get("fp8_ds_mla")
    assert f.record_bytes == codec.RECORD_BYTES == 656 and f.row_dim == codec.ROW_DIM == 576
    assert [(p.name, p.offset, p.stop, p.elements, p.codec) for p in f.planes] == [
        ("nope", 0, 512, 512, "e4m3fn"),
        ("scale", codec.SCALE_OFF, codec.ROPE_OFF, 4, "f32_le"),
        ("rope", codec.ROPE_OFF, 656, 64, "bf16_bits"),
    ]
    assert f.scale_block == codec.TILE and [f.scale_byte(t) for t in range(4)] == [512, 516, 520, 524]
    assert f.record_bytes % f.align == 0 and f.record_bytes // 16 == 41


def test_nvfp4_ds_mla_row_is_spec_11_1() -> None:
    f = table.get("nvfp4_ds_mla")
    assert f.record_bytes == 352 and f.row_dim == 576 and f.nope_dim == 512 and f.rope_dim == 64
    assert (f.plane("nope").offset, f.plane("nope").stop, f.plane("nope").codec) == (0, 256, "e2m1x2")
    assert (f.plane("rope").offset, f.plane("rope").stop, f.plane("rope").codec) == (256, 320, "e4m3fn")
    assert (f.plane("scale").offset, f.plane("scale").stop, f.scales, f.scale_block) == (320, 352, 32, 16)
    assert [f.scale_byte(s) for s in range(32)] == [320 + 8 * (s & 3) + (s >> 2) for s in range(32)]
    # vLLM's kernel comment: byte p holds the scale of block 4 * (p & 7) + (p >> 3)
    assert all(f.scale_byte(4 * (p & 7) + (p >> 3)) == 320 + p for p in range(32))
    assert f.record_bytes % f.align == 0


def test_formats_are_told_apart_by_bytes_per_token_and_unknown_ones_are_named() -> None:
    assert table.by_record_bytes(656).name == "fp8_ds_mla" and table.by_record_bytes(352).name == "nvfp4_ds_mla"
    assert table.names() == ("fp8_ds_mla", "nvfp4_ds_mla")
    with pytest.raises(ValueError, match="656 \\(fp8_ds_mla\\), 352 \\(nvfp4_ds_mla\\)"):
        table.by_record_bytes(576)
    with pytest.raises(ValueError, match="expected one of fp8_ds_mla, nvfp4_ds_mla"):
        table.get("nvfp4")
    with pytest.raises(KeyError, match="nope, scale, rope"):
        table.get("nvfp4_ds_mla").plane("pe")


def _row(**changes: object) -> dict[str, object]:
    f = table.get("nvfp4_ds_mla")
    kw: dict[str, object] = dict(
        name="x",
        record_bytes=f.record_bytes,
        planes=f.planes,
        scale_block=f.scale_block,
        scale_slots=f.scale_slots,
        row_dim=f.row_dim,
        align=f.align,
        source="test",
    )
    kw.update(changes)
    return kw


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"record_bytes": 368}, "must tile"),
        ({"scale_slots": tuple(range(31)) + (0,)}, "permute"),
        ({"row_dim": 512}, "row_dim"),
        ({"scale_block": 32}, "scales x 32"),
        ({"align": 64}, "align"),
        (
            {
                "planes": (
                    Plane(name="nope", offset=0, nbytes=256, elements=512, codec="e4m3fn"),
                    *table.get("nvfp4_ds_mla").planes[1:],
                )
            },
            "holds 512 x e4m3fn in 256 bytes",
        ),
    ],
)
def test_a_format_row_that_contradicts_itself_is_refused(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Format(**_row(**changes))  # type: ignore[arg-type]


def test_the_format_table_and_writer_rules_import_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from mlafuzz.oracles.formats import table, writer_rules\n"
        "print(table.get('nvfp4_ds_mla').record_bytes, writer_rules.DEFAULT)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split() == ["352", "rn_bump.mul_recip"]


def test_writer_revisions_are_every_pair_of_rule_values() -> None:
    pairs = {(r.rule("scale_rounding"), r.rule("quotient")) for r in writer_rules.REVISIONS.values()}
    assert pairs == set(itertools.product(*writer_rules.RULES.values()))
    for name in writer_rules.names():
        r = writer_rules.get(name)
        assert r.name == f"{r.rule('scale_rounding')}.{r.rule('quotient')}" and r.source
    assert writer_rules.get(writer_rules.DEFAULT).source.startswith("vLLM")
    with pytest.raises(ValueError, match="expected one of rn_bump.mul_recip"):
        writer_rules.get("2026-09")
    with pytest.raises(KeyError, match="scale_rounding, quotient"):
        writer_rules.get("rn.div").rule("writer_scale")

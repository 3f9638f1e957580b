"""Replay as someone who downloaded a bundle meets it: a bundle is data and never makes replay import
code; a TIMEOUT bundle replays under the limit its run had."""

from __future__ import annotations

import json
from pathlib import Path

from mlafuzz.harness.cli.main import main

PLANTED = Path(__file__).parents[2] / "support" / "planted"
HANG = PLANTED / "hang_gather.py"


def _external_impl(tmp_path: Path) -> tuple[Path, Path]:
    """A gather in its own file that leaves a mark each time it is imported."""
    mark = tmp_path / "imported"
    impl = tmp_path / "fix.py"
    impl.write_text(
        f"from pathlib import Path\nPath({str(mark)!r}).write_text('imported')\n"
        f"import importlib.util\n"
        f"_s = importlib.util.spec_from_file_location('g', {str(PLANTED / 'gather_from_zero.py')!r})\n"
        f"_m = importlib.util.module_from_spec(_s)\n_s.loader.exec_module(_m)\ngather = _m.gather\n"
    )
    return impl, mark


def test_a_bundle_naming_an_external_implementation_is_not_run_without_impl(tmp_path, capsys):
    impl, mark = _external_impl(tmp_path)
    assert (
        main(
            [
                "fuzz",
                "--impl",
                f"gather={impl}:gather",
                "--device",
                "cpu",
                "--cases",
                "10",
                "--shrink-budget",
                "2",
                "--in-process",
                "--quiet",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 1
    )
    bundle = next((tmp_path / "run" / "bundles").iterdir())
    assert json.loads((bundle / "case.json").read_text())["impl"] == f"{impl}:gather"
    mark.unlink()
    capsys.readouterr()
    assert main(["replay", str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert "names an external implementation" in err and "--impl" in err and "--trust-bundle" in err
    assert len(err.splitlines()) == 1
    assert not mark.exists()  # refused before anything was imported
    assert main(["replay", str(bundle), "--impl", "gather=torch"]) == 0  # one the user names runs
    assert not mark.exists()
    assert main(["replay", str(bundle), "--trust-bundle"]) == 1  # the user's explicit word
    assert mark.exists()


def test_a_bundle_naming_a_builtin_implementation_replays_as_it_is(tmp_path, capsys):
    assert (
        main(
            [
                "fuzz",
                "--op",
                "gather",
                "--impl",
                "gather=gather_skip_last_row",
                "--device",
                "cpu",
                "--cases",
                "6",
                "--shrink-budget",
                "2",
                "--in-process",
                "--quiet",
                "--out",
                str(tmp_path),
            ]
        )
        == 1
    )
    bundle = next((tmp_path / "bundles").iterdir())
    assert main(["replay", str(bundle)]) == 1


def test_a_timeout_bundle_replays_under_its_runs_limit_or_the_one_given(tmp_path, capsys):
    from mlafuzz.generators.ops.gather import GatherRequest, GatherSpec
    from mlafuzz.generators.spec import spec_to_json

    spec = tmp_path / "two_requests.json"
    spec.write_text(
        spec_to_json(
            GatherSpec(requests=(GatherRequest(context_len=4, length=4), GatherRequest(context_len=4, length=4)))
        )
    )
    # A shrink budget smaller than the limit: no attempt could show a TIMEOUT in time, so none is made.
    assert (
        main(
            [
                "fuzz",
                "--spec",
                str(spec),
                "--impl",
                f"gather={HANG}:gather",
                "--device",
                "cpu",
                "--cases",
                "1",
                "--workers",
                "1",
                "--timeout",
                "2",
                "--shrink-budget",
                "1",
                "--quiet",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 1
    )
    bundle = next((tmp_path / "run" / "bundles").iterdir())
    case = json.loads((bundle / "case.json").read_text())
    assert case["timeout"] == 2.0
    assert case["shrink"]["attempts"] == 0 and case["shrink"]["complete"] is False
    capsys.readouterr()
    assert main(["replay", str(bundle), "--trust-bundle"]) == 1
    out = capsys.readouterr().out
    assert "reproduces: TIMEOUT" in out and "no result after 2 s" in out, out
    assert main(["replay", str(bundle), "--trust-bundle", "--timeout", "1"]) == 1
    assert "no result after 1 s" in capsys.readouterr().out

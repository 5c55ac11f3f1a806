"""`orchard eval --tie-margin`: a score difference within [0, 1], refused clearly otherwise; unset leaves the margin
to the value service."""

from __future__ import annotations

import pytest

from orchard.cli import build_parser


def test_tie_margin_is_optional_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["eval", "--best-of", "8"]).tie_margin is None
    assert parser.parse_args(["eval", "--best-of", "8", "--tie-margin", "0.1"]).tie_margin == 0.1
    assert parser.parse_args(["eval", "--best-of", "8", "--tie-margin", "0"]).tie_margin == 0.0
    for bad, message in (
        ("1.5", "must be within [0, 1]"),
        ("-0.1", "must be within [0, 1]"),
        ("nan", "must be within [0, 1]"),
        ("lots", "not a number: 'lots'"),
    ):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["eval", "--best-of", "8", "--tie-margin", bad])
        assert exited.value.code == 2
        assert f"--tie-margin: {message}" in capsys.readouterr().err

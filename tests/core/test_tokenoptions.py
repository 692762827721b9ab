"""The token-label options both CLIs share (edgefleet.tokenoptions): what ``--label``,
``--no-device-labels`` and ``--device-label-prefix`` parse to, and what they refuse."""

from __future__ import annotations

import argparse

import pytest

from edgefleet.tokenoptions import add_token_label_options, label_option


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="token create")
    add_token_label_options(p)
    return p


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("site=retail", ("site", "retail")),
        ("site=", ("site", "")),  # an empty value is a label's value too
        ("a=b=c", ("a", "b=c")),  # the first = splits
        ("edgefleet.io/tier=edge", ("edgefleet.io/tier", "edge")),
    ],
)
def test_a_label_is_key_and_value(text: str, expected: tuple[str, str]) -> None:
    assert label_option(text) == expected


@pytest.mark.parametrize("text", ["site", "=retail", "", "="])
def test_a_label_without_key_or_equals_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be KEY=VALUE, got {text!r}"):
        label_option(text)


@pytest.mark.parametrize(
    ("argv", "labels", "no_device_labels", "prefix"),
    [
        ([], [], False, ""),
        (["--label", "site=a", "--label", "tier=b"], [("site", "a"), ("tier", "b")], False, ""),
        (["--no-device-labels"], [], True, ""),
        (["--device-label-prefix", "device.acme.io/"], [], False, "device.acme.io/"),
    ],
)
def test_the_options_parse(
    argv: list[str], labels: list[tuple[str, str]], no_device_labels: bool, prefix: str
) -> None:
    args = parser().parse_args(argv)
    assert (args.label, args.no_device_labels, args.device_label_prefix) == (
        labels,
        no_device_labels,
        prefix,
    )


def test_no_device_labels_and_a_prefix_exclude_each_other(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--no-device-labels", "--device-label-prefix", "x/"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_bad_label_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--label", "site"])
    assert "argument --label: must be KEY=VALUE, got 'site'" in capsys.readouterr().err

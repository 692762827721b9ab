"""The bootstrap-token options ``edgectl token create`` and ``hub token create`` share: the
labels a token gives every device it enrolls (``--label KEY=VALUE``, repeatable) and what the
device may add of its own (``--no-device-labels`` or ``--device-label-prefix PREFIX``).

The keys and values are checked where the token is made (the hub's token store), with the
same rules as any label; here only the ``KEY=VALUE`` shape is."""

from __future__ import annotations

import argparse


def label_option(text: str) -> tuple[str, str]:
    """One ``--label KEY=VALUE`` (argparse ``type=``): the key (not empty) and the value."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {text!r}")
    return key, value


def add_token_label_options(create: argparse.ArgumentParser) -> None:
    """A token's labels and what devices enrolling with it may add of their own."""
    create.add_argument(
        "--label", type=label_option, action="append", default=[], metavar="KEY=VALUE",
        help="a label every device enrolled with the token gets; the device cannot change "
        "it (repeatable)",
    )  # fmt: skip
    own = create.add_mutually_exclusive_group()
    own.add_argument(
        "--no-device-labels", action="store_true",
        help="devices enrolling with the token may not add labels of their own",
    )  # fmt: skip
    own.add_argument(
        "--device-label-prefix", default="", metavar="PREFIX",
        help='devices may add only label keys starting with PREFIX (e.g. "device.acme.io/")',
    )  # fmt: skip

"""edgectl's errors and exit codes: one style, ``error: MESSAGE`` on stderr (the hub's refusals
as ``error: CODE: MESSAGE``), and the exit code that says what kind of failure it was.

====  =================================================================================
code  meaning
====  =================================================================================
0     done
1     refused: the hub said no, the input is invalid, or (``diff``) there are differences
2     usage or configuration: a wrong command line, an unreadable or invalid admin.toml
3     the hub cannot be reached, or a change was sent and no answer came (outcome unknown)
====  =================================================================================
"""

from __future__ import annotations

from edgefleet.errors import EdgefleetError

EXIT_DONE = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_DONE, "done"),
    (EXIT_REFUSED, "refused: the hub said no, the input is invalid, or (diff) there are "
     "differences"),
    (EXIT_USAGE, "usage or configuration: a wrong command line, an unreadable or invalid "
     "admin.toml"),
    (EXIT_UNREACHABLE, "the hub cannot be reached, or a change was sent and no answer came "
     "(outcome unknown)"),
)  # fmt: skip
"""The table above, for ``--help`` texts and the manual page."""


class EdgectlError(EdgefleetError):
    """A failure edgectl reports as one line and an exit code."""

    exit_code = EXIT_REFUSED


class UsageError(EdgectlError):
    """The command line is wrong: an unknown type, a flag that does not apply, a bad form."""

    exit_code = EXIT_USAGE


class InputError(EdgectlError):
    """A file or document given to edgectl cannot be read or used."""

    exit_code = EXIT_REFUSED

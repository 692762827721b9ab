"""Manual pages (roff, ``man 7 man`` macros) generated from a program's own argparse parser, so
that they say exactly what the program accepts: one page per program, with every subcommand
(recursively), its usage, arguments and options. Pure: ``render(parser, ...)`` returns text.

``scripts/gen-manpages OUTDIR`` writes ``edged.8``, ``hub.8`` and ``edgectl.1``; the Debian
packages ship them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import date


def _escape(text: str) -> str:
    """Text safe in a roff line: backslashes, leading dots and quotes, hyphens as \\-."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    lines = text.splitlines() or [""]
    return "\n".join("\\&" + ln if ln.startswith((".", "'")) else ln for ln in lines)


def _subparsers(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) not in seen:
                    seen.add(id(child))
                    yield name, helps.get(name, ""), child


def _help_of(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        return ""
    if "%(" in text:
        params = {**vars(action), "prog": parser.prog}
        params = {k: (getattr(v, "__name__", v)) for k, v in params.items()}
        text = text % params
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text += (" " if text else "") + "(one of: " + ", ".join(map(str, action.choices)) + ")"
    return text


def _options(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                names += " " + str(action.metavar or action.dest.upper())
        else:
            names = str(action.metavar or action.dest)
        out += [".TP", f"\\fB{_escape(names)}\\fR", _escape(_help_of(action, parser))]
    return out


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().removeprefix("usage: ").split())


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for _, text, child in _subparsers(parser):
        out.append(f".SS {_escape(child.prog)}")
        if text:
            out.append(_escape(text))
        out += [".PP", f"\\fB{_escape(_usage(child))}\\fR"]
        if child.description:
            out += [".PP", _escape(child.description)]
        options = _options(child)
        if options:
            out += [".PP", *options]
        out += _commands(child)
    return out


def render(
    parser: argparse.ArgumentParser,
    *,
    section: int,
    summary: str,
    version: str,
    today: date | None = None,
    see_also: tuple[str, ...] = (),
    extra: tuple[tuple[str, str], ...] = (),
) -> str:
    """The page of ``parser``'s program; ``extra`` adds (HEADING, text) sections."""
    name = parser.prog
    day = (today or date.today()).isoformat()
    lines = [
        f'.TH {name.upper()} {section} "{day}" "edgefleet {version}" "edgefleet"',
        ".SH NAME",
        f"{name} \\- {_escape(summary)}",
        ".SH SYNOPSIS",
        f"\\fB{_escape(_usage(parser))}\\fR",
    ]
    if parser.description:
        lines += [".SH DESCRIPTION", _escape(parser.description)]
    options = _options(parser)
    if options:
        lines += [".SH OPTIONS", *options]
    commands = _commands(parser)
    if commands:
        lines += [".SH COMMANDS", *commands]
    for heading, text in extra:
        lines += [f".SH {heading.upper()}", *(_escape(p) + "\n.PP" for p in text.split("\n\n"))]
        lines[-1] = lines[-1].removesuffix("\n.PP")
    if see_also:
        pages = (page.rpartition(".") for page in see_also)
        lines += [".SH SEE ALSO", ", ".join(f"\\fB{n}\\fR({sec})" for n, _, sec in pages)]
    return "\n".join(lines) + "\n"

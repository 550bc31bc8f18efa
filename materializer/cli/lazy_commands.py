"""The ``materializer`` group's commands, each imported the first time it is looked up (by name
when it runs or prints its ``--help``), so ``materializer --version``, ``--help`` and ``get`` start
without loading the Kafka clients, RocksDB, the log engine or Spark that other commands need (issue 42).

:class:`LazyCommands` is the group's ``commands`` mapping: its keys are known from the start, a
value is imported on first access and prepared once (:func:`~materializer.cli.conventions.apply_conventions`).
:func:`format_sections` prints the group's command list from the one-line summaries kept beside
the names, without importing any command.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping

import click

__all__ = ["CommandSpec", "LazyCommands", "format_sections"]

#: Where a command lives and what ``--help`` says of it: (module, attribute, one-line summary).
CommandSpec = tuple[str, str, str]


class LazyCommands(MutableMapping[str, click.Command]):
    """Command name -> :class:`click.Command`, imported from its module on first access.

    ``specs``: name -> :data:`CommandSpec`; ``prepare(name, command)`` is called once per command,
    after its import (the conventions every command follows), and returns the command to keep.
    Iterating, ``len`` and ``in`` import nothing; ``[name]`` and ``.get(name)`` import that one command
    (its module's import errors propagate). Commands added with ``Group.add_command`` are kept as given.
    """

    def __init__(self, specs: Mapping[str, CommandSpec],
                 prepare: Callable[[str, click.Command], click.Command]) -> None:
        self._specs = dict(specs)
        self._prepare = prepare
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            module, attribute, _ = self._specs[name]  # KeyError: no such command
            command = self._prepare(name, getattr(importlib.import_module(module), attribute))
            self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._specs.pop(name, None)
        self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._specs or name in self._loaded

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._specs, *self._loaded]))

    def __len__(self) -> int:
        return len(set(self._specs) | set(self._loaded))

    def summary(self, name: str) -> str:
        """The one-line summary of ``name`` (its spec's; a command added later: its short help)."""
        if name in self._specs:
            return self._specs[name][2]
        return self._loaded[name].get_short_help_str(limit=200)


def format_sections(commands: LazyCommands, sections: Mapping[str, Mapping[str, CommandSpec]],
                    formatter: click.HelpFormatter) -> None:
    """Write one definition list per section (its title, then each command's name and summary), then
    the commands of no section under "Other commands"; nothing is imported."""
    placed: set[str] = set()
    rows_by_title: dict[str, list[tuple[str, str]]] = {}
    for title, specs in sections.items():
        rows_by_title[title] = [(name, commands.summary(name)) for name in specs if name in commands]
        placed.update(specs)
    rest = [(name, commands.summary(name)) for name in commands if name not in placed]
    if rest:
        rows_by_title.setdefault("Other commands", []).extend(rest)
    for title, rows in rows_by_title.items():
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)

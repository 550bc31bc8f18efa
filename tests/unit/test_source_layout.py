"""docs/development.md's layout tree names every package folder of the code, and nothing else.

A folder counts when it is a Python package (an ``__init__.py``) under ``storage/``, ``adapters/``
or ``materializer/``, or a module folder of the native crate (``storage/native/src/*/``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_TOP = ("storage", "adapters", "materializer")


def _tree_folders() -> set[str]:
    """The folders the tree block under "Source layout" names, as paths from the checkout's root."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text[text.index("## Source layout"):]
    start = section.index("```text\n") + len("```text\n")
    block = section[start:section.index("\n```", start)]
    folders: set[str] = set()
    parents: list[str] = []  # the folder named at each depth above the current line
    for line in block.splitlines():
        found = re.match(r"^([│├└─ ]*)(\S+/)\s", line)
        assert found is not None, f"docs/development.md: a tree line without a folder: {line!r}"
        depth = len(found.group(1)) // 4
        parents[depth:] = [found.group(2)]
        folders.add("".join(parents).rstrip("/"))
    return folders


def _code_folders() -> set[str]:
    """The package folders and native module folders that exist."""
    folders = set(_TOP)
    for top in _TOP:
        for init in (ROOT / top).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT).as_posix()
            if "/native/" not in relative:
                folders.add(relative)
    native = ROOT / "storage" / "native" / "src"
    folders.add(native.relative_to(ROOT).as_posix())
    folders.update(d.relative_to(ROOT).as_posix() for d in native.iterdir() if d.is_dir())
    return folders


def test_the_layout_tree_names_every_package_folder_and_nothing_else() -> None:
    tree, code = _tree_folders(), _code_folders()
    assert tree - code == set(), "named in docs/development.md but not in the code"
    assert code - tree == set(), "in the code but not in docs/development.md's tree"

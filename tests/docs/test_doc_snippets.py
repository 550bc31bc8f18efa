"""Every shell and Python block of README.md and docs/*.md runs, in order, as a user would run it.

Snippets are parsed with Sybil's Markdown parsers; each document gets one working directory
(with ``examples`` and ``benchmarks`` linked in, as in a clone) and one environment shared by its blocks:

* ```` ```bash ```` blocks run with ``bash -euo pipefail`` in that directory; variables they export
  (``export BOOTSTRAP=$(materializer broker start)``) and a ``cd`` carry over to the next blocks.
* ```` ```python ```` blocks run each in its own interpreter, in that directory and environment, so
  each imports what it uses. A block preceded by ``<!-- file: NAME -->`` is written to NAME instead
  (a test file to run).
* ```` ```text ```` blocks are not run, except after ``<!-- output -->``: each of their lines must
  match a line of the previous block's stdout, in order (``...`` matches anything).
* ``<!-- skip: next "reason" -->`` (Sybil's skip) leaves one block out, with its reason.
* Any other fence language, or a fence without one, fails :func:`test_every_fence_is_run_or_text`.

The environment holds ``BOOTSTRAP`` (the session broker of the pytest plugin) and
``KAFKA_LOG_DIRS`` (its ``log.dirs``), and ``PATH`` starts with this interpreter's ``bin``
(``materializer``, ``python``, ``pytest``). A local broker a snippet started in its working
directory (``broker.json``) is stopped when the module ends.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import unittest
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
from sybil import Document, Example, Region
from sybil.evaluators.python import pad
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.typing import Parser

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
RUN_LANGUAGES = {"bash", "python"}
TEXT_LANGUAGES = {"text"}
SNIPPET_TIMEOUT_S = 300
_FILE_DIRECTIVE = re.compile(r"<!--\s*file:\s*(\S+)\s*-->\s*$")
_OUTPUT_BLOCK = re.compile(r"<!--\s*output\s*-->[ \t]*\n```text[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_FENCE = re.compile(r"^(\s*)```(.*)$", re.M)

pytestmark = pytest.mark.broker


@dataclass
class DocumentState:
    """One document's working directory, environment and the stdout of its last run block."""

    workdir: Path
    env: dict[str, str]
    cwd: Path
    stdout: str = ""
    failed_at: int | None = None


def _parse_output_blocks(document: Document) -> Iterator[Region]:
    for match in _OUTPUT_BLOCK.finditer(document.text):
        yield Region(match.start(), match.end(), match.group(1), _check_output)




def _examples() -> list[tuple[Path, int]]:
    return [(path, index) for path in DOCUMENTS for index, _ in enumerate(Document.parse(str(path), *PARSERS))]


_STATES: dict[str, DocumentState] = {}
_DOCUMENTS: dict[str, Document] = {}


def _document(path: Path) -> Document:
    if str(path) not in _DOCUMENTS:
        _DOCUMENTS[str(path)] = Document.parse(str(path), *PARSERS)
    return _DOCUMENTS[str(path)]


def _state(example: Example) -> DocumentState:
    return _STATES[example.path]


# ---------------------------------------------------------------------------------------------- evaluators

def _run_bash(example: Example) -> str | None:
    state = _state(example)
    env_file = state.workdir / ".snippet-env"
    script = f"set -euo pipefail\n{example.parsed}\nenv -0 > {shlex.quote(str(env_file))}\n"
    try:
        done = subprocess.run(["bash", "-c", script], cwd=state.cwd, env=state.env, capture_output=True,
                              text=True, timeout=SNIPPET_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:  # its output is bytes, whatever text= said
        output = [(part or b"").decode(errors="replace") if isinstance(part, bytes) else (part or "")
                  for part in (exc.stdout, exc.stderr)]
        return f"bash block timed out after {SNIPPET_TIMEOUT_S} s; stdout:\n{output[0]}\nstderr:\n{output[1]}"
    state.stdout = done.stdout
    if done.returncode != 0:
        return (f"bash block exited {done.returncode}\n--- stdout (tail)\n{done.stdout[-3000:]}\n"
                f"--- stderr (tail)\n{done.stderr[-3000:]}")
    entries = [entry.split("=", 1) for entry in env_file.read_text().split("\0") if "=" in entry]
    new_env = {name: value for name, value in entries if name not in ("_", "SHLVL", "OLDPWD")}
    state.cwd = Path(new_env.pop("PWD", str(state.cwd)))
    state.env = new_env
    return None


# Each block runs in its own interpreter, as `python snippet.py` would: the pytest process keeps its
# environment, working directory and threads, and a Spark driver JVM a block starts dies with it
# (a JVM left in this process would keep its class path for the Spark tests that run later).
_RUN_WITH_DOC_LINES = "import sys; exec(compile(sys.stdin.read(), sys.argv[1], 'exec'), {'__name__': '__main__'})"


def _run_python(example: Example) -> str | None:
    state = _state(example)
    before = example.document.text[:example.start].rstrip("\n")
    directive = _FILE_DIRECTIVE.search(before.rsplit("\n", 1)[-1])
    if directive is not None:  # a file the next blocks use, e.g. a test module for an inner pytest run
        (state.cwd / directive.group(1)).write_text(example.parsed)
        return None
    # padded so that a traceback names the document's own lines
    source = pad(example.parsed, example.line + example.parsed.line_offset)
    try:
        done = subprocess.run([sys.executable, "-c", _RUN_WITH_DOC_LINES, example.path], input=source,
                              cwd=state.cwd, env=state.env, capture_output=True, text=True,
                              timeout=SNIPPET_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"python block timed out after {SNIPPET_TIMEOUT_S} s"
    state.stdout = done.stdout
    if done.returncode != 0:
        return (f"python block exited {done.returncode}\n--- stdout (tail)\n{done.stdout[-3000:]}\n"
                f"--- stderr (tail)\n{done.stderr[-3000:]}")
    return None


def _check_output(example: Example) -> str | None:
    """Each expected line matches a later line of the previous block's stdout (``...`` = anything)."""
    actual = _state(example).stdout.splitlines()
    position = 0
    for expected in str(example.parsed).splitlines():
        pattern = re.compile(".*".join(re.escape(part) for part in expected.strip().split("...")))
        while position < len(actual) and not pattern.fullmatch(actual[position].strip()):
            position += 1
        if position == len(actual):
            return f"expected output line {expected!r} not found (in order) in:\n" + "\n".join(actual)
        position += 1
    return None


PARSERS: list[Parser] = [
    CodeBlockParser("python", evaluator=_run_python),
    CodeBlockParser("bash", evaluator=_run_bash),
    SkipParser(),
    _parse_output_blocks,
]


# ---------------------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def doc_states(kafka_materializer_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One working directory and environment per document; brokers the snippets started are stopped."""
    base = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "KAFKA_MATERIALIZER_"))}
    base.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    base["PATH"] = f"{BIN}{os.pathsep}{base.get('PATH', '')}"
    base["BOOTSTRAP"] = kafka_materializer_broker.bootstrap_servers
    if kafka_materializer_broker.log_dirs is None:
        pytest.fail(f"the doc snippets read the broker's log.dirs, which the {kafka_materializer_broker.kind} broker "
                    "does not expose here: use --kafka-broker=local, or an external broker with KAFKA_LOG_DIRS")
    base["KAFKA_LOG_DIRS"] = str(kafka_materializer_broker.log_dirs)
    for path in DOCUMENTS:
        workdir = tmp_path_factory.mktemp(f"doc-{path.stem}")
        for linked in ("examples", "benchmarks"):
            (workdir / linked).symlink_to(ROOT / linked)
        _STATES[str(path)] = DocumentState(workdir, dict(base), workdir)
    yield
    for state in _STATES.values():
        for record in state.workdir.rglob("broker.json"):
            subprocess.run([str(BIN / "materializer"), "broker", "stop", "--state-dir", str(record.parent)],
                           capture_output=True, timeout=60)
    _STATES.clear()


@pytest.mark.parametrize(("path", "index"), _examples(),
                         ids=lambda value: value.name if isinstance(value, Path) else str(value))
def test_snippet(path: Path, index: int, doc_states: None) -> None:
    """Run one block; blocks of one document share a directory and an environment."""
    example = list(_document(path))[index]
    state = _STATES[str(path)]
    where = f"{path.relative_to(ROOT)}:{example.line}"
    if state.failed_at is not None:
        pytest.fail(f"{where}: not run, an earlier block of this document failed (line {state.failed_at})")
    try:
        example.evaluate()
    except unittest.SkipTest as skip:
        pytest.skip(f"{where}: {skip}")
    except BaseException:
        state.failed_at = example.line
        raise


def test_every_fence_is_run_or_text() -> None:
    """A block in another language (or none) would silently not run: only bash, python and text are allowed."""
    wrong = []
    for path in DOCUMENTS:
        inside = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = _FENCE.match(line)
            if match is None:
                continue
            if inside:
                inside = False
                continue
            inside = True
            language = match.group(2).strip()
            if language not in RUN_LANGUAGES | TEXT_LANGUAGES:
                wrong.append(f"{path.relative_to(ROOT)}:{number}: ```{language}")
    assert not wrong, "fences that are neither run nor text:\n" + "\n".join(wrong)


def test_readme_make_targets_exist() -> None:
    """The README's first block (``make demo``, ``make test``) is what CI runs; here: both targets exist."""
    done = subprocess.run(["make", "-n", "demo", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "materializer demo" in done.stdout and "pytest" in done.stdout


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_relative_links_resolve() -> None:
    """Every relative link of README.md and docs/ names an existing file and, with #anchor, a heading in it."""
    broken = []
    for path in DOCUMENTS:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}: no such file")
                continue
            if anchor and linked.suffix == ".md":
                prose = re.sub(r"^```.*?^```", "", linked.read_text(), flags=re.S | re.M)
                headings = re.findall(r"^#+\s+(.*)$", prose, flags=re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{path.relative_to(ROOT)}: {target}: no heading with that anchor")
    assert not broken, "\n".join(broken)



def test_fixture_table_names_the_plugins_fixtures(request: pytest.FixtureRequest) -> None:
    """docs/testing.md's table: every fixture and alias exists with the scope the table gives, and every
    public fixture of the plugin is in the table."""
    from materializer.testing import pytest_plugin

    rows = re.findall(r"^\| `(kafka_materializer_\w+)`(?: \(`(\w+)`\))? \| (\w+) \|",
                      (ROOT / "docs" / "testing.md").read_text(), flags=re.M)
    documented = {name for name, _, _ in rows}
    public = {name for name in pytest_plugin.__all__ if name.startswith("kafka_materializer_")}
    assert documented == public, f"table {sorted(documented)} != plugin {sorted(public)}"
    for name, alias, scope in rows:
        for fixture in filter(None, (name, alias)):
            definitions = request._fixturemanager.getfixturedefs(fixture, request.node)
            assert definitions, f"docs/testing.md names fixture {fixture!r}, which the plugin does not define"
            assert definitions[-1].scope == scope, f"{fixture}: scope {definitions[-1].scope}, table says {scope}"


def test_plugin_options_named_in_docs_exist(pytestconfig: pytest.Config) -> None:
    """Every ``--kafka-*`` option docs/testing.md names is one the plugin registers."""
    named = set(re.findall(r"--kafka-[a-z-]+", (ROOT / "docs" / "testing.md").read_text()))
    assert named
    for option in sorted(named):
        pytestconfig.getoption(option)  # ValueError: no option named ...


def _command_options(command: Any) -> set[str]:
    options = {"--help"}
    for param in command.params:
        options.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    return options


def test_cli_options_named_in_docs_exist() -> None:
    """Every ``--option`` written after ``materializer COMMAND`` in README.md or docs/ is in that command's
    ``--help`` (``a|b`` alternatives: in at least one of them)."""
    import click

    from materializer.cli import main

    wrong = []
    for path in DOCUMENTS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in re.finditer(r"\bmaterializer ((?:[^`|#]|\|(?=[a-z]))*)", line):
                tokens = [t.strip("[]()") for t in match.group(1).split()]
                commands: list[Any] = [main]
                index = 0
                while index < len(tokens):
                    names = tokens[index].split("|")
                    groups = [c for c in commands if isinstance(c, click.Group)]
                    found = [g.commands[n] for g in groups for n in names if n in g.commands]
                    if not found or len(found) != len(names):
                        break
                    commands, index = found, index + 1
                if commands == [main] and not (tokens and tokens[0].startswith("--")):
                    continue  # prose, e.g. "materializer's"
                for token in tokens[index:]:
                    option = token.split("=", 1)[0]
                    if re.fullmatch(r"--[a-z][a-z-]*", option) and not any(
                            option in _command_options(c) for c in commands):
                        wrong.append(f"{path.relative_to(ROOT)}:{number}: {option} is not an option of "
                                     f"{'/'.join(c.name for c in commands)}")
    assert not wrong, "\n".join(wrong)


def test_readme_stays_a_front_door() -> None:
    """Issue 23: the README is at most 300 lines; the reference lives in docs/. Only its first block (make demo,
    make test) is left out of the snippet run, and nothing in docs/ is."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, f"README.md has {len(readme.splitlines())} lines"
    skips = {path.name: len(re.findall(r"^[ \t]*<!--+\s*skip\b", path.read_text(), flags=re.M)) for path in DOCUMENTS}
    assert skips == {path.name: int(path.name == "README.md") for path in DOCUMENTS}, skips


def test_metrics_table_matches_the_metrics_served() -> None:
    """docs/operations.md's metrics table lists exactly :data:`materializer.metrics.METRICS`: name, type,
    labels (``topic`` first) and help text."""
    from materializer.metrics import METRICS

    rows = re.findall(r"^\| `(materializer_\w+)` \| (\w+) \| ([\w, ]+) \| (.*) \|$",
                      (ROOT / "docs" / "operations.md").read_text(), flags=re.M)
    documented = {name: (kind, tuple(labels.split(", ")), help_text) for name, kind, labels, help_text in rows}
    served = {name: (kind, ("topic", *labels), help_text) for name, (kind, labels, help_text) in METRICS.items()}
    assert documented == served

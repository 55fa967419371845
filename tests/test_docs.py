"""The documentation (README.md and the MkDocs site in docs/) says what forkq does.

What keeps it true: the site builds with ``mkdocs build --strict`` (a broken link or anchor,
or a page left out of the navigation, fails it, and docs/hooks.py fails it when the settings
table differs from ``SETTINGS``); every YAML example that is a forkq configuration loads with
forkq's own loader; every command line of a shell example is one that forkq's own argument
parser accepts (``python -m`` modules exist, ``pip install`` extras are declared); every Python
example compiles; the configuration errors shown are the loader's words; ``.ci/run`` runs
exactly the README's test command; the README's links and the doc sections that etc/ and
systemd/ name exist. The settings table itself is checked in tests/test_config.py, the ACL
line in tests/test_tls_acl.py (which runs the daemon as that user).
"""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest
import yaml
from markdown.extensions.toc import slugify

from forkq import cli
from forkq.config import ENVIRONMENT_SECTIONS, import_required, load_file
from forkq.errors import ConfigError

from .conftest import ROOT

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```",
                   re.MULTILINE | re.DOTALL)
# A YAML example for another program starts with a comment naming that program's file.
FOREIGN_YAML = ("# prometheus.yml",)
ENVIRON = {"REDIS_URL": "redis://127.0.0.1:6379/0"}


def docs_hooks() -> ModuleType:
    """docs/hooks.py (the MkDocs hook that renders the settings table), imported by path."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Block(NamedTuple):
    page: Path
    line: int
    lang: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(*langs: str) -> list[Block]:
    """Every fenced code block of the pages in one of ``langs``, dedented (list items indent)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match["lang"] in langs:
                indent = len(match["indent"])
                body = "".join(line[indent:] for line in match["body"].splitlines(True))
                found.append(Block(page, text.count("\n", 0, match.start()) + 1, match["lang"],
                                   body))
    return found


def ids(items: list[Any]) -> list[str]:
    return [item.where for item in items]


# -- the site -------------------------------------------------------------------------------


@pytest.mark.process
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    built = {path.parent.name for path in site.glob("*/index.html")}
    assert built == {page.stem for page in DOCS.glob("*.md") if page.stem != "index"}
    assert "config_file" in (site / "configuration" / "index.html").read_text()


# -- YAML, shell and Python examples --------------------------------------------------------

YAML = blocks("yaml")


@pytest.mark.parametrize("block", YAML, ids=ids(YAML))
def test_every_yaml_example_loads(block: Block, tmp_path: Path) -> None:
    """A forkq configuration loads as it is, and with each environment section it has."""
    if block.body.startswith(FOREIGN_YAML):
        assert yaml.safe_load(block.body), block.where
        return
    path = tmp_path / "forkq.yml"
    path.write_text(block.body)
    load_file(str(path), ENVIRON)
    document = yaml.safe_load(block.body)
    for section in ENVIRONMENT_SECTIONS & set(document):
        load_file(str(path), ENVIRON, environment=section)


class Command(NamedTuple):
    block: Block
    words: list[str]

    @property
    def where(self) -> str:
        return f"{self.block.where}: {shlex.join(self.words)}"


def commands() -> Iterator[Command]:
    """Each simple command of the shell examples, without its leading variable assignments."""
    for block in blocks("sh"):
        for line in block.body.splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                command, words = words[:cut], words[cut + 1:]
                while command and re.match(r"^[A-Z_][A-Z0-9_]*=", command[0]):
                    command = command[1:]
                if command:
                    yield Command(block, command)


COMMANDS = list(commands())


def test_the_shell_examples_are_found() -> None:
    programs = {Path(command.words[0]).name for command in COMMANDS}
    assert {"forkq", "python", "python3", "pip", "mkdocs"} <= programs


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_every_shell_example_is_a_valid_command(command: Command,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    program, *args = command.words
    name = Path(program).name
    if name == "forkq":
        _parse_forkq(args, monkeypatch)
    elif name in ("python", "python3") and args[:1] == ["-m"]:
        assert importlib.util.find_spec(args[1]) is not None, f"no module {args[1]}"
    elif name in ("python", "python3") and args[0].startswith("bench/"):
        script = ROOT / args[0]
        assert script.is_file(), f"no script {args[0]}"
        source = script.read_text()
        for flag in (word for word in args[1:] if word.startswith("-")):
            assert f'"{flag}"' in source, f"{args[0]} declares no option {flag}"
    elif name == "pip":
        assert args[0] == "install"
        for extra in re.findall(r"^\.\[(\w+)\]$", args[-1]):
            assert extra in _extras(), f"setup.cfg declares no extra {extra!r}"
    else:
        assert name == "mkdocs" and args[0] in ("build", "serve"), command.where


def _parse_forkq(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``forkq.cli.main`` on ``args`` with every command's action replaced by a no-op."""
    parsed = []
    real = cli._parser

    def recording_parser() -> Any:
        parser = real()
        parse = parser.parse_args

        def parse_args(words: list[str]) -> Any:
            namespace = parse(words)
            namespace.func = lambda _: 0
            parsed.append(namespace)
            return namespace

        parser.parse_args = parse_args  # type: ignore[method-assign]
        return parser

    monkeypatch.setattr(cli, "_parser", recording_parser)
    try:
        assert cli.main(args) == 0
    except SystemExit as exc:  # argparse refused the words (it printed why)
        pytest.fail(f"forkq {shlex.join(args)}: exit {exc.code}")
    assert len(parsed) == 1


def _extras() -> set[str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return set(setup["options.extras_require"])


PYTHON = blocks("python")


@pytest.mark.parametrize("block", PYTHON, ids=ids(PYTHON))
def test_every_python_example_compiles(block: Block) -> None:
    compile(block.body, block.where, "exec")


def test_the_documented_config_errors_are_the_loaders_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = (DOCS / "configuration.md").read_text()
    monkeypatch.chdir(tmp_path)
    Path("forkq.yml").write_text("queues:\n  - [critical, 3]\n  - [low, 0]\n")
    with pytest.raises(ConfigError) as weight:
        load_file("forkq.yml", {})
    Path("forkq.yml").write_text("require: nosuch.module\n")
    with pytest.raises(ConfigError) as module:
        import_required(load_file("forkq.yml", {}))
    for error in (weight.value, module.value):
        assert f"\nforkq: config error: {error}\n" in page


# -- the README's two commands, its links, and the sections other files name ----------------


def _readme_commands() -> tuple[str, str]:
    """Commands 1 and 2 of the README's first shell block."""
    block = next(block for block in blocks("sh") if block.page.name == "README.md")
    lines = [line for line in block.body.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 2, block.where
    return lines[0], lines[1]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    demo, suite = _readme_commands()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == suite == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest")
    # tests/test_cli.py runs the demo as this command does (forkq demo -C etc/forkq.yml)
    assert demo.endswith(" && .venv/bin/forkq demo -C etc/forkq.yml")
    started = (DOCS / "getting-started.md").read_text()
    assert f"\n{demo}\n" in started and f"\n{suite}\n" in started


def test_the_test_extra_installs_the_site_builder() -> None:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    required = {re.split(r"[<>=!~\[ ]", line.strip())[0]
                for line in setup["options.extras_require"]["test"].splitlines() if line}
    assert {"mkdocs", "mkdocs-material"} <= required


def _headings(page: Path) -> set[str]:
    return {slugify(line.lstrip("#").strip(), "-")
            for line in page.read_text().splitlines() if re.match(r"^#{1,6} ", line)}


def test_the_readme_links_lead_somewhere() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), link
        if anchor:
            assert anchor in _headings(target), link


def test_the_doc_sections_named_by_the_shipped_files_exist() -> None:
    named = 0
    for shipped in [ROOT / "etc" / "forkq.yml", *sorted((ROOT / "systemd").glob("*"))]:
        text = " ".join(shipped.read_text().replace("#", " ").split())
        for page, section in re.findall(r"docs/([\w-]+\.md), \"([^\"]+)\"", text):
            named += 1
            assert slugify(section, "-") in _headings(DOCS / page), (shipped.name, page, section)
    assert named

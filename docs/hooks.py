"""The settings table of docs/configuration.md, rendered from :data:`forkq.config.SETTINGS`.

The table is committed between two markers so it reads on any Markdown viewer, and it never
drifts from the one declaration of the settings: as an MkDocs hook (``hooks:`` in mkdocs.yml)
this module fails the build when the committed table differs from the rendered one, and
``tests/test_config.py`` checks the same. After changing a setting, rewrite the table with::

    .venv/bin/python docs/hooks.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from forkq.config import REDIS_URL_FALLBACK, SETTINGS, Setting

PAGE = Path(__file__).parent / "configuration.md"
BEGIN = ("<!-- settings table: rendered from forkq.config.SETTINGS by `python docs/hooks.py`; "
         "do not edit by hand -->")
END = "<!-- end of settings table -->"
NONE = "\N{EN DASH}"
# What a HUP does with a changed value, by Setting.reload.
ON_HUP = {"restart": "restart", "master": "at once", "scheduler": "new scheduler",
          "children": "new children"}
# Defaults that config._build derives rather than takes from Config's field default.
DERIVED = {"strict": "true if all weights are 1"}


def settings_table() -> str:
    """The Markdown table: one row per setting, in declaration order."""
    rows = ["| setting | flag | environment | default | on HUP | meaning |",
            "|---|---|---|---|---|---|"]
    for setting in SETTINGS:
        meaning = setting.doc if setting.in_file else f"{setting.doc} (not a YAML key)"
        cells = (f"`{setting.name}`", _flags(setting), _variable(setting), _default(setting),
                 ON_HUP[setting.reload], meaning)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def _flags(setting: Setting) -> str:
    if not setting.flags:
        return NONE
    # The metavar stays out of the code span: a pipe in it must be escaped for the table, and
    # only outside a code span do both GitHub and Python-Markdown drop the backslash.
    first, *others = setting.flags
    shown = [f"`{first}` {setting.metavar}" if setting.metavar else f"`{first}`"]
    shown += [f"`{flag}`" for flag in others]
    return ", ".join(shown) + (" (repeat)" if setting.repeat else "")


def _variable(setting: Setting) -> str:
    if setting.variable is None:
        return NONE
    if setting.name == "redis_url":
        return f"`{setting.variable}`, then `{REDIS_URL_FALLBACK}`"
    return f"`{setting.variable}`"


def _default(setting: Setting) -> str:
    if setting.name in DERIVED:
        return DERIVED[setting.name]
    value = setting.default
    if value is None or value == "":
        return NONE
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, tuple):
        items = (item[0] if isinstance(item, tuple) else item for item in value)
        return f"`[{', '.join(map(str, items))}]`"
    return f"`{value}`"


def committed_table(text: str) -> str:
    """The table between the markers of ``text`` (the page's Markdown)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{PAGE.name} lacks the settings table's markers")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: refuse to build a page whose settings table is not the rendered one."""
    if page.file.src_uri == PAGE.name and committed_table(markdown) != settings_table():
        from mkdocs.exceptions import PluginError

        raise PluginError(f"the settings table of docs/{PAGE.name} differs from "
                          "forkq.config.SETTINGS: run `python docs/hooks.py` to rewrite it")
    return markdown


def main() -> int:
    """Rewrite the table in docs/configuration.md."""
    text = PAGE.read_text()
    old = committed_table(text)
    head, rest = text.split(BEGIN, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{settings_table()}\n{END}{rest.split(END, 1)[1]}")
    print(f"{PAGE}: settings table {'unchanged' if old == settings_table() else 'rewritten'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The settings' documentation, written from the fields' docstrings, which are its one source.

The comment of each `econfig` and `curriculum` key in config.yaml and the settings table of
docs/episode.md are each field's first docstring sentence (plus the allowed values of a `Choice`, and for
a derived setting its source, from `DERIVED_EPISODE_FIELDS`). After changing a docstring, a field or a
derivation, rewrite both files:

    python -m examples.tau2.settings.docs

tests/settings/test_docs.py fails while a file differs from what this writes.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.tau2.settings.config import DERIVED_EPISODE_FIELDS, CurriculumConfig, Tau2TrainEnvConfig
from examples.tau2.tau2_utils import Choice, Tau2EnvConfig, choice_type

TAU2 = Path(__file__).resolve().parents[1]
CONFIG_YAML = TAU2 / "config.yaml"
EPISODE_MD = TAU2 / "docs" / "episode.md"
SETTINGS_HEADING = "## Episode settings (`econfig` / workflow kwargs)"
COMMENT_COLUMN = 32
"""config.yaml's comments start at this column (a value longer than the space before it pushes it on)."""
LINE_WIDTH = 110
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)\.(?=\s|$)")
"""A period that ends a sentence: before white space or the end, and not that of "e.g." or "i.e."."""


@dataclass(frozen=True)
class Section:
    """A section of config.yaml whose keys are the fields of `cls`."""

    cls: type
    header: str = ""
    """The section line's own comment, written too; empty: the line stays as it is."""


def field_docs(cls: type) -> dict[str, str]:
    """Field -> its docstring (the string literal after it, as `ast` reads the class), a subclass's
    overriding a base class's; a field re-declared without one keeps the base class's."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass.__module__.split(".")[0] != "examples":
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        assert isinstance(body, ast.ClassDef)
        for statement, after in zip(body.body, body.body[1:], strict=False):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[statement.target.id] = inspect.cleandoc(after.value.value)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
    if missing:
        raise ValueError(f"{cls.__name__} fields without a docstring: {', '.join(missing)}")
    return docs


def first_sentence(doc: str) -> str:
    text = " ".join(doc.split())
    end = SENTENCE_END.search(text)
    return text[: end.end()] if end else text


def describe(cls: type, name: str) -> str:
    """What config.yaml and the table say about a field: its first docstring sentence, and a `Choice`'s
    values."""
    text = first_sentence(field_docs(cls)[name])
    kind = choice_type(typing.get_type_hints(cls)[name])
    return f"{text} One of {', '.join(kind.values())}." if kind else text


def yaml_value(value: Any) -> str:
    """A default as YAML writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Choice):
        return value.value
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    return str(value) if value != "" else '""'


def default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


# ---------------------------------------------------------------------------------------------
# config.yaml


SECTIONS = {
    "econfig": Section(Tau2TrainEnvConfig, header="derived, left unset here: "
                       + ", ".join(DERIVED_EPISODE_FIELDS) + " (docs/episode.md)"),
    "curriculum": Section(CurriculumConfig),
}


def _split_comment(line: str) -> tuple[str, str]:
    """(the line before its comment, the comment's text); a `#` inside quotes is part of the value."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _commented(code: str, comment: str) -> list[str]:
    """`code` with `comment` at the comment column, wrapped onto comment lines there."""
    first = f"{code:<{COMMENT_COLUMN - 1}} # " if len(code) < COMMENT_COLUMN - 1 else f"{code}  # "
    return textwrap.wrap(comment, width=LINE_WIDTH, initial_indent=first,
                         subsequent_indent=" " * COMMENT_COLUMN + "# ", break_on_hyphens=False,
                         break_long_words=False)


def render_config(text: str) -> str:
    """config.yaml with the comments of its `SECTIONS` keys written from the docstrings. A comment line at
    the comment column continues the line above, and is written again with it; any other line stays."""
    out: list[str] = []
    section: Section | None = None
    for line in text.splitlines():
        code, comment = _split_comment(line)
        indent = len(line) - len(line.lstrip())
        if line[:1].strip() and not line.startswith("#"):  # a top-level key: a section starts
            section = SECTIONS.get(code.split(":")[0])
            out += _commented(code, section.header) if section and section.header else [line]
        elif section is None or not line.strip():
            out.append(line)
        elif not code and indent == COMMENT_COLUMN:
            continue  # a continuation: written again with its key
        elif indent == 2 and code:
            name = code.strip().split(":")[0]
            if name not in {f.name for f in dataclasses.fields(section.cls)}:
                raise ValueError(f"config.yaml: {name} is not a field of {section.cls.__name__}")
            out += _commented(code, describe(section.cls, name))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# docs/episode.md


def settings_table() -> list[str]:
    """The settings section's text: a row per `Tau2EnvConfig` field."""
    intro = ("Every field of `Tau2EnvConfig` (`examples/tau2/tau2_utils.py`), as its docstring describes it: "
             "this table and config.yaml's comments are written from them (`python -m "
             "examples.tau2.settings.docs`). A setting with a source follows it in training and in "
             "validation episodes unless `econfig` sets it (`DERIVED_EPISODE_FIELDS` in "
             "`settings/config.py`); an explicit value that differs is refused. The defaults are the "
             "workflow's own, as a `Tau2EnvConfig` built in Python gets them; config.yaml sets some "
             "otherwise for training (docs/episode_to_row.md names those).")
    lines = ["", *textwrap.wrap(intro, width=LINE_WIDTH, break_on_hyphens=False), "",
             "| setting | default (source) | what it is |", "| --- | --- | --- |"]
    for field in dataclasses.fields(Tau2EnvConfig):
        value = f"`{yaml_value(default(field))}`"
        derived = DERIVED_EPISODE_FIELDS.get(field.name)
        if derived:
            value += f" (training: `{derived.source}`, validation: `{derived.validation}`)"
        text = describe(Tau2EnvConfig, field.name).replace("|", "\\|")
        lines.append(f"| `{field.name}` | {value} | {text} |")
    return lines


def render_episode_md(text: str) -> str:
    """docs/episode.md with the settings section written from the docstrings; the rest stays."""
    lines = text.splitlines()
    start = lines.index(SETTINGS_HEADING) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = [""] + lines[end:] if end < len(lines) else []
    return "\n".join(lines[:start] + settings_table() + tail) + "\n"


def main() -> int:
    for path, render in ((CONFIG_YAML, render_config), (EPISODE_MD, render_episode_md)):
        text = path.read_text()
        written = render(text)
        if written != text:
            path.write_text(written)
            print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

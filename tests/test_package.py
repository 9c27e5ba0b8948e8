"""Importing any module of the package changes no global state, and every module path we name exists.

The one named exception: `examples/tau2/__init__.py` sets LITELLM_LOCAL_MODEL_COST_MAP when the user
has not (it must precede tau2's import of litellm). Everything else — tau2's loguru routing, the tau2
cache's switch — happens in `setup_runtime()` or on first use, never at import.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import examples.tau2
from examples.tau2.settings.config import Tau2TrainEnvConfig

REPO = Path(__file__).resolve().parents[1]
VLLM_VENV_ONLY = {"examples.tau2.cpu.vllm_cpu_worker"}
"""Imports vLLM at module level: checked in the vLLM venv (tests/cpu/test_vllm_cpu_server.py)."""

SNAPSHOT = r'''
import json, logging, os, sys, threading, warnings

def snapshot():
    from loguru import logger as loguru_logger
    # The package's own loggers ("tau2_areal.*") may be created at import, but not configured.
    loggers = {name: (lg.level, len(lg.handlers), lg.propagate, lg.disabled)
               for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)
               and not (name.startswith("tau2_areal") and (lg.level, lg.handlers, lg.propagate,
                                                           lg.disabled) == (0, [], True, False))}
    root = logging.getLogger()
    return {
        "environ": dict(os.environ),
        "loguru_handlers": sorted(loguru_logger._core.handlers),
        "root_logger": [root.level, [type(h).__name__ for h in root.handlers]],
        "loggers": {k: list(v) for k, v in loggers.items()},
        "sys_path": list(sys.path),
        "threads": sorted(t.name for t in threading.enumerate()),
        "warning_filters": len(warnings.filters),
        "cwd": os.getcwd(),
    }
'''


UPSTREAM_MODULES = [
    "areal",
    "areal.api.cli_args",
    "areal.api.alloc_mode",
    "areal.experimental.openai",
    "areal.experimental.openai.proxy.proxy_rollout_server",
    "areal.experimental.openai.proxy.workflow",
    "areal.experimental.openai.tool_call_parser",
    "areal.experimental.engine.archon_engine",
    "areal.engine.fsdp_engine",
    "areal.engine.sglang_remote",
    "areal.engine.vllm_remote",
    "areal.infra.rpc.rpc_server",
    "areal.infra.scheduler.local",
    "areal.infra.scheduler.slurm",
    "areal.utils.stats_tracker",
    "tau2.registry",
    "tau2.orchestrator.orchestrator",
    "tau2.evaluator.evaluator",
    "tau2.user.user_simulator",
    "tau2.agent.llm_agent",
    "tau2.environment.environment",
    "sglang.srt.function_call.function_call_parser",
    "sglang.srt.parser.reasoning_parser",
]
"""Every AReaL, tau2 and SGLang module the project uses, directly or through AReaL's workers (which import
them by name): they import in a fresh interpreter, so nothing another test imported hides a missing
dependency, before the package's own (`test_importing_every_module_changes_no_global_state`)."""


def package_modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(examples.tau2.__path__, "examples.tau2.")]
    return sorted(n for n in names if n not in VLLM_VENV_ONLY)


def third_party_imports(modules: list[str]) -> list[list[str]]:
    """[module, name...] for every module-level import of a third-party package in the package (not
    `examples`, not the stdlib): what must be imported before the snapshot, names included, because a
    package may import more when a name is first taken from it (`from areal import PPOTrainer`)."""
    found: dict[str, set[str]] = {}
    for name in modules:
        path = REPO / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = REPO / name.replace(".", "/") / "__init__.py"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    found.setdefault(a.name, set())
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.setdefault(node.module, set()).update(a.name for a in node.names)
    skip = set(sys.stdlib_module_names) | {"examples", "__future__"}
    return [[m, *sorted(names)] for m, names in sorted(found.items()) if m.split(".")[0] not in skip]


def _run(code: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_importing_every_module_changes_no_global_state():
    modules = package_modules()
    assert "examples.tau2.tau2_agent" in modules and "examples.tau2.cpu.smoke" in modules
    deps = [*third_party_imports(modules), *([m] for m in UPSTREAM_MODULES),
            ["areal", "PPOTrainer"], ["areal.api.cli_args", "load_expr_config", "PPOConfig"]]
    code = SNAPSHOT + (
        "import importlib\n"
        f"for m, *names in {deps!r}:\n"
        "    mod = importlib.import_module(m)\n"
        "    for n in names:\n"
        "        getattr(mod, n, None) or importlib.import_module(f'{m}.{n}')\n"
        "before = snapshot()\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "after = snapshot()\n"
        "print(json.dumps({k: [before[k], after[k]] for k in before if before[k] != after[k]}))\n"
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    changed = _run(code, env)
    assert changed == {}, f"importing the package changed: {json.dumps(changed)[:3000]}"


def test_the_package_sets_only_the_litellm_cost_map_default():
    code = SNAPSHOT + (
        "before = snapshot()\n"
        "import examples.tau2\n"
        "after = snapshot()\n"
        "env = {k: v for k, v in after['environ'].items() if before['environ'].get(k) != v}\n"
        "rest = {k: 1 for k in before if k != 'environ' and before[k] != after[k]}\n"
        "print(json.dumps({'env': env, 'rest': rest}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    assert _run(code, env) == {"env": {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}, "rest": {}}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "False"  # the user's own choice stands
    assert _run(code, env) == {"env": {}, "rest": {}}


DOTTED = re.compile(r"\bexamples\.tau2(?:\.\w+)+")
"""A module path or object path in code, configs, scripts and docs: the strings AReaL's workers import
(workflows, config classes) and the `python -m` commands the docs give."""


def _defines(module_file: Path, name: str) -> bool:
    """Whether a module defines `name` at top level (read, not imported: some need vLLM's venv)."""
    tree = ast.parse(module_file.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):  # the longest prefix that is a module or package, then attributes
        base = REPO.joinpath(*parts[:n])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[n:]
            return not rest or rest[0].startswith("__") or (len(rest) <= 2 and _defines(module, rest[0]))
    return False


NAMES_WRONG_PATHS_ON_PURPOSE = {"tests/test_package.py", "tests/compat/test_replaced.py"}
"""This file (its checks' own examples), and the replaced-names check's planted module."""


def test_every_module_path_in_code_configs_and_docs_exists():
    """A module moved or renamed without its import strings, `python -m` commands and docs fails here."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    named: dict[str, set[str]] = {}
    for rel in tracked:
        if (Path(rel).suffix in (".py", ".md", ".yaml", ".sh", ".toml") and (REPO / rel).is_file()
                and rel not in NAMES_WRONG_PATHS_ON_PURPOSE):
            for dotted in DOTTED.findall((REPO / rel).read_text(encoding="utf-8")):
                named.setdefault(dotted.rstrip("."), set()).add(rel)
    assert "examples.tau2.tau2_agent.Tau2AgentWorkflow" in named
    assert not _resolves("examples.tau2.training.group_filter.drop_uniform_groups")  # groups: training.group
    assert not _resolves("examples.tau2.tau2_agent.Tau2AgentFlow")
    missing = {d: sorted(files) for d, files in named.items() if not _resolves(d)}
    assert not missing, missing


REPO_PATH = re.compile(r"\b(?:examples|scripts|tests|bench|requirements)/[\w./-]*\w")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_file_the_docs_name_or_link_exists():
    """Repository paths in the Markdown (`examples/...`, `scripts/...`, ...) and relative links exist."""
    missing = []
    for rel in tracked_markdown():
        text = (REPO / rel).read_text(encoding="utf-8")
        for path in REPO_PATH.findall(text):
            if not any(p.exists() for p in (REPO / path, REPO / Path(rel).parent / path)):
                missing.append(f"{rel}: {path}")
        for target in LINK.findall(text):
            if not target.startswith(("http://", "https://", "mailto:")) and not (
                    REPO / Path(rel).parent / target).exists():
                missing.append(f"{rel}: link {target}")
    assert not missing, "\n".join(missing)


PACKAGE = REPO / "examples" / "tau2"


def core_path() -> list[str]:
    """The README's numbered core path: the files each item starts with (before its first ': ')."""
    layout = (REPO / "README.md").read_text().split("## Layout", 1)[1].split("```", 1)[0]
    heads = re.findall(r"^\d+\. (.+?): ", layout, re.MULTILINE)
    return [f for head in heads for f in re.findall(r"`([^`]+)`", head)]


def module_file(dotted: str) -> Path | None:
    path = REPO.joinpath(*dotted.split("."))
    return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if p.is_file()), None)


def package_imports(path: Path, source: str | None = None) -> set[Path]:
    """The package's files that `path` imports anywhere (module level or inside a function; not under
    `if TYPE_CHECKING`); a package's `__init__.py` counts when it is imported by name and holds more than
    a docstring. An import inside a function keeps a refusal fast; the file it names is still read."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], base])
            names.extend([base, *(f"{base}.{alias.name}" for alias in node.names)])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text() if source is None else source))
    found = {module_file(n) for n in names if n.startswith("examples.tau2")}
    return {f for f in found if f is not None and not (
        f.name == "__init__.py" and all(isinstance(n, ast.Expr) for n in ast.parse(f.read_text()).body))}


def closure(files: list[Path]) -> set[Path]:
    seen: set[Path] = set()
    todo = list(files)
    while todo:
        path = todo.pop()
        if path not in seen and path.suffix == ".py":
            seen.add(path)
            todo += package_imports(path)
    return seen


def test_the_readme_core_path_is_the_closure_of_its_imports_and_holds_no_add_on():
    """Step 0 is the walk-through; every file the listed files import, anywhere, is listed; no add-on (the
    add-ons are pyproject.toml's forbidden modules)."""
    listed = core_path()
    assert listed[:2] == ["docs/episode_to_row.md", "tau2_agent.py"], listed
    assert [f for f in listed if not (PACKAGE / f).is_file()] == []
    python = [PACKAGE / f for f in listed if f.endswith(".py")]
    reached = closure(python)
    unlisted = sorted(str(f.relative_to(PACKAGE)) for f in reached - set(python))
    assert unlisted == [], "imported by the core path, not in the README's list"
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    add_ons = next(c for c in contracts if c["id"] == "core")["forbidden_modules"]
    folders = {PACKAGE / m.removeprefix("examples.tau2.") for m in add_ons}
    assert [str(f) for f in python if any(f.is_relative_to(folder) for folder in folders)] == []


def test_the_closure_counts_an_import_inside_a_function():
    """A core file that gains an import inside a function of a module outside the README's list adds that
    module to the closure (the test above then fails); an import under TYPE_CHECKING does not."""
    train, view = PACKAGE / "tau2_train.py", PACKAGE / "eval" / "view.py"
    source = train.read_text()
    assert view not in closure([PACKAGE / f for f in core_path() if f.endswith(".py")])
    planted = "\n\ndef planted():\n    from examples.tau2.eval import view\n"
    assert view in package_imports(train, source + planted)
    assert view not in package_imports(
        train, source + "\n\nif TYPE_CHECKING:\n    from examples.tau2.eval import view\n")


def test_the_readme_tree_names_every_module_in_its_room():
    """Each module of the package (its example domain aside) is named on its folder's lines of the tree."""
    tree = (REPO / "README.md").read_text().split("examples/tau2/\n", 1)[1].split("```", 1)[0]
    rooms: dict[str, str] = {}
    room = ""
    for line in tree.splitlines():
        head = re.match(r"^[├└]── (\S+)", line)
        room = head.group(1) if head else room
        rooms[room] = rooms.get(room, "") + line
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" or rel.parts[0] == "docs":
            continue
        room = f"{rel.parts[0]}/" if len(rel.parts) > 1 else rel.name
        if room not in rooms or (len(rel.parts) > 1 and path.name not in rooms[room]):
            missing.append(str(rel))
    assert missing == []


def test_every_room_of_the_package_stands_on_a_floor_of_the_import_contract():
    """A new module or folder of the package must be placed in pyproject.toml's layers (and, if it is an
    add-on, among the core's forbidden modules), or `lint-imports` would not look at it."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    floors = next(c for c in contracts if c["id"] == "floors")["layers"]
    placed = {m.strip().removeprefix("examples.tau2.") for floor in floors for m in floor.split("|")}
    rooms = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" and p.name != "__init__.py"}
    rooms |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == placed
    core = next(c for c in contracts if c["id"] == "core")
    split = core["source_modules"] + core["forbidden_modules"]
    assert sorted(m.removeprefix("examples.tau2.") for m in split) == sorted(placed)  # core or add-on, once


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=120)


def test_the_layers_hold_and_a_planted_import_of_an_add_on_from_the_core_breaks_them(tmp_path):
    """`lint-imports` keeps both contracts on the tree, and breaks both on a copy whose core imports an
    add-on, even inside a function."""
    shutil.copytree(REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    kept = lint_imports(tmp_path)
    assert kept.returncode == 0 and "2 kept, 0 broken" in ANSI.sub("", kept.stdout), kept.stdout
    llm = tmp_path / "examples" / "tau2" / "episode" / "llm.py"
    llm.write_text(llm.read_text() + "\n\ndef planted():\n    from examples.tau2.slurm import queue\n\n"
                   "    return queue\n")
    broken = lint_imports(tmp_path)
    out = ANSI.sub("", broken.stdout)
    assert broken.returncode == 1 and "0 kept, 2 broken" in out, out
    assert "examples.tau2.episode.llm -> examples.tau2.slurm.queue" in out


def test_no_class_is_built_at_run_time():
    """Every class is written out where an IDE finds it: none defined inside a function, none by `type()`."""
    built = []
    for path in sorted((REPO / "examples" / "tau2").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                built += [f"{path.name}: class {c.name} in {node.name}" for c in ast.walk(node)
                          if isinstance(c, ast.ClassDef)]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "type" \
                    and len(node.args) == 3:
                built.append(f"{path.name}:{node.lineno}: type(name, bases, namespace)")
    assert built == []


ANCHORED_LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*#*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: the rendered text lower-cased, punctuation dropped,
    spaces made hyphens; a repeated one gets -1, -2, ... (code fences hold no headings)."""
    anchors: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def tracked_markdown() -> list[str]:
    return subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.split()


def broken_anchors(pages: dict[str, str]) -> list[str]:
    """`page: link#anchor` for each link whose anchor no heading of its target page has (`pages`: path
    relative to the repository -> text; targets outside it are read from disk)."""
    broken = []
    for rel, text in pages.items():
        for target, anchor in ANCHORED_LINK.findall(FENCE.sub("", text)):
            if target.startswith(("http://", "https://")):
                continue
            page = os.path.normpath(Path(rel).parent / target) if target else rel
            body = pages.get(page) or ((REPO / page).read_text(encoding="utf-8") if (REPO / page).is_file()
                                       else None)
            if page.endswith(".md") and body is not None and anchor not in github_anchors(body):
                broken.append(f"{rel}: {target}#{anchor}")
    return broken


def test_every_anchor_a_doc_links_resolves_and_a_planted_broken_one_is_caught():
    pages = {rel: (REPO / rel).read_text(encoding="utf-8") for rel in tracked_markdown()}
    assert not broken_anchors(pages), "\n".join(broken_anchors(pages))
    planted = {**pages, "README.md": pages["README.md"] + "\n[x](bench/RESULTS.md#no-such-heading)\n"}
    assert broken_anchors(planted) == ["README.md: bench/RESULTS.md#no-such-heading"]


RL_COMMAND = re.compile(r"(?:bash \S*|`)tau2_rl\.sh ([a-z][a-z-]*)")
"""A command line, `bash .../tau2_rl.sh <command>` or `` `tau2_rl.sh <command>` ``, not prose about it."""
UPSTREAM_ECONFIG = {"user_llm", "user_llm_base_url"}
"""AReaL's own example's names, which TRAINING.md maps to this example's (`user_model`, `user_base_url`)."""


def tau2_rl_commands() -> set[str]:
    script = (PACKAGE / "tau2_rl.sh").read_text()
    dispatch = script.rsplit('case "$command" in', 1)[1]
    return set(re.findall(r"^\s+([a-z][a-z-]*)(?: \|[^)]*)?\)", dispatch, re.MULTILINE))


def unknown_names(pages: dict[str, str], commands: set[str], fields: set[str]) -> list[str]:
    """`page: what` for each `tau2_rl.sh <command>` that the script does not dispatch and each
    `econfig.<key>` (or `econfig.<prefix>*`) that is no field of the training's econfig."""
    unknown = []
    for rel, text in pages.items():
        unknown += [f"{rel}: tau2_rl.sh {c}" for c in RL_COMMAND.findall(text) if c not in commands]
        for key, star in re.findall(r"econfig\.([a-z_0-9]+)(\*?)", text):
            known = any(f.startswith(key) for f in fields) if star else key in fields | UPSTREAM_ECONFIG
            if not known:
                unknown.append(f"{rel}: econfig.{key}{star}")
    return unknown


def test_every_command_and_econfig_key_a_doc_shows_exists_and_a_planted_one_is_caught():
    pages = {rel: (REPO / rel).read_text(encoding="utf-8") for rel in tracked_markdown()}
    pages["examples/tau2/config.yaml"] = (PACKAGE / "config.yaml").read_text()
    commands, fields = tau2_rl_commands(), {f.name for f in dataclasses.fields(Tau2TrainEnvConfig)}
    assert {"smoke", "learn", "local", "slurm", "dry-run", "check-tasks", "eval", "help"} <= commands
    assert not unknown_names(pages, commands, fields), "\n".join(unknown_names(pages, commands, fields))
    planted = {"README.md": "bash examples/tau2/tau2_rl.sh train\n`econfig.user_url=...`"}
    assert unknown_names(planted, commands - {"smoke"}, fields - {"domain"}) == [
        "README.md: tau2_rl.sh train", "README.md: econfig.user_url"]
    renamed = {"README.md": "`econfig.domain=airline` after `tau2_rl.sh smoke`"}
    assert unknown_names(renamed, commands - {"smoke"}, fields - {"domain"}) == [
        "README.md: tau2_rl.sh smoke", "README.md: econfig.domain"]


def unknown_flags(pages: dict[str, str], code: str) -> list[str]:
    """`page: --flag` for each flag on a `tau2_rl.sh` command line in a doc (in backticks or an indented
    block) that no script, module or config of the repository mentions."""
    unknown = []
    for rel, text in pages.items():
        lines = (re.findall(r"`([^`\n]*tau2_rl\.sh[^`\n]*)`", text)
                 + re.findall(r"^ {4}(.*tau2_rl\.sh.*)$", text, re.MULTILINE))
        unknown += [f"{rel}: {flag}" for line in lines
                    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", line) if flag not in code]
    return unknown


def test_every_flag_a_doc_gives_tau2_rl_sh_exists_and_a_planted_one_is_caught():
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.yaml"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    code = "\n".join((REPO / f).read_text(encoding="utf-8", errors="replace") for f in files
                     if (REPO / f).is_file() and not f.startswith("tests/"))  # the product's, not a test's
    pages = {rel: (REPO / rel).read_text(encoding="utf-8") for rel in tracked_markdown()}
    assert not unknown_flags(pages, code), "\n".join(unknown_flags(pages, code))
    planted = {"README.md": "`bash examples/tau2/tau2_rl.sh learn --seeds 1 --no-such-flag`"}
    assert unknown_flags(planted, code) == ["README.md: --no-such-flag"]

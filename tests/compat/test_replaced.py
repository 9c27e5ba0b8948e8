"""compat/replaced.py: its tables list every upstream name the package replaces and every upstream private
name it reads, and each row still names what the installed releases have.

`check` walks the syntax tree of every module under examples/tau2 (the example domain in docs/ included) and
finds, heuristically, three things: a method of a project class over one an upstream class defines (through
project base classes and mixins too), an assignment or setattr to an attribute of an upstream module, class
or object (`self` in a subclass when the attribute is the upstream class's), and a read of an upstream
private name (a leading underscore, not a dunder; on an object the checker cannot place, any private name
the package never defines itself). Upstream classes are imported to walk their MRO; what they define is
read from their source, `self.x = ...` in their methods included.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import json
import pkgutil
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import examples.tau2
from examples.tau2.compat.replaced import PRIVATE_READS, REPLACED, VLLM
from examples.tau2.cpu.vllm_cpu_server import MOVED_MODULES

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = ("areal", "vllm", "sglang", "tau2")
VLLM_ONLY = ("vllm.", "areal.engine.vllm_ext.", "examples.tau2.cpu.vllm_cpu_worker.")
"""Names that import vLLM: resolved in the vLLM venv (`test_the_names_that_need_vllm_resolve_in_its_venv`)."""
UNSEEN = {"areal.models.tree_attn.module_archon.TreeAttentionWrapper": "setattr, with a name computed",
          **dict.fromkeys(MOVED_MODULES, "a `sys.modules` entry")}
"""Rows the checker cannot see being done, and why."""


def resolve(dotted: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = inspect.getattr_static(value, name) if inspect.isclass(value) else getattr(value, name)
        return value
    raise ImportError(dotted)


def called_with(attribute: Any) -> tuple[list[str], bool]:
    """The positional parameters a caller passes to a class attribute (without self/cls), and whether
    it takes `*args`."""
    function, bound = attribute, True
    if isinstance(attribute, property):
        function = attribute.fget
    elif isinstance(attribute, (staticmethod, classmethod)):
        function, bound = attribute.__func__, isinstance(attribute, classmethod)
    params = list(inspect.signature(function).parameters.values())[1 if bound else 0:]
    return ([p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
            any(p.kind is p.VAR_POSITIONAL for p in params))


def method_parameters(dotted: str) -> tuple[list[str], bool] | None:
    """`called_with` of a method (not `__init__`, which AReaL never calls with its own arguments); None for
    anything else."""
    owner_name, name = dotted.rsplit(".", 1)
    owner = resolve(owner_name)
    value = inspect.getattr_static(owner, name, None) if inspect.isclass(owner) else None
    if name == "__init__" or not callable(getattr(value, "fget", value)) \
            and not isinstance(value, (staticmethod, classmethod)):
        return None
    return called_with(value)


# ---------------------------------------------------------------------------------------------
# The checker


@dataclass(frozen=True)
class Finding:
    kind: str
    """`override` (a method over an upstream one), `store` (an upstream attribute assigned) or `private`
    (an upstream private name read)."""
    upstream: str
    """The upstream name; `?.<attribute>` when the checker cannot tell whose object it is."""
    where: str
    """The project's method (`override`) or the module (the others)."""
    line: int


def is_upstream(dotted: str | None) -> bool:
    return bool(dotted) and dotted.split(".")[0] in UPSTREAM


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    """The dotted name an expression stands for, through the module's imports and aliases (`names_of`)."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, names)
        return names.get(ast.unparse(node)) or (base and f"{base}.{node.attr}")
    if isinstance(node, ast.Call) and dotted(node.func, names) == "importlib.import_module" and node.args:
        arg = node.args[0]
        return arg.value if isinstance(arg, ast.Constant) else names.get(f"str:{ast.unparse(arg)}")
    return None


def names_of(tree: ast.Module, module: str, package: bool) -> dict[str, str]:
    """Local name -> dotted name: the module's own names, its imports (anywhere in it), its module-level
    strings (`str:NAME`), aliases of upstream objects (`x = module.Class`, `self.x = module`) and instances
    of the others' classes (`x = aiohttp.web.TCPSite(...)`, not upstream, whatever it holds)."""
    names = {n.name: f"{module}.{n.name}" for n in tree.body if hasattr(n, "name")}
    names |= {f"str:{n.targets[0].id}": n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                      for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = module.split(".")[:len(module.split(".")) - node.level + package] if node.level else []
            base = ".".join([*parts, *filter(None, [node.module])])
            names |= {a.asname or a.name: f"{base}.{a.name}" for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            value = dotted(node.value, names)
            called = isinstance(node.value, ast.Call) and dotted(node.value.func, names)
            if is_upstream(value):
                names[ast.unparse(node.targets[0])] = value
            elif called and not is_upstream(called) and called != "importlib.import_module":
                names[ast.unparse(node.targets[0])] = f"{called}()"
    return names


def defined_in(node: ast.ClassDef, assigned_to_self: bool = True) -> set[str]:
    """What a class body defines (methods, attributes with a value or, `assigned_to_self`, an annotation),
    plus what its methods set on `self`."""
    body = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    body |= {t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
             and (assigned_to_self or n.value is not None)
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    return body if not assigned_to_self else body | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name) and n.value.id == "self"}


def module_source(module: str) -> str:
    """A module's source without importing it: from this venv, or (vLLM's own modules) the vLLM venv's."""
    try:
        return Path(importlib.util.find_spec(module).origin).read_text()
    except ModuleNotFoundError:
        from examples.tau2.cpu.smoke_config import vllm_python

        [site] = Path(vllm_python()).parents[1].glob("lib/python3*/site-packages")
        return site.joinpath(*module.split(".")).with_suffix(".py").read_text()


@functools.cache
def upstream_attributes(cls: str) -> dict[str, str]:
    """Attribute -> the upstream class in `cls`'s MRO that first defines it (`defined_in`). Without the
    library (vLLM outside its venv) the class's own source only."""
    try:
        sources = [(f"{k.__module__}.{k.__qualname__}", textwrap.dedent(inspect.getsource(k)))
                   for k in resolve(cls).__mro__ if is_upstream(k.__module__)]
    except (ImportError, AttributeError):
        sources = [(cls, module_source(cls.rsplit(".", 1)[0]))]
    found: dict[str, str] = {}
    for owner, source in sources:
        node = next(n for n in ast.walk(ast.parse(source))
                    if isinstance(n, ast.ClassDef) and n.name == owner.rsplit(".", 1)[1])
        found |= {name: owner for name in defined_in(node) if name not in found}
    return found


def access(node: ast.AST) -> tuple[ast.expr, str, bool] | None:
    """(object, attribute, assigned?) of `x.a` and of getattr/hasattr/setattr/delattr(x, "a")."""
    if isinstance(node, ast.Attribute):
        return node.value, node.attr, not isinstance(node.ctx, ast.Load)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[0], node.args[1].value, node.func.id in ("setattr", "delattr")
    return None


def check(sources: dict[str, str]) -> set[Finding]:
    """Every override, upstream assignment and upstream private read in `sources` (module -> source)."""
    trees = {module: ast.parse(source) for module, source in sources.items()}
    names = {m: names_of(tree, m, any(k.startswith(m + ".") for k in trees)) for m, tree in trees.items()}
    classes = {f"{m}.{n.name}": n for m, tree in trees.items() for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef)}

    def ancestry(cls: str) -> tuple[list[str], list[str]]:
        """(`cls` and the project classes it derives from, the upstream classes among their bases)."""
        project, upstream = [cls], []
        for base in (dotted(b, names[cls.rsplit(".", 1)[0]]) for b in classes[cls].bases):
            if base in classes:
                project, upstream = project + ancestry(base)[0], upstream + ancestry(base)[1]
            elif is_upstream(base):
                upstream.append(base)
        return project, upstream

    over: dict[str, list[str]] = {cls: [] for cls in classes}  # upstream classes a project class is over
    for cls in classes:
        project, upstream = ancestry(cls)
        for ours in project:  # a mixin is over the upstream classes of the classes it is mixed into
            over[ours] += [u for u in upstream if u not in over[ours]]
    own = {n.name for tree in trees.values() for n in ast.walk(tree)
           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))} | {
        n.id for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.Name)
        and not isinstance(n.ctx, ast.Load)} | {
        n.attr for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.Attribute)
        and not isinstance(n.ctx, ast.Load) and ast.unparse(n.value) == "self"}

    def scopes(node: ast.AST, module: str, cls: str | None = None) -> Iterator[tuple[ast.AST, str | None]]:
        """Every node under `node`, with the project class whose body it is in."""
        for child in ast.iter_child_nodes(node):
            inner = f"{module}.{child.name}" if isinstance(child, ast.ClassDef) else cls
            yield child, inner
            yield from scopes(child, module, inner)

    found = set()
    for module, tree in trees.items():
        for node, cls in scopes(tree, module):
            owners = [upstream_attributes(u) for u in over[cls]] if cls else []
            if isinstance(node, ast.ImportFrom) and not node.level and is_upstream(node.module):
                private = any(map(is_private, node.module.split(".")))  # a private module
                found |= {Finding("private", f"{node.module}.{a.name}", module, node.lineno)
                          for a in node.names if private or is_private(a.name)}
            if isinstance(node, ast.ClassDef):
                found |= {Finding("override", f"{o[name]}.{name}", f"{cls}.{name}", node.lineno)
                          for name in defined_in(node, assigned_to_self=False) for o in owners if name in o}
            if (seen := access(node)) is None or seen[1].startswith("__"):
                continue
            obj, attr, stored = seen
            if not stored and not is_private(attr):
                continue
            kind, base = "store" if stored else "private", dotted(obj, names[module])
            if cls and ast.unparse(obj) in ("self", "cls", "super()"):
                if stored or attr not in defined_in(classes[cls], assigned_to_self=False):  # not its own
                    found |= {Finding(kind, f"{o[attr]}.{attr}", module, node.lineno)
                              for o in owners if attr in o}
            elif base is not None:
                if is_upstream(base):
                    found.add(Finding(kind, f"{base}.{attr}", module, node.lineno))
            elif is_private(attr) and attr not in own:
                found.add(Finding(kind, f"?.{attr}", module, node.lineno))
    return found


def package_sources() -> dict[str, str]:
    """Every module under examples/tau2, by dotted name."""
    return {".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): path.read_text()
            for path in sorted((REPO / "examples" / "tau2").rglob("*.py"))}


@functools.cache
def package_findings() -> frozenset[Finding]:
    return frozenset(check(package_sources()))


def same_name(listed: str, found: str) -> bool:
    return listed == found or found.startswith("?.") and listed.endswith(found[1:])


def inside(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def listed(finding: Finding) -> bool:
    if finding.kind == "override":
        return any((r.upstream, r.by) == (finding.upstream, finding.where) for r in REPLACED)
    rows = ([(r.upstream, r.by) for r in REPLACED] if finding.kind == "store" else
            [(r.name, where) for r in PRIVATE_READS for where in r.where])
    return any(same_name(name, finding.upstream) and inside(ours, finding.where) for name, ours in rows)


def unlisted(findings: set[Finding] | frozenset[Finding]) -> list[str]:
    return sorted(f"{f.where}:{f.line}: {f.kind} {f.upstream}" for f in findings if not listed(f))


# ---------------------------------------------------------------------------------------------
# The tables against the package


def test_every_module_of_the_package_is_walked():
    """Python's own list of the package's modules (the vLLM venv's included), and the example domain in
    docs/ (a user's tau2 domain, imported by its own name), which replaces nothing today."""
    walked = set(package_sources())
    assert {m.name for m in pkgutil.walk_packages(examples.tau2.__path__, "examples.tau2.")} <= walked
    assert "examples.tau2.docs.own_domain.library_desk.tools" in walked


def test_every_override_and_upstream_assignment_in_the_package_is_a_replacement_row():
    found = {f for f in package_findings() if f.kind != "private"}
    assert unlisted(found) == [], "add a row to compat/replaced.py (AREAL, VLLM, SGLANG or TAU2)"


def test_every_upstream_private_name_the_package_reads_is_listed():
    found = {f for f in package_findings() if f.kind == "private"}
    assert unlisted(found) == [], "add a row to compat/replaced.py's PRIVATE_READS"


def test_every_row_is_still_done_by_the_package():
    findings = package_findings()
    replaced = [r for r in REPLACED if r.upstream not in UNSEEN and not any(
        (f.upstream, f.where) == (r.upstream, r.by) if f.kind == "override" else
        f.kind == "store" and same_name(r.upstream, f.upstream) and inside(r.by, f.where) for f in findings)]
    read = [(r.name, where) for r in PRIVATE_READS for where in r.where if not any(
        f.kind == "private" and same_name(r.name, f.upstream) and inside(where, f.where) for f in findings)]
    assert (replaced, read) == ([], []), "listed, but the package no longer does it"


PLANTED = '''
from areal.experimental.openai.proxy import proxy_rollout_server as server
from areal.trainer.rl_trainer import PPOTrainer


class Planted(PPOTrainer):
    def _create_dataloader(self, *args):
        return self._own_helper(args)

    def _own_helper(self, args):
        return self.config._version


def swap(holder):
    server._openai_client = None
    return server._session_cache, holder._unheard_of
'''


def test_the_checker_reports_what_a_module_adds_without_a_row():
    assert unlisted(check({"examples.tau2.planted": PLANTED})) == [
        "examples.tau2.planted.Planted._create_dataloader:6: override "
        "areal.trainer.rl_trainer.PPOTrainer._create_dataloader",
        "examples.tau2.planted:11: private ?._version",  # listed, but for other modules
        "examples.tau2.planted:15: store areal.experimental.openai.proxy.proxy_rollout_server._openai_client",
        "examples.tau2.planted:16: private ?._unheard_of",
        "examples.tau2.planted:16: private "
        "areal.experimental.openai.proxy.proxy_rollout_server._session_cache",
    ]


# ---------------------------------------------------------------------------------------------
# The rows against the installed releases


def upstream_name_exists(dotted: str) -> bool:
    """Whether the name resolves, or is an attribute an upstream class sets on its instances."""
    try:
        resolve(dotted)
        return True
    except AttributeError:
        owner, name = dotted.rsplit(".", 1)
        return inspect.isclass(resolve(owner)) and name in upstream_attributes(owner)


@pytest.mark.parametrize("row", REPLACED, ids=lambda r: r.upstream.removeprefix("areal."))
def test_each_row_names_an_upstream_name_and_its_tests_exist(row):
    assert row.why and row.tests and all((REPO / test).is_file() for test in row.tests), row.tests
    if not row.by.startswith(VLLM_ONLY):
        resolve(row.by)
    if row.upstream.startswith(VLLM_ONLY) or row.by.startswith(VLLM_ONLY):
        pytest.skip("imports vLLM: test_the_names_that_need_vllm_resolve_in_its_venv")
    assert upstream_name_exists(row.upstream), row.upstream
    # An override takes what the caller passes: the same positional parameters, or *args after a prefix.
    upstream, ours = method_parameters(row.upstream), method_parameters(row.by)
    if upstream is not None and ours is not None:
        (upstream_args, _), (our_args, takes_any) = upstream, ours
        assert (upstream_args[:len(our_args)] if takes_any else upstream_args) == our_args, row


@pytest.mark.parametrize("row", PRIVATE_READS, ids=lambda r: r.name.removeprefix("areal."))
def test_each_private_read_names_an_upstream_name(row):
    assert row.why and row.where and all(resolve(where) for where in row.where)
    assert upstream_name_exists(row.name), row.name


def test_the_moved_module_rows_are_the_vllm_launchers_aliases():
    aliased = {r.upstream for r in VLLM if r.by.endswith(".alias_moved_modules")}
    assert aliased == set(MOVED_MODULES)


@pytest.mark.slow
def test_the_names_that_need_vllm_resolve_in_its_venv():
    """The rows `VLLM_ONLY` skips above, in the vLLM venv: names and parameters."""
    from examples.tau2.cpu.smoke_config import vllm_python

    rows = [r for r in REPLACED if (r.upstream.startswith(VLLM_ONLY) or r.by.startswith(VLLM_ONLY))
            and r.upstream not in MOVED_MODULES]
    code = "import importlib, inspect, json, sys\nfrom typing import Any\n" + "".join(
        inspect.getsource(f) for f in (resolve, called_with, method_parameters)) + (
        "names = json.load(sys.stdin)\nfor n in names:\n    resolve(n)\n"
        "print(json.dumps({n: method_parameters(n) for n in names}))")
    names = [name for r in rows for name in (r.upstream, r.by)]
    out = subprocess.run([vllm_python(), "-c", code], input=json.dumps(names), capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    parameters = json.loads(out.stdout.strip().splitlines()[-1])
    for row in rows:
        upstream, ours = parameters[row.upstream], parameters[row.by]
        if upstream is not None and ours is not None:
            assert (upstream[0][:len(ours[0])] if ours[1] else upstream[0]) == ours[0], row

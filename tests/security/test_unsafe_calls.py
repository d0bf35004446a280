"""No code path that turns bytes into code: no pickle, no unsafe torch/yaml/numpy loads, no eval/exec,
no command line handed to a shell, and dynamic imports only where a config names a plugin.

Found with `ast`, so comments, strings and methods that merely share a name (`model.eval()`) do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("kernel", "schemas", "streams", "processors", "rollout", "trainer", "watchers", "infra", "benchmarks")
PICKLERS = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "shelve", "joblib"}
SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}
DYNAMIC_IMPORTS = {"importlib.import_module", "__import__", "importlib.__import__", "runpy.run_path",
                   "runpy.run_module", "importlib.util.spec_from_file_location"}
# The only places that import code by name, each from one config field (see test_plugin_loading.py).
PLUGIN_LOADERS = {
    ("kernel/registry.py", "importlib.import_module"),      # Registry.get: a component's dotted path
    ("processors/prioritize.py", "importlib.import_module"),  # prioritize.formula: a dotted path
}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted origin, from this file's imports (`import torch as t`, `from yaml import load`)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _kwarg(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _problem(call: ast.Call, name: str) -> str | None:
    if name in ("eval", "exec", "builtins.eval", "builtins.exec"):
        return f"{name}() runs text as code"
    if name in ("torch.load", "torch.serialization.load") and not _is_true(_kwarg(call, "weights_only")):
        return f"{name} without weights_only=True unpickles"
    if name in ("numpy.load", "np.load") and _is_true(_kwarg(call, "allow_pickle")):
        return f"{name}(allow_pickle=True) unpickles"
    if name in ("pandas.read_pickle", "yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all"):
        return f"{name} can build arbitrary objects"
    if name in ("yaml.load", "yaml.load_all"):
        loader = _kwarg(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
        if not (isinstance(loader, (ast.Name, ast.Attribute)) and
                (loader.attr if isinstance(loader, ast.Attribute) else loader.id) in SAFE_YAML_LOADERS):
            return f"{name} without a SafeLoader"
    if name in DYNAMIC_IMPORTS:
        return f"{name} imports code by name"
    if name in ("os.system", "os.popen") or (name.startswith("subprocess.") and _is_true(_kwarg(call, "shell"))):
        return f"{name} hands a command line to the shell"
    return None


def findings(source: str, rel: str) -> list[str]:
    """`rel:line: what` for every unsafe import or call in one file's source."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] in PICKLERS]
        elif isinstance(node, ast.ImportFrom):
            bad = [node.module] if node.module and node.module.split(".")[0] in PICKLERS else []
        elif isinstance(node, ast.Call) and (name := _dotted(node.func, aliases)):
            problem = _problem(node, name)
            if problem and (rel, name) not in PLUGIN_LOADERS:
                out.append(f"{rel}:{node.lineno}: {problem}")
            continue
        else:
            continue
        out += [f"{rel}:{node.lineno}: imports {m} (pickle-based)" for m in bad]
    return out


def source_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def test_no_unsafe_deserialization_eval_or_stray_dynamic_import_in_the_source():
    files = source_files()
    assert len(files) > 100 and {p.relative_to(ROOT).parts[0] for p in files} == set(SCANNED)
    problems = [f for p in files for f in findings(p.read_text(), str(p.relative_to(ROOT)))]
    assert not problems, "unsafe code paths:\n" + "\n".join(problems)


def test_the_plugin_loaders_are_still_where_the_allow_list_says():
    """A stale allow-list entry would excuse a future call in that file without anyone noticing."""
    for rel, name in PLUGIN_LOADERS:
        tree = ast.parse((ROOT / rel).read_text())
        aliases = _aliases(tree)
        assert any(isinstance(n, ast.Call) and _dotted(n.func, aliases) == name for n in ast.walk(tree)), (rel, name)


def test_the_scanner_catches_each_pattern():
    bad = """
import pickle
import cloudpickle as cp
from dill import loads
import torch, yaml, numpy as np
from torch import load as tload
import importlib
torch.load(f)
torch.load(f, weights_only=False)
tload(f)
eval("1+1")
exec(code)
yaml.load(text)
yaml.load(text, Loader=yaml.FullLoader)
yaml.unsafe_load(text)
np.load(f, allow_pickle=True)
importlib.import_module(name)
import os, subprocess
os.system(cmd)
subprocess.run(cmd, shell=True)
os.popen(cmd)
"""
    lines = [f.split(":")[1] for f in findings(bad, "x.py")]
    assert lines == [str(n) for n in (2, 3, 4, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 20, 21)]
    good = """
import torch, yaml
torch.load(f, weights_only=True)
yaml.load(text, Loader=yaml.SafeLoader)
yaml.safe_load(text)
subprocess.run(["ls"], shell=False)
model.eval()
ast.literal_eval("1")
"""
    assert findings(good, "y.py") == []

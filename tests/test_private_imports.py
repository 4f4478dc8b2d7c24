"""No module of the package uses another module's private name (issue 42 item 3): a helper that two
modules share is public (no leading underscore) in the module that owns it, so that what a module
may change freely (its ``_names``) is exactly what no other module relies on.

Caught: ``from X import _name`` and ``import X._name`` of a module ``X`` of the package, and
``X._name`` where ``X`` is a name bound to a module of the package (``from . import decoders`` then
``decoders._read``; ``import mimi_extract.audio.decoders as d`` then ``d._read``).  Fine: a module's
own names, dunder names (``__version__``), a private *module* imported from within its package
(``from . import _reaper``: private to the package, not to a module), an alias (``import glob as
_glob``) and private names of other libraries (``codec/internals.py`` lists the transformers
internals it relies on)."""

from __future__ import annotations

import ast
from pathlib import Path

import mimi_extract


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Package:
    """The modules under one package folder, by dotted name (``pkg.sub.mod``; a package by its
    folder's name, its ``__init__.py``)."""

    def __init__(self, root: Path):
        self.root = root
        self.files = {self.module_of(path): path for path in sorted(root.rglob("*.py"))}

    def module_of(self, path: Path) -> str:
        parts = list(path.relative_to(self.root.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def is_package(self, module: str) -> bool:
        return self.files.get(module, Path()).name == "__init__.py"

    def resolve(self, module: str, node: ast.ImportFrom) -> str | None:
        """The dotted name an ``ImportFrom`` in ``module`` imports from (its relative dots resolved)."""
        if not node.level:
            return node.module
        base = module.split(".")
        base = base if self.is_package(module) else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))


def _outside(module: str, target: str) -> bool:
    """Whether ``module`` is outside the package that a private module in ``target``'s dotted name
    (``pkg.engines._reaper``) is private to (``pkg.engines``)."""
    parts = target.split(".")
    for n, part in enumerate(parts[1:], 1):
        owner = ".".join(parts[:n])
        if _private(part) and module != owner and not module.startswith(owner + "."):
            return True
    return False


def _uses(package: _Package, module: str, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each use in ``tree`` (module ``module``) of another module's private name."""
    found = []
    bound: dict[str, str] = {}  # local name -> the package module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in package.files:
                    continue
                if _outside(module, alias.name):
                    found.append((node.lineno, f"import {alias.name}"))
                top = alias.name.partition(".")[0]
                bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            source = package.resolve(module, node)
            if source not in package.files:
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in package.files:  # a module (a private one is its package's own)
                    bound[alias.asname or alias.name] = target
                    bad = _outside(module, target)
                else:  # a name of ``source``
                    bad = (_private(alias.name) and source != module) or _outside(module, source)
                if bad:
                    found.append((node.lineno, f"from {source} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _dotted(node.value, bound)
            if owner in package.files and owner != module:
                found.append((node.lineno, f"{ast.unparse(node)} (a private name of {owner})"))
    return found


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The package module an expression names (``decoders``, ``mimi_extract.audio.decoders``), if any."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value, bound)
        return f"{owner}.{node.attr}" if owner else None
    return None


def private_uses(root: Path) -> list[str]:
    """``path:line what`` of every use, in the package at ``root``, of a private name of another of
    its modules."""
    package = _Package(root)
    out = []
    for module, path in package.files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, what in sorted(set(_uses(package, module, tree))):
            out.append(f"{path.relative_to(root.parent)}:{line} {what}")
    return out


def test_no_module_of_the_package_uses_another_modules_private_name():
    found = private_uses(Path(mimi_extract.__file__).parent)
    assert not found, (f"{len(found)} uses of another module's private name (make it public in the module that "
                       "owns it):\n" + "\n".join(found))


def test_each_way_of_reaching_a_private_name_is_caught(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from ._version import __version__\n",
        "_version.py": "__version__ = '1'\n",
        "outer.py": "from .sub import _helper\nimport pkg.sub._helper\nfrom .sub._helper import x\n",
        "sub/__init__.py": "",
        "sub/_helper.py": "x = 1\n",
        "sub/owner.py": "def _hidden(): ...\ndef shown(): ...\n_seen = _hidden()\nfrom .owner import _seen as again\n",
        "sub/user.py": (
            "import glob as _glob\n"
            "import pkg.sub.owner\n"
            "import pkg.sub.owner as o\n"
            "from . import owner, _helper\n"
            "from .owner import shown, _hidden\n"
            "from .owner import shown as _alias\n"
            "from ..sub.owner import _seen\n"
            "from .._version import __version__\n"
            "def f():\n"
            "    from pkg.sub import owner as lazy\n"
            "    return lazy._hidden, owner._seen, o._hidden, pkg.sub.owner._hidden, _helper.x, owner.shown, _glob._x\n"),
    }
    for name, text in files.items():
        (package / name).write_text(text, encoding="utf-8")
    assert private_uses(package) == [
        "pkg/outer.py:1 from pkg.sub import _helper",
        "pkg/outer.py:2 import pkg.sub._helper",
        "pkg/outer.py:3 from pkg.sub._helper import x",
        "pkg/sub/user.py:5 from pkg.sub.owner import _hidden",
        "pkg/sub/user.py:7 from pkg.sub.owner import _seen",
        "pkg/sub/user.py:11 lazy._hidden (a private name of pkg.sub.owner)",
        "pkg/sub/user.py:11 o._hidden (a private name of pkg.sub.owner)",
        "pkg/sub/user.py:11 owner._seen (a private name of pkg.sub.owner)",
        "pkg/sub/user.py:11 pkg.sub.owner._hidden (a private name of pkg.sub.owner)",
    ]

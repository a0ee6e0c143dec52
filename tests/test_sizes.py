"""Sizes a reader can hold (issue 31, deliver 6): no module of ``scrapy_polite/`` over 500 lines, no class over 350,
no function (or method) over 60, measured with :mod:`ast` from the first decorator to the last line.

:data:`ALLOWED` lists what is over a limit, each with its size: empty since the pacer stopped being a facade (it
had 16 units when this test came in, pacer.py the last). The list can only shrink: a unit that grows past its
listed size fails; one back under its limit, renamed or gone fails too, until its entry is removed.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "scrapy_polite"

#: The most lines of a module, a class, a function.
LIMITS = {"module": 500, "class": 350, "function": 60}

#: Over a limit today, by unit (``path`` under scrapy_polite/, ``path::Class.method``): its size in lines now.
ALLOWED: dict[str, int] = {}


def over_limits(source: str, module: str) -> dict[str, tuple[str, int]]:
    """The units of one module's ``source`` over their limit: ``{unit: (kind, lines)}``, the module named
    ``module``, a class or function ``module::Qualified.name`` (nested ones included)."""
    found: dict[str, tuple[str, int]] = {}
    lines = len(source.splitlines())
    if lines > LIMITS["module"]:
        found[module] = ("module", lines)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                size = (child.end_lineno or child.lineno) - first + 1
                name = f"{prefix}{child.name}"
                if size > LIMITS[kind]:
                    found[f"{module}::{name}"] = (kind, size)
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def package_over_limits() -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found.update(over_limits(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE).as_posix()))
    return found


def test_no_module_class_or_function_is_over_its_limit_beyond_the_allow_list():
    found = package_over_limits()
    new = {unit: size for unit, (kind, size) in found.items() if unit not in ALLOWED}
    grown = {unit: (ALLOWED[unit], size) for unit, (kind, size) in found.items()
             if unit in ALLOWED and size > ALLOWED[unit]}
    assert not new, (f"over the limits {LIMITS} (lines): {new}. Split them by job (docs/design/development.md, "
                     "\"The code\")")
    assert not grown, f"allowed once, but grown (unit: (allowed, now)): {grown}. The allow-list only shrinks"


def test_the_allow_list_only_shrinks():
    """Every entry is still over its limit: one split (or renamed, or gone) leaves the list, and one that shrank
    has its size lowered (a later growth back is then caught)."""
    found = package_over_limits()
    stale = sorted(unit for unit in ALLOWED if unit not in found)
    assert not stale, f"no longer over its limit (or gone): remove from ALLOWED: {stale}"
    shrunk = {unit: (ALLOWED[unit], found[unit][1]) for unit in ALLOWED if found[unit][1] < ALLOWED[unit]}
    assert not shrunk, f"smaller now (unit: (listed, now)): lower ALLOWED to the size now: {shrunk}"


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return None\n"


def test_the_measure_reports_what_is_over_a_limit():
    """The negative control: a synthetic module over each limit is reported, unit by unit, with its size; one at
    each limit exactly is not."""
    at_the_limit = _function("fits", 60)
    assert over_limits(at_the_limit, "fits.py") == {}
    big_method = "class Big:\n" + _function("method", 61, indent="    ") + "".join(
        _function(f"m{i}", 50, indent="    ") for i in range(6))
    nested = "@staticmethod\n" + _function("outer", 70).replace("    return None\n", _function("inner", 62, "    "))
    source = big_method + nested + "".join(f"# {i}\n" for i in range(200))
    found = over_limits(source, "synthetic.py")
    assert found == {
        "synthetic.py": ("module", len(source.splitlines())),
        "synthetic.py::Big": ("class", 1 + 61 + 6 * 50),
        "synthetic.py::Big.method": ("function", 61),
        "synthetic.py::outer": ("function", 1 + 70 - 1 + 62),
        "synthetic.py::outer.inner": ("function", 62),
    }
    assert len(source.splitlines()) > 500 and found["synthetic.py::Big"][1] > 350

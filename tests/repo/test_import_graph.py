"""The import graph of jaxcnn/, read from the source (nothing is imported): no module-level
import cycle, and few imports inside functions.

An edge A -> B is a module-level `import` / `from ... import` in A that loads module B, plus
every package __init__ on B's path that A is not inside (loading jaxcnn.ops.fire runs
jaxcnn/ops/__init__.py first, so a cycle through a package's re-exports is a cycle too).
Imports under `if TYPE_CHECKING:` are not edges. Imports inside a function break no cycle
the reader can see, so each must say why it is there; their number may only go down.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jaxcnn"
# Imports inside functions in jaxcnn/: the CLI's per-command imports of the modules that load
# jax (the dashboard command stays jax-free), conv2d's decision owner, and the optional or slow
# ones (jax off the dashboard path, scipy.optimize, pandas in the store reader). Lower it as
# they go.
MAX_FUNCTION_LEVEL_IMPORTS = 19
# The imports inside functions that close a cycle on purpose, as (importer, imported module
# prefix): conv2d asks the decision owner, which sits above the ops package. Any other cycle,
# hidden in a function or not, fails.
DELIBERATE_CYCLE_IMPORTS = (("jaxcnn.ops.conv2d.api", "jaxcnn.tuning.conv_choice"),)


def module_names() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (path, is a package __init__) for every .py file under jaxcnn/."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imported(node: ast.Import | ast.ImportFrom, package: str, modules) -> list[str]:
    """The modules of jaxcnn an import statement loads: `from X import y` loads the module X.y
    if there is one (X itself may still be loading: its __init__ is not needed), else X."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                 for alias in node.names]
    loaded = []
    for name in names:  # a name outside jaxcnn resolves to nothing; jaxcnn.x.attr to jaxcnn.x
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            loaded.append(name)
    return loaded


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]], list[tuple[str, int, str]]]:
    """(module-level edges, edges of the imports inside functions, [(module, line, statement)]
    of those imports, jaxcnn's or not)."""
    modules = module_names()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    function_edges: dict[str, set[str]] = {name: set() for name in modules}
    in_functions: list[tuple[str, int, str]] = []
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        if is_package:
            own_packages.add(name)

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if _is_type_checking(child):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if in_function:
                        in_functions.append((name, child.lineno, ast.unparse(child)))
                    for target in _imported(child, package, modules):
                        parts = target.split(".")
                        ancestors = {".".join(parts[:i]) for i in range(1, len(parts))}
                        (function_edges if in_function else edges)[name].update({target} | (ancestors - own_packages))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(ast.parse(path.read_text(), str(path)), False)
        edges[name].discard(name)
        function_edges[name].discard(name)
    return edges, function_edges, in_functions


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_sees_cycles_through_package_inits():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    edges, _, _ = import_graph()
    # jaxcnn.optimize.api imports jaxcnn.optimize.rewrite, and with it jaxcnn.optimize's
    # __init__ only when it is not inside that package (it is).
    assert "jaxcnn.optimize.rewrite" in edges["jaxcnn.optimize.api"]
    assert "jaxcnn.optimize" not in edges["jaxcnn.optimize.api"]
    assert "jaxcnn.ops" in edges["jaxcnn.tuning.fusion_plan"]  # it imports jaxcnn.ops.fire


def test_no_module_level_import_cycle():
    edges, _, _ = import_graph()
    found = cycles(edges)
    assert not found, "module-level import cycles in jaxcnn/ (move the shared piece to its own module):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_function_level_imports_stay_few(capsys):
    _, _, in_functions = import_graph()
    listing = "\n".join(f"  {module}:{line}: {statement}" for module, line, statement in in_functions)
    with capsys.disabled():
        print(f"\n{len(in_functions)} imports inside functions in jaxcnn/ (at most {MAX_FUNCTION_LEVEL_IMPORTS})")
    assert len(in_functions) <= MAX_FUNCTION_LEVEL_IMPORTS, (
        f"{len(in_functions)} imports inside functions, more than {MAX_FUNCTION_LEVEL_IMPORTS}: import at module "
        f"level unless a cycle or an optional dependency forbids it (then say why in a comment):\n{listing}")


def test_imports_inside_functions_close_no_other_cycle():
    edges, function_edges, _ = import_graph()
    combined = {}
    for name in edges:
        deliberate = [prefix for importer, prefix in DELIBERATE_CYCLE_IMPORTS if importer == name]
        combined[name] = edges[name] | {t for t in function_edges[name]
                                        if not any(t == p or t.startswith(p + ".") for p in deliberate)}
    found = cycles(combined)
    assert not found, "import cycles closed inside functions in jaxcnn/:\n" + "\n".join(" <-> ".join(c) for c in found)

"""The engine's per-token functions compile once each (tern.kernels.cache_guard): numba
compiles a callee again for every literal argument, omitted default, literal-initialised
variable or raw ``prange`` index it is called with, and the per-token functions link the whole
engine below them, so each such call site cost a full extra compile of its subtree (a cold
compile of the 28M peer's engine: 173 s with them, 126 s without; the region step 80-83 -> 52-54 s,
benchmarks/compile_time.py).

The rule itself is checked on numba (so a numba that stops specialising shows up here), and the
engine's call sites are checked on their source (fast: no compile)."""

import ast
from pathlib import Path

import numba
import pytest

from tern.kernels.cache_guard import NO, NO_ADDR, ONE, YES, ZERO

ROOT = Path(__file__).resolve().parents[2]
# the per-token modules: every call between their njit functions
ENGINE_MODULES = ("tern/kernels/ops.py", "tern/kernels/ops_region.py", "tern/kernels/region_items.py",
                  "tern/kernels/region.py", "tern/kernels/attention.py")


def test_numba_specialises_on_literals_but_not_on_the_numpy_constants():
    @numba.njit
    def callee(a, b, flag):
        return a + b if flag else a - b

    @numba.njit
    def with_literals(x):
        return callee(x, -1, True) + callee(x, 0, False)

    @numba.njit
    def with_constants(x):
        return callee(x, NO_ADDR, YES) + callee(x, ZERO, NO) + callee(x, ONE, x > 0)

    with_constants(3)
    assert len(callee.signatures) == 1, callee.signatures
    with_literals(3)
    assert len(callee.signatures) == 3, callee.signatures  # one more per literal combination


def _njit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)
            and any("njit" in ast.unparse(d) for d in n.decorator_list)}


def _inlined(fn: ast.FunctionDef) -> bool:  # numba inlines it at the IR level: no compile of its own
    return any("inline" in ast.unparse(d) and "always" in ast.unparse(d) for d in fn.decorator_list)


def _literal(a: ast.AST) -> bool:
    if isinstance(a, ast.Constant) and isinstance(a.value, (int, bool)):
        return True
    if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.USub):
        return _literal(a.operand)
    if isinstance(a, ast.IfExp):
        return _literal(a.body) or _literal(a.orelse)
    return False


def specialising_calls(sources: dict[str, str]) -> list[tuple[str, int, str, str]]:
    """(module, line, callee, why) of each call from an njit function to a compiled (not
    always-inlined) njit function of ``sources`` that would compile a second specialisation."""
    trees = {m: ast.parse(s) for m, s in sources.items()}
    callees = {name: fn for t in trees.values() for name, fn in _njit_functions(t).items() if not _inlined(fn)}
    found = []
    for mod, tree in trees.items():
        for fn in _njit_functions(tree).values():
            pranged, literal_vars = set(), set()
            for node in ast.walk(fn):
                if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) \
                        and "prange" in ast.unparse(node.iter.func) and isinstance(node.target, ast.Name):
                    pranged.add(node.target.id)
                if isinstance(node, ast.Assign):
                    for tg in node.targets:
                        pairs = zip(tg.elts, node.value.elts, strict=False) if isinstance(tg, ast.Tuple) and isinstance(
                            node.value, ast.Tuple) else [(tg, node.value)]
                        literal_vars |= {a.id for a, b in pairs if isinstance(a, ast.Name) and _literal(b)}
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else None)
                if name not in callees:
                    continue
                args = [*node.args, *(k.value for k in node.keywords)]
                if len(args) < len(callees[name].args.args):
                    found.append((mod, node.lineno, name, "omitted default"))
                for a in args:
                    if _literal(a):
                        found.append((mod, node.lineno, name, f"literal {ast.unparse(a)}"))
                    elif isinstance(a, ast.Name) and a.id in literal_vars:
                        found.append((mod, node.lineno, name, f"{a.id} is first assigned a literal"))
                    elif isinstance(a, ast.Name) and a.id in pranged:
                        found.append((mod, node.lineno, name, f"prange index {a.id}"))
    return found


def test_the_engines_calls_compile_each_callee_once():
    sources = {m: (ROOT / m).read_text() for m in ENGINE_MODULES}
    assert specialising_calls(sources) == []


@pytest.mark.parametrize("call, why", [
    ("g(x, -1)", "literal -1"), ("g(x, True)", "literal True"), ("g(x, 1 if x else 2)", "literal 1 if x else 2"),
    ("g(x)", "omitted default"), ("g(x, n)", "n is first assigned a literal"), ("g(x, t)", "prange index t"),
])
def test_the_check_finds_each_kind_of_specialising_call(call, why):
    src = ("import numba\n\n@numba.njit\ndef g(x, y=0):\n    return x\n\n"
           "@numba.njit(parallel=True)\ndef f(x):\n    n = 0\n    n = x\n"
           f"    for t in numba.prange(2):\n        {call}\n")
    assert [w for *_, w in specialising_calls({"m.py": src})] == [why]
    fixed = src.replace(call, "g(x, np.int64(t))")
    assert specialising_calls({"m.py": fixed}) == []

"""The seam, enforced: the scheduling core and the simulator's side load no torch, and imports point
one way: engine.core <- traces, engine <- sim <- analysis <- cli.

Imports are read from the source (every ``import``, function-local ones included, since those hide
cycles); only a ``python -m`` shim's ``if __name__ == "__main__":`` block may reach the cli layer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package (as a dotted prefix) -> prefixes it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "engine.core": ("engine.gpu", "engine.llm", "engine.options", "sim", "traces", "analysis", "cli", "torch",
                    "triton"),
    "traces": ("engine.gpu", "engine.llm", "sim", "analysis", "cli", "torch", "triton"),
    "engine": ("sim", "traces", "analysis", "cli"),
    "sim": ("analysis", "cli", "engine.gpu"),
    "analysis": ("cli", "engine.gpu", "engine.llm", "torch", "triton"),
}
# Imported together in a fresh interpreter, these must leave torch and triton unloaded.
TORCH_FREE_PACKAGES = ("engine.core", "sim", "traces", "analysis", "cli.sim_replay")


def _modules(prefix: str) -> list[Path]:
    path = ROOT / prefix.replace(".", "/")
    if path.with_suffix(".py").is_file():
        return [path.with_suffix(".py")]
    return sorted(p for p in path.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_main_guard(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import outside a ``__main__`` guard."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if _is_main_guard(node):
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _owner(module: str) -> str:
    """The most specific package of FORBIDDEN that ``module`` belongs to."""
    return max((p for p in FORBIDDEN if module == p or module.startswith(p + ".")), key=len)


def _reaches(imported: str, prefix: str) -> bool:
    return imported == prefix or imported.startswith(prefix + ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    violations = []
    for path in _modules(package):
        module = _module_name(path)
        if _owner(module) != package:
            continue  # checked under its more specific package (engine.core within engine)
        for line, imported in _imports(path):
            if imported.startswith(module + "."):
                continue
            for forbidden in FORBIDDEN[package]:
                # engine's own subpackages may import the core; engine.options is part of engine
                if _reaches(imported, forbidden) and not (package == "engine" and _reaches(module, forbidden)):
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not violations, "\n".join(violations)


def test_the_rule_catches_a_violation(tmp_path) -> None:
    """The checker is not vacuous: a core module importing the simulator is flagged."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from sim.simulator import simulate\n")
    assert [m for _, m in _imports(bad)] == ["sim.simulator.simulate"]
    assert any(_reaches("sim.simulator.simulate", f) for f in FORBIDDEN["engine.core"])


def test_torch_free_side_never_loads_torch() -> None:
    modules = [_module_name(p) for pkg in TORCH_FREE_PACKAGES for p in _modules(pkg)]
    modules += ["engine", "engine.options", "engine.llm", "engine.replay", "sim.replay"]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in ('torch', 'triton') if m in sys.modules)\n"
        "assert not loaded, f'loaded {loaded}'\n"
        "print(len(" + repr(modules) + "))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 40  # the walk found the packages' modules


def test_gpu_side_commands_need_no_plotly() -> None:
    """The GPU image has no plotly: engine.replay --no-report, engine.serve and traces.bench must load and
    summarise without it (plotly is imported only where a report is drawn)."""
    code = (
        "import sys\n"
        "sys.modules['plotly'] = None\n"  # any import of plotly now fails
        "import cli.engine_replay, cli.engine_serve, cli.traces_bench, analysis.runs\n"
        "from analysis.report.summary_table import format_summary_table\n"
        "print(format_summary_table({'num_requests': 1, 'num_finished': 1}).splitlines()[0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_run_without_plotly_is_written_without_its_report(tmp_path) -> None:
    """A run recorded on a host without plotly (the GPU image) keeps its data: write_summary notes the missing
    report on one line instead of failing after the replay has finished."""
    code = (
        "import sys\n"
        "sys.modules['plotly'] = None\n"
        "from pathlib import Path\n"
        "import analysis.runs as runs\n"
        "runs.summarize = lambda *args, **kwargs: {'num_requests': 1}\n"  # the report's import is under test
        f"out = Path({str(tmp_path)!r})\n"
        "runs.write_summary(out, None, None, {}, report_title='t')\n"
        "print(sorted(p.name for p in out.iterdir()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "no report.html" in proc.stderr and "plotly is not installed" in proc.stderr, proc.stderr
    assert str(tmp_path) not in proc.stderr  # the folder written is a staging one, renamed afterwards: not named
    assert proc.stdout.strip() == "['summary.json']"

"""The layering docs/architecture.md describes, checked on the source itself."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent.parent / "gpucluster"
SIZE_LIMIT_LINES = 350


def _unit(module: Path) -> str:
    """The package a module belongs to (doctor, launch...) or its own name at the top."""
    parts = module.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def _imports(module: Path) -> set[str]:
    """gpucluster units a module imports, lazily inside functions too."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module == "gpucluster":
            names = [f"gpucluster.{a.name}" for a in node.names]  # from gpucluster import x
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "gpucluster" and len(parts) > 1:
                found.add(parts[1])
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in PACKAGE.rglob("*.py"):
        unit = _unit(module)
        graph.setdefault(unit, set()).update(_imports(module) - {unit})
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    stack = [(start, [start])]
    seen = set()
    while stack:
        unit, path = stack.pop()
        for after in graph.get(unit, set()):
            if after == start:
                return [*path, start]
            if after not in seen:
                seen.add(after)
                stack.append((after, [*path, after]))
    return None


def test_no_import_cycle_between_packages() -> None:
    graph = import_graph()
    cycles = [c for unit in graph if (c := _cycle_through(graph, unit))]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_only_the_cli_imports_the_cli() -> None:
    graph = import_graph()
    users = [u for u, imported in graph.items() if "cli" in imported]
    assert sorted(set(users) - {"cli", "__main__"}) == []


def test_core_never_asks_whether_a_host_is_a_sandbox_node() -> None:
    core = [m for m in PACKAGE.rglob("*.py") if _unit(m) not in ("sandbox", "cli")]
    leaks = [str(m.relative_to(PACKAGE)) for m in core if '"sandbox"' in m.read_text()]
    assert leaks == []



def test_modules_stay_small_or_say_why() -> None:
    big = []
    for module in PACKAGE.rglob("*.py"):
        text = module.read_text()
        if text.count("\n") > SIZE_LIMIT_LINES and "Longer than" not in text[:1200]:
            big.append(f"{module.relative_to(PACKAGE)} ({text.count(chr(10))} lines)")
    assert big == [], "split these, or say at the top why they are long (Longer than ...)"


def test_the_docs_name_every_check_and_count_none() -> None:
    """Counts in prose go stale (README said 33 while a page said 32): the registry is the
    one count, and docs/doctor.md describes every check in it."""
    import re

    from gpucluster.doctor import checks  # noqa: F401 - fills REGISTRY
    from gpucluster.doctor.model import REGISTRY

    root = PACKAGE.parent
    described = set(re.findall(r"\*\*([a-z0-9-]+)\*\*", (root / "docs/doctor.md").read_text()))
    assert set(REGISTRY) - described == set()
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        assert not re.search(r"\b\d+ (doctor )?checks\b", page.read_text()), page


def test_every_test_docs_reliability_names_exists() -> None:
    import re

    root = PACKAGE.parent
    page = (root / "docs/reliability.md").read_text()
    sources = "\n".join(p.read_text() for p in (root / "tests").rglob("test_*.py"))
    named = set(re.findall(r"::(test_\w+)", page)) | set(re.findall(r"`(test_\w+)`", page))
    missing = [name for name in sorted(named) if f"def {name}(" not in sources]
    assert named and missing == []
    for path in re.findall(r"`(tests/[\w/]+\.py)", page):
        assert (root / path).is_file(), path


def test_the_cli_starts_without_what_only_its_commands_use() -> None:
    """Every command's module is imported to build the CLI (`--help`, each shell
    completion, every command's start), so what a command alone uses is imported in its
    body: the SSH stack (paramiko: 0.1-0.2 s), templates, Slurm, the samplers..."""
    import subprocess
    import sys

    code = ("import sys, gpucluster.cli.main\n"
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                text=True, check=True).stdout.split())
    assert "gpucluster.cli.launch_cmd" in loaded  # the test looks at the right thing
    heavy = ("paramiko", "jinja2", "gpucluster.remote.session", "gpucluster.launch.control",
             "gpucluster.slurm", "gpucluster.observe", "gpucluster.provision",
             "gpucluster.bundle", "gpucluster.doctor.runner")
    assert not [name for name in heavy if name in loaded]

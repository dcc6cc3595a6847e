"""The layering rules, read from the source: who may import what (local imports included)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.snippets import run_snippet

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("gateway", "routing", "cache_index", "vllm_api", "simulator", "telemetry")
PURE = ("routing", "cache_index", "vllm_api")
# Packages that talk to the network, other processes or an event loop; the pure packages are
# synchronous computations over data handed to them, so none of these belongs there.
IO_MODULES = (
    "aiohttp", "httpx", "requests", "urllib3", "urllib.request", "http", "uvicorn", "starlette",
    "httptools", "uvloop", "websockets", "grpc", "grpc_health", "grpc_reflection", "zmq",
    "socket", "socketserver", "ssl", "selectors", "asyncio", "anyio", "trio", "subprocess",
    "multiprocessing", "signal", "redis", "pynvml", "prometheus_client", "opentelemetry",
)  # fmt: skip
TELEMETRY_SDKS = ("prometheus_client", "opentelemetry")


def module_name(path: Path, root: Path) -> str:
    """The dotted module a source file defines (a package's __init__ is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in a file: top-level, function-local, relative."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            # `from pkg import name` may load the submodule pkg.name.
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and _is_dynamic_import(node.func)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _within(module: str, roots: Iterable[str]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def sources(root: Path, packages: Iterable[str]) -> Iterator[Path]:
    for package in packages:
        yield from sorted((root / package).rglob("*.py"))


def violations(root: Path) -> list[str]:
    """Every import that breaks a layering rule, as `file:line: rule: module`."""
    found: list[str] = []
    for path in sources(root, (*PRODUCT, "benchmarks")):
        owner = path.relative_to(root).parts[0]
        where = path.relative_to(root).as_posix()
        for line, module in imports_of(path, root):
            rules = []
            if owner in PURE:
                if _within(module, IO_MODULES):
                    rules.append("a pure package imports an I/O package")
                if _within(module, ("gateway", "simulator", "benchmarks", "telemetry")):
                    rules.append("a pure package imports gateway/simulator/benchmarks/telemetry")
            if owner in PRODUCT and _within(module, ("benchmarks",)):
                rules.append("the product imports benchmarks")
            if (
                owner == "simulator"
                and _within(module, (*PRODUCT, "benchmarks"))
                and not _within(module, ("simulator", "vllm_api", "cache_index"))
            ):
                rules.append("the simulator imports more of the product than vllm_api, cache_index")
            if owner != "telemetry" and _within(module, TELEMETRY_SDKS):
                rules.append("only telemetry/ imports the metrics and tracing SDKs")
            found += [f"{where}:{line}: {rule}: {module}" for rule in rules]
    return sorted(set(found))


def test_every_layering_rule_holds() -> None:
    assert violations(ROOT) == []


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_checker_finds_local_relative_and_dynamic_imports(tmp_path: Path) -> None:
    for package in (*PRODUCT, "benchmarks"):
        _write(tmp_path, f"{package}/__init__.py", "")
    _write(tmp_path, "routing/plugins/__init__.py", "")
    _write(tmp_path, "routing/plugins/bad.py", "def f():\n    import asyncio\n")
    _write(tmp_path, "cache_index/bad.py", "import gateway.proxy\nfrom telemetry import x\n")
    _write(tmp_path, "vllm_api/bad.py", "import importlib\nimportlib.import_module('zmq')\n")
    _write(tmp_path, "gateway/bad.py", "def f():\n    from benchmarks.routing_bench import x\n")
    _write(tmp_path, "simulator/bad.py", "from routing.router import Router\nimport cache_index\n")
    _write(tmp_path, "benchmarks/bad.py", "import prometheus_client\n")
    _write(tmp_path, "telemetry/fine.py", "import prometheus_client\nimport opentelemetry.trace\n")
    assert violations(tmp_path) == [
        "benchmarks/bad.py:1: only telemetry/ imports the metrics and tracing SDKs: "
        "prometheus_client",
        "cache_index/bad.py:1: a pure package imports gateway/simulator/benchmarks/telemetry: "
        "gateway.proxy",
        "cache_index/bad.py:2: a pure package imports gateway/simulator/benchmarks/telemetry: "
        "telemetry",
        "cache_index/bad.py:2: a pure package imports gateway/simulator/benchmarks/telemetry: "
        "telemetry.x",
        "gateway/bad.py:2: the product imports benchmarks: benchmarks.routing_bench",
        "gateway/bad.py:2: the product imports benchmarks: benchmarks.routing_bench.x",
        "routing/plugins/bad.py:2: a pure package imports an I/O package: asyncio",
        "simulator/bad.py:1: the simulator imports more of the product than vllm_api, "
        "cache_index: routing.router",
        "simulator/bad.py:1: the simulator imports more of the product than vllm_api, "
        "cache_index: routing.router.Router",
        "vllm_api/bad.py:2: a pure package imports an I/O package: zmq",
    ]


def test_relative_imports_resolve_against_the_importing_package(tmp_path: Path) -> None:
    _write(tmp_path, "routing/plugins/__init__.py", "from . import rel\n")
    _write(tmp_path, "routing/plugins/rel.py", "from ..router import Router\nfrom .x import y\n")
    assert {m for _, m in imports_of(tmp_path / "routing/plugins/__init__.py", tmp_path)} == {
        "routing.plugins",
        "routing.plugins.rel",
    }
    assert {m for _, m in imports_of(tmp_path / "routing/plugins/rel.py", tmp_path)} == {
        "routing.router",
        "routing.router.Router",
        "routing.plugins.x",
        "routing.plugins.x.y",
    }


def _static_closure(start: Iterable[str]) -> set[str]:
    """Product and benchmark modules reachable from `start` through any import statement."""
    files = {module_name(p, ROOT): p for p in sources(ROOT, (*PRODUCT, "benchmarks"))}
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        todo += [m for _, m in imports_of(files[name], ROOT)]
        # Importing a.b.c runs a/__init__ and a/b/__init__ first.
        todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
    return seen


def test_serving_reaches_no_simulator_or_benchmark_module_statically() -> None:
    # Covers imports inside functions that only run once the gateway is up.
    reached = _static_closure(["gateway.process", "gateway.runtime", "gateway.config"])
    assert "gateway.http.app" in reached and "routing.router" in reached
    assert sorted(m for m in reached if _within(m, ("simulator", "benchmarks"))) == []


# Runs a command up to its event loop (asyncio.run is replaced), then lists what got loaded.
_LOADED = """
import asyncio, json, sys

def _no_loop(coro, **kwargs):
    coro.close()

asyncio.run = _no_loop
from gateway.cli import main

rc = main(sys.argv[1:])
import gateway.process, gateway.runtime, gateway.http.app, gateway.grpc.server  # what serve runs
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("simulator", "benchmarks"))
print(json.dumps({"rc": rc, "loaded": loaded}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "-c", str(ROOT / "config.example.toml")],
        ["check-config", str(ROOT / "config.example.toml")],
    ],
    ids=["serve", "check-config"],
)
def test_serve_and_check_config_load_no_simulator_or_benchmarks(argv: list[str]) -> None:
    result, stderr = run_snippet(_LOADED, argv)
    assert result == {"rc": 0, "loaded": []}, stderr

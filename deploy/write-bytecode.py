"""Writes bytecode for what pyflannel loads, by importing it once: every module of the package,
and every module the package imports anywhere, at the top of a module or inside a function
(a store's client is imported only in its mode). Standard library included.

Run by deploy/Dockerfile as the final stage's last step, where nothing else writes bytecode,
so flanneld starts without compiling even on a read-only root filesystem; the image test runs
it with -B -v to check that. A module the package names but the image does not have (an
optional extra, a type-checking-only import) is listed and skipped.
"""

import ast
import importlib
import importlib.util
import pkgutil
import sys

import flannel


def imported_names(module_name: str) -> tuple[set[str], set[str]]:
    """The absolute module names that ``import`` statements anywhere in the module name, and
    the names that may be submodules (``b`` in ``from a import b``)."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return set(), set()
    with open(spec.origin, "rb") as source:
        tree = ast.parse(source.read(), spec.origin)
    modules: set[str] = set()
    maybe: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
            maybe.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules, maybe


def find(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def main() -> int:
    package = [info.name for info in pkgutil.walk_packages(flannel.__path__, "flannel.")]
    for name in package:
        importlib.import_module(name)
    modules: set[str] = set()
    maybe: set[str] = set()
    for name in package:
        found, submodules = imported_names(name)
        modules |= found
        maybe |= submodules
    missing = []
    for name in sorted(modules - set(package)):
        if find(name):
            importlib.import_module(name)
        else:
            missing.append(name)
    for name in sorted(maybe - modules - set(package)):
        if find(name):
            importlib.import_module(name)
    if missing:
        print("not in this image, no bytecode:", " ".join(missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())

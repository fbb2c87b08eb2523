"""Run `kdbench` from another source tree: `python ab_boot.py TREE ARGS...` maps the import names kdbench ->
TREE/suite and kdbench.references -> TREE/references (what pyproject's package-dir does for an install)
before anything imports kdbench, so the installed copy is never loaded. Used by kdbench.ab for the base side.
"""
import importlib.util
import sys
from pathlib import Path


def _package(name: str, folder: Path):
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    return spec, module


def main() -> int:
    tree = Path(sys.argv[1]).resolve()
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    top = _package("kdbench", tree / "suite")
    refs = _package("kdbench.references", tree / "references")
    top[1].references = refs[1]
    refs[0].loader.exec_module(refs[1])
    top[0].loader.exec_module(top[1])
    from kdbench.cli import main as cli_main
    sys.argv = ["kdbench", *sys.argv[2:]]
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())

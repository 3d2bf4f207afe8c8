"""Build step: a wheel carries the kit's shipped folders as package data.

Everything else is declared in pyproject.toml. A wheel (and so an install from an sdist or
a git URL, which pip builds into a wheel) gets copies of the files in SHIPPED under
``tern/_shipped/`` with the checkout's layout (``tern/_shipped/data/corpus/...``), where
``tern.core.paths.shipped_dir`` finds them when tern is not imported from a checkout.
An editable install reads the checkout itself. MANIFEST.in lists the same files for the
sdist (tests/report/test_wheel_install.py builds a wheel from an sdist and checks both).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = (  # globs relative to the checkout: the corpus, tokenizers, gates, notebooks
    "data/README.md",
    "data/corpus/*",
    "data/tokenizers/*.json",
    "gates/*.toml",
    "gates/registry.jsonl",
    "notebooks/[0-9][0-9]_*.ipynb",
)


class BuildPyShipped(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        root = Path(__file__).resolve().parent
        files = sorted({p for pattern in SHIPPED for p in root.glob(pattern) if p.is_file()})
        if not any(p.parts[-2] == "tokenizers" for p in files):
            raise SystemExit(f"setup.py: no shipped data under {root / 'data'}; build from a checkout or sdist")
        for src in files:
            dst = Path(self.build_lib, "tern", "_shipped", src.relative_to(root))
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst))


setup(cmdclass={"build_py": BuildPyShipped})

"""The BPF C sources live at the top of the repository (``bpf/``, one file per probe
family over shared headers); an installed agent reads them as package data,
``otelbpf/bpf/*.c|h`` inside the wheel. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithBpfSources(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib, "otelbpf", "bpf")
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted(Path(__file__).parent.joinpath("bpf").glob("*.[ch]")):
            shutil.copy2(source, target / source.name)


setup(cmdclass={"build_py": BuildWithBpfSources})

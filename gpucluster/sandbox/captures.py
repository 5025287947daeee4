"""Real nvidia-smi captures (one GPU each) shipped with the package, split into sections.

Files are named `<os>-<arch>__<model>__<driver>.txt`; each section starts with a
`# <state> :: <title>` line followed by `# $ nvidia-smi ...`. Source and licence: the
README and LICENSE files beside them.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gpucluster.errors import SandboxError

CAPTURE_DIR = Path(__file__).parent / "captures"
DEFAULT_MODEL = "h100"
_ALIASES = {"h100": "h100-80gb-hbm3"}
_SECTION = re.compile(r"^# (idle|load|capabilities) :: (.+)$")
_UNIT = re.compile(r"\s*\[[^\]]*\]$")


@dataclass(frozen=True)
class Capture:
    """The sections of one capture file, by (state, title prefix)."""

    model: str
    driver: str
    sections: dict[tuple[str, str], str]

    def section(self, state: str, title: str) -> str:
        for (section_state, section_title), body in self.sections.items():
            if section_state == state and section_title.startswith(title):
                return body
        raise SandboxError(f"capture {self.model} has no {state} :: {title} section")

    def query_gpu_fields(self) -> dict[str, str]:
        """Every --query-gpu field of the idle state: name (unit stripped) -> raw value."""
        header, row = _csv_rows(self.section("idle", "query-gpu"))[:2]
        return {_UNIT.sub("", name): value for name, value in zip(header, row, strict=False)}

    def query_gpu_units(self) -> dict[str, str]:
        """Field name -> its header as nvidia-smi prints it (`memory.total [MiB]`)."""
        header = _csv_rows(self.section("idle", "query-gpu"))[0]
        return {_UNIT.sub("", name): name for name in header}


def _csv_rows(body: str) -> list[list[str]]:
    lines = [line for line in body.splitlines() if line.strip()]
    return [[cell.strip() for cell in row] for row in csv.reader(lines, skipinitialspace=True)]


def available_models() -> list[str]:
    """Model slugs users can pick (`h100-80gb-hbm3`, `l40s`...), plus short aliases."""
    slugs = [_slug(p)[0] for p in sorted(CAPTURE_DIR.glob("*__*__*.txt"))]
    return sorted([*slugs, *_ALIASES])


def _slug(path: Path) -> tuple[str, str]:
    _, model, driver = path.stem.split("__")
    return model.removeprefix("nvidia-").removeprefix("geforce-"), driver


@cache
def load(model: str) -> Capture:
    """The capture for a model slug or alias; SandboxError naming the choices if unknown."""
    wanted = _ALIASES.get(model, model)
    for path in sorted(CAPTURE_DIR.glob("*__*__*.txt")):
        slug, driver = _slug(path)
        if slug == wanted:
            return Capture(slug, driver, _split_sections(path.read_text()))
    raise SandboxError(f"no GPU capture for model {model!r}; choose one of: "
                       f"{', '.join(available_models())}")


def _split_sections(text: str) -> dict[tuple[str, str], str]:
    sections: dict[tuple[str, str], str] = {}
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = _SECTION.match(lines[index])
        if match is None:
            index += 1
            continue
        # Header: the title line, an optional `# $ command` line, then a rule of #s.
        index += 1
        while index < len(lines) and lines[index].startswith("#"):
            index += 1
        body: list[str] = []
        while index < len(lines) and not (lines[index].startswith("#####")
                                          and index + 1 < len(lines)
                                          and _SECTION.match(lines[index + 1])):
            body.append(lines[index])
            index += 1
        sections[(match.group(1), match.group(2).strip())] = "\n".join(body).strip("\n") + "\n"
    return sections

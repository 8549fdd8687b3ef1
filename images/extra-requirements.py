"""extra-requirements.py WHEEL EXTRA: print the requirements the wheel's extra EXTRA adds, one a line.

install-venv.sh installs those of the `torch` extra (pyproject.toml) from TORCH_INDEX before the wheel itself, so
that they come from that index alone (the CPU-only wheels' https://download.pytorch.org/whl/cpu): given to pip as an
extra index beside PyPI, either could supply them, whichever has the higher version. They are read from the wheel's
metadata, so the extra's packages and bounds are written once, in pyproject.toml. An extra the wheel does not
declare is an error, in one line.
"""
from __future__ import annotations

import email.parser
import re
import sys
import zipfile

#: A Requires-Dist line's marker that selects one extra, as setuptools writes it: `extra == "torch"`.
EXTRA_MARKER = re.compile(r"""^extra\s*==\s*["']([^"']+)["']$""")


def extra_requirements(wheel: str, extra: str) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise SystemExit(f"{wheel}: no .dist-info/METADATA in the wheel")
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    if extra not in (metadata.get_all("Provides-Extra") or []):
        raise SystemExit(f"{wheel}: the wheel has no extra {extra!r} (it has: {', '.join(metadata.get_all('Provides-Extra') or [])})")
    found = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement, _, marker = line.partition(";")
        match = EXTRA_MARKER.match(marker.strip())
        if match and match[1] == extra:
            found.append(requirement.strip().replace(" ", ""))
    return found


def main(wheel: str, extra: str) -> None:
    print("\n".join(extra_requirements(wheel, extra)))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: extra-requirements.py WHEEL EXTRA")
    main(sys.argv[1], sys.argv[2])

"""The package's ``copyright`` file in DEP-5 form, built from the environment it ships.

The package bundles every Python distribution the two binaries import, so Debian's copyright
file must name each one and its licence. The licence comes from each distribution's own
metadata (``License-Expression``, else its ``License :: `` classifiers, else a one-line
``License`` field), read in the environment being packaged, so the list cannot drift from what
is shipped. A distribution whose metadata names no licence stops the build, naming it.

Run with the packaged environment's interpreter:
``python -m koord.debian.copyright --prefix /opt/koord-runtime``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from importlib.metadata import PackageMetadata
from pathlib import Path, PurePosixPath

FORMAT = "https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
PROJECT = "koord-runtime"
"""The distribution whose stanza is ``Files: *``: everything not named by another stanza is its."""

CLASSIFIER = "License :: "
# Classifiers whose licence has one SPDX identifier; others are kept as the classifier says.
SPDX = {
    "Apache Software License": "Apache-2.0",
    "MIT License": "MIT",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "Python Software Foundation License": "PSF-2.0",
}
MAX_LICENSE_FIELD = 80
"""A longer ``License`` field, or one of several lines, is the licence's text, not its name."""


class LicenceMissing(ValueError):
    """A distribution's metadata names no licence; says which distribution."""


@dataclass(frozen=True)
class Bundled:
    """One distribution in the packaged environment, as its copyright stanza needs it."""

    name: str
    version: str
    licence: str
    holders: str
    paths: tuple[str, ...]
    licence_files: tuple[str, ...]


def licence_of(name: str, meta: PackageMetadata) -> str:
    """The licence ``meta`` names, on one line; LicenceMissing naming ``name`` when none."""
    expression = _one_line(_field(meta, "License-Expression"))
    if expression:
        return expression
    classified = []
    for classifier in meta.get_all("Classifier") or []:
        if classifier.startswith(CLASSIFIER) and classifier.count("::") >= 2:
            last = classifier.rsplit("::", 1)[1].strip()
            if last and last not in classified and SPDX.get(last, last) not in classified:
                classified.append(SPDX.get(last, last))
    if classified:
        return " or ".join(classified)
    field = str(_field(meta, "License") or "").strip()
    if field and "\n" not in field and len(field) <= MAX_LICENSE_FIELD and field.upper() != "UNKNOWN":
        return _one_line(field)
    raise LicenceMissing(f"{name}: its metadata has no License-Expression, no 'License :: ' classifier "
                         "and no one-line License field; add its licence by hand before shipping it")


def holders_of(name: str, meta: PackageMetadata) -> str:
    """Who the metadata says wrote ``name`` (DEP-5's Copyright field), on one line."""
    for field in ("Author", "Author-email", "Maintainer", "Maintainer-email"):
        value = _one_line(_field(meta, field))
        if value:
            return value
    return f"the authors of {name} (its metadata names none)"


def _field(meta: PackageMetadata, name: str) -> object:
    """The first ``name`` field of ``meta``; None when absent."""
    values = meta.get_all(name) or [None]
    return values[0]


def _one_line(value: object) -> str:
    return " ".join(str(value).split()) if value is not None else ""


def bundled(dists: Iterable[metadata.Distribution], env: Path, prefix: PurePosixPath) -> list[Bundled]:
    """Every distribution of the environment at ``env`` (the first of a name, as import finds it),
    its files named as installed under ``prefix``, relative to the root as DEP-5 wants."""
    out: dict[str, Bundled] = {}
    for dist in dists:
        name = str(dist.metadata["Name"])
        if name.lower() in out:
            continue
        site = Path(str(dist.locate_file(""))).resolve()
        installed = (prefix / site.relative_to(env)).relative_to("/") if site.is_relative_to(env) else None
        if installed is None:
            continue
        top: set[str] = set()
        licence_files = []
        for file in dist.files or []:
            if file.parts[0] == "..":  # a launcher in bin/, which Files: * covers
                continue
            # A module at the top of site-packages is named itself, a package by its directory.
            top.add(f"{installed / file.parts[0]}/*" if len(file.parts) > 1 else str(installed / file))
            if any(word in file.name.lower() for word in ("licen", "copying")):
                licence_files.append(f"/{installed / file}")
        out[name.lower()] = Bundled(name=name, version=str(dist.version), licence=licence_of(name, dist.metadata),
                                    holders=holders_of(name, dist.metadata), paths=tuple(sorted(top)),
                                    licence_files=tuple(sorted(licence_files)))
    return sorted(out.values(), key=lambda b: (b.name.lower() != PROJECT, b.name.lower()))


def render(packages: Sequence[Bundled], source: str) -> str:
    """DEP-5 text: the header, then one Files stanza per distribution, the project's as ``*``."""
    if not packages or packages[0].name != PROJECT:
        raise LicenceMissing(f"{PROJECT} itself is not among the bundled distributions")
    stanzas = [f"Format: {FORMAT}\nUpstream-Name: {PROJECT}\nSource: {source}\n"]
    for package in packages:
        files = "*" if package.name == PROJECT else "\n ".join(package.paths)
        comment = f"Comment: {package.name} {package.version}, bundled in /opt/{PROJECT}."
        if package.licence_files:
            comment += "\n Full licence text as the distribution ships it:\n " + "\n ".join(package.licence_files)
        stanzas.append(f"Files: {files}\nCopyright: {package.holders}\nLicense: {package.licence}\n{comment}\n")
    return "\n".join(stanzas)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koord.debian.copyright", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=PurePosixPath, required=True,
                        help="where the environment is installed on the node, e.g. /opt/koord-runtime")
    parser.add_argument("--source", default="https://koordinator.sh")
    args = parser.parse_args(argv)
    env = Path(sys.prefix).resolve()
    try:
        text = render(bundled(metadata.distributions(), env, args.prefix), args.source)
    except LicenceMissing as err:
        print(f"copyright: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The package's DEP-5 copyright file: each bundled distribution's licence from its metadata."""

from __future__ import annotations

from email.message import Message
from importlib.metadata import PackageMetadata
from pathlib import Path, PurePosixPath
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord.debian.copyright import PROJECT, Bundled, LicenceMissing, bundled, holders_of, licence_of, render


def meta(**fields: str | list[str]) -> PackageMetadata:
    message = Message()
    for key, value in fields.items():
        for one in value if isinstance(value, list) else [value]:
            message[key.replace("_", "-")] = one
    return cast(PackageMetadata, message)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"License_Expression": "Apache-2.0 AND MIT", "License": "BSD"}, "Apache-2.0 AND MIT"),
    ({"Classifier": ["License :: OSI Approved :: Apache Software License"]}, "Apache-2.0"),
    ({"Classifier": ["License :: OSI Approved :: BSD License"], "License": "ISC"}, "BSD License"),
    ({"Classifier": ["License :: DFSG approved", "License :: OSI Approved :: MIT License"]}, "MIT"),
    ({"Classifier": ["License :: OSI Approved :: MIT License", "License :: OSI Approved :: Apache Software License"]},
     "MIT or Apache-2.0"),
    ({"Classifier": ["Programming Language :: Python"], "License": "BSD-3-Clause"}, "BSD-3-Clause"),
    ({"License": "  Apache 2.0 "}, "Apache 2.0"),
])
def test_licence_comes_from_expression_then_classifiers_then_a_short_field(fields, expected):
    assert licence_of("dist", meta(**fields)) == expected


@pytest.mark.parametrize("fields", [
    {},
    {"License": "UNKNOWN"},
    {"License": "Copyright (c) 2020 someone\n\nPermission is hereby granted, free of charge, ..."},
    {"License": "x" * 81},
    {"Classifier": ["License :: DFSG approved"]},
])
def test_no_licence_names_the_distribution(fields):
    with pytest.raises(LicenceMissing, match="^somedist: "):
        licence_of("somedist", meta(**fields))


field_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), max_size=200)


@given(expression=st.one_of(st.none(), field_text), licence=st.one_of(st.none(), field_text),
       classifiers=st.lists(st.one_of(field_text, field_text.map(lambda t: "License :: " + t)), max_size=4))
def test_any_metadata_gives_one_line_or_names_the_distribution(expression, licence, classifiers):
    """DEP-5 fields are one line: whatever the metadata holds, the licence is a non-empty line,
    or the error names the distribution."""
    fields: dict[str, str | list[str]] = {"Classifier": classifiers}
    if expression is not None:
        fields["License_Expression"] = expression
    if licence is not None:
        fields["License"] = licence
    try:
        got = licence_of("d", meta(**fields))
    except LicenceMissing as err:
        assert str(err).startswith("d: ")
    else:
        assert got and got == got.strip() and "\n" not in got and "\r" not in got


@pytest.mark.parametrize(("fields", "expected"), [
    ({"Author": "A. Person", "Maintainer": "M"}, "A. Person"),
    ({"Author_email": "team <t@example.org>"}, "team <t@example.org>"),
    ({}, "the authors of d (its metadata names none)"),
])
def test_holders(fields, expected):
    assert holders_of("d", meta(**fields)) == expected


class FakeDist:
    """A distribution as importlib.metadata gives it: metadata, files, locate_file."""

    def __init__(self, site: Path, name: str, files: list[str], **fields: str) -> None:
        self.metadata = meta(Name=name, **fields)
        self.version = "1.0"
        self.files = [PurePosixPath(f) for f in files]
        self._site = site

    def locate_file(self, path: object) -> Path:
        return self._site / str(path)


def test_render_one_stanza_per_distribution_named_as_installed(tmp_path):
    site = tmp_path / "lib/python3.11/site-packages"
    dists = [
        FakeDist(site, "zlib-thing", ["zthing/__init__.py", "zthing-1.0.dist-info/LICENSE", "single.py"],
                 License_Expression="MIT"),
        FakeDist(site, PROJECT, ["koord/__init__.py", "../../../bin/koordlet"], License_Expression="Apache-2.0"),
        FakeDist(site, "koord-runtime", ["other/__init__.py"], License_Expression="GPL-3.0"),  # shadowed
    ]
    packages = bundled(dists, tmp_path, PurePosixPath("/opt/koord-runtime"))  # type: ignore[arg-type]
    assert [p.name for p in packages] == [PROJECT, "zlib-thing"]
    site_installed = "opt/koord-runtime/lib/python3.11/site-packages"
    assert packages[1].paths == (f"{site_installed}/single.py", f"{site_installed}/zthing-1.0.dist-info/*",
                                 f"{site_installed}/zthing/*")
    assert packages[1].licence_files == (f"/{site_installed}/zthing-1.0.dist-info/LICENSE",)
    text = render(packages, "https://koordinator.sh")
    stanzas = text.split("\n\n")
    assert stanzas[0].startswith("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
    assert stanzas[1].startswith("Files: *\n") and "License: Apache-2.0\n" in stanzas[1]
    assert stanzas[2].startswith(f"Files: {site_installed}/single.py\n {site_installed}/zthing-1.0.dist-info/*")
    assert "License: MIT\n" in stanzas[2]
    # Every continuation line is indented, as DEP-5 (deb822) wants.
    for stanza in stanzas:
        for line in stanza.splitlines():
            assert line.startswith(" ") or ": " in line, line


def test_render_refuses_an_environment_without_the_project():
    other = Bundled("x", "1", "MIT", "me", ("a/*",), ())
    with pytest.raises(LicenceMissing, match=PROJECT):
        render([other], "s")

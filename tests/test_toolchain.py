"""fsmc next to the rest of a Python toolchain: its license metadata (PEP 639) builds
without a setuptools warning, and editors validate specs with `fsmc schema` as the
spec page's "Editor support" section says to."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import docs
from tests.conftest import ROOT, SPECS, Wheel


@pytest.mark.slow
def test_the_wheel_carries_the_mit_license_without_a_setuptools_warning(fsmc_wheel: Wheel) -> None:
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    assert "fsmc authors" in (ROOT / "LICENSE").read_text()
    assert "Deprecat" not in fsmc_wheel.log, fsmc_wheel.log[-5000:]
    wheel = fsmc_wheel.path
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_schema_id_is_not_a_web_page(fsmc) -> None:  # type: ignore[no-untyped-def]
    # There is no published raw schema to fetch; a URN names it without pretending.
    schema = json.loads(fsmc("schema").out)
    assert schema["$id"] == "urn:fsmc:spec:1"


def editor_support() -> tuple[str, str, dict[str, list[str]]]:
    """The spec page's editor setup: the command that saves the schema, the modeline,
    and the `yaml.schemas` of its .vscode/settings.json."""
    settings = json.loads(docs.block("editor-vscode"))
    return docs.block("editor-save-schema").strip(), docs.block("editor-modeline").strip(), settings["yaml.schemas"]


@pytest.mark.slow
def test_every_example_spec_validates_against_the_schema_as_editors_are_told(tmp_path: Path) -> None:
    save, modeline, schemas = editor_support()
    assert save == "fsmc schema > fsmc.schema.json"
    fsmc = f"{sys.executable} -m fsmc"
    subprocess.run(save.replace("fsmc", fsmc, 1), shell=True, cwd=tmp_path, check=True)
    (tmp_path / "specs").mkdir()
    found = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", modeline)
    assert found is not None, modeline
    for spec in sorted(SPECS.glob("*.yaml")):
        (tmp_path / "specs" / spec.name).write_text(modeline + "\n" + spec.read_text())
    # The modeline's path is relative to the spec; the settings' paths to the project.
    targets = {(tmp_path / "specs" / found.group(1)).resolve(): ["specs/*.yaml"]}
    targets.update({(tmp_path / path).resolve(): globs for path, globs in schemas.items()})
    assert set(targets) == {(tmp_path / "fsmc.schema.json").resolve()}
    for schema, globs in targets.items():
        specs = sorted(str(p) for pattern in globs for p in tmp_path.glob(pattern))
        assert len(specs) == len(list(SPECS.glob("*.yaml"))) >= 3
        done = subprocess.run(
            [sys.executable, "-m", "check_jsonschema", "--schemafile", str(schema), *specs],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    # and it can fail: an initial state that is a number
    bad = tmp_path / "specs" / "bad.yaml"
    bad.write_text((SPECS / "job.yaml").read_text().replace("initial: queued", "initial: 3"))
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(tmp_path / "fsmc.schema.json"), str(bad)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "$.initial" in done.stdout, done.stdout + done.stderr

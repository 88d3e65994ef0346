"""MkDocs hooks (mkdocs.yml's `hooks:`): the repository's README.md is the site's
landing page, index.md, so the landing page has one source. Its links into the
documentation (`docs/spec.md#caps`) are relative to the repository's top, where
GitHub reads the README; on the site the page sits beside them (`spec.md#caps`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

README = Path(__file__).resolve().parent / "README.md"


def landing_page(readme: str) -> str:
    """The README as index.md: each link into docs/ made relative to docs/."""
    return re.sub(r"\]\(docs/", "](", readme)


def on_files(files: Files, config: Any) -> Files:
    if files.get_file_from_path("index.md") is not None:
        raise ValueError("docs/index.md exists: the landing page is README.md (mkdocs_hooks.py)")
    files.append(File.generated(config, "index.md", content=landing_page(README.read_text(encoding="utf-8"))))
    return files

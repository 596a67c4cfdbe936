"""Every relative link in README.md and docs/*.md names a file that exists (read from the linking
file's folder, as GitHub resolves it): moving text between README and docs/ had left a link to
docs/docs/throttling.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_relative_links_in_the_docs_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [(page.relative_to(ROOT).as_posix(), target) for page in pages
              for target in LINK.findall(page.read_text(encoding="utf-8"))
              if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()]
    assert len(pages) > 3 and broken == []

"""Every page under ``docs/`` is in the mkdocs nav, and every nav entry is a page that exists.

``mkdocs build --strict`` reports a page missing from the nav only at INFO level, so an orphaned page
(built, but reachable from no menu) passes the strict build; this test catches it without building.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may use ``!!python/name:`` or ``!ENV`` tags; the nav never does, so any tag reads as None."""


_Loader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages(nav: object) -> list[str]:
    """The page paths (relative to ``docs/``) in a mkdocs nav, nested sections included; external links skipped."""
    if isinstance(nav, str):
        return [] if "://" in nav else [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)


def test_nav_pages_helper():
    assert nav_pages(["a.md", {"B": "b.md"}, {"C": [{"D": "c/d.md"}, "https://x.org"]}]) == ["a.md", "b.md", "c/d.md"]


def test_no_orphaned_page():
    listed = set(nav_pages(_config()["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    orphans = sorted(pages - listed)
    assert not orphans, f"pages under docs/ that are in no mkdocs nav entry (add them to mkdocs.yml): {orphans}"


def test_every_nav_entry_exists():
    missing = sorted(page for page in nav_pages(_config()["nav"]) if not (DOCS / page).is_file())
    assert not missing, f"mkdocs nav entries with no page under docs/: {missing}"


def test_architecture_and_differences_pages_in_nav():
    listed = set(nav_pages(_config()["nav"]))
    assert {"architecture.md", "differences-from-flower.md"} <= listed

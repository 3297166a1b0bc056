"""The documentation site (mkdocs.yml, docs/): generated from the schema and the docstrings, built strict, offline.

The unit tier checks what the build-time hook renders (every schema key, every pipeline.privacy module) and
that the site stays offline and complete; the slow tier builds it with ``mkdocs build --strict`` and opens two
pages in headless Chromium, as it does the report (tests/test_workflow.py, check_report).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def _hook(repo: Path):
    spec = importlib.util.spec_from_file_location("docs_generated_pages", repo / "docs" / "hooks" / "generated_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mkdocs_config(repo: Path) -> dict:
    # mkdocs.yml uses no YAML tags (no !ENV, no !!python/name), so the safe loader reads it
    return yaml.safe_load((repo / "mkdocs.yml").read_text())


def _schema_keys(node: dict, prefix: str = ""):
    """Every dotted key of the schema, as the reference names it (map values as <name>, list items as [])."""
    for name, child in (node.get("properties") or {}).items():
        key = f"{prefix}.{name}" if prefix else name
        yield key
        yield from _schema_keys(child, key)
        extra = child.get("additionalProperties")
        if isinstance(extra, dict) and extra.get("properties"):
            yield from _schema_keys(extra, f"{key}.<name>")
        items = child.get("items")
        if isinstance(items, dict) and items.get("properties"):
            yield from _schema_keys(items, f"{key}[]")


def _nav_pages(nav) -> list[str]:
    out = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_config_reference_renders_every_schema_key_with_its_default(repo):
    hook = _hook(repo)
    schema = hook.load_schema(repo)
    page = hook.render(schema)
    keys = list(_schema_keys(schema))
    assert len(keys) > 300
    for key in keys:
        if schema["properties"].get(key, {}).get("properties"):  # a top-level section: its own heading
            assert f"\n## `{key}`\n" in page, key
            continue
        escaped = key.replace("<", "&lt;").replace(">", "&gt;")
        assert f"<code>{escaped}</code>" in page, key
    # a default and a description come from the schema, not from a hand copy
    data = schema["properties"]["data"]["properties"]
    row = re.search(r"<tr><td><code>data\.image_size</code></td>(.*?)</tr>", page).group(1)
    assert f"<code>{data['image_size']['default']}</code>" in row and "side length" in row
    assert "≥ 8" in row and "≤ 256" in row


def test_api_page_has_every_privacy_module(repo):
    hook = _hook(repo)
    on_disk = sorted(p.stem for p in (repo / "pipeline" / "privacy").glob("*.py") if not p.name.startswith("_"))
    blocks = hook.render_api(repo)
    for name in on_disk + ["sensgeo"]:
        assert f"::: pipeline.privacy.{name}\n" in blocks, name
    assert "<!-- privacy-api -->" in (repo / "docs" / "api" / "privacy.md").read_text()


def test_every_page_is_in_the_nav_and_the_site_stays_offline(repo):
    # the nav as the build sees it: mkdocs.yml's, with the method pages the hook derives from the declarations
    cfg = _hook(repo).on_config({**_mkdocs_config(repo), "config_file_path": str(repo / "mkdocs.yml")})
    nav = _nav_pages(cfg["nav"])
    pages = sorted(str(p.relative_to(repo / "docs")) for p in (repo / "docs").rglob("*.md"))
    assert sorted(nav) == pages
    # no Google fonts at build or view time, and only plugins that work offline
    assert cfg["theme"]["name"] == "material" and cfg["theme"]["font"] is False
    plugins = [next(iter(p)) if isinstance(p, dict) else p for p in cfg["plugins"]]
    assert set(plugins) <= {"search", "mkdocstrings"}, plugins
    assert cfg["strict"] is True
    # each method page renders its own schema section and its report captions
    for page, section in (("empden", "empden"), ("sensgeo", "sensgeo"), ("dpdm", "dpdm"),
                          ("straightdp", "straightdp"), ("baselines", "baselines")):
        text = (repo / "docs" / "methods" / f"{page}.md").read_text()
        assert f"<!-- config-reference: {section} -->" in text and "<!-- captions: " in text, page


def test_the_method_pages_are_in_the_nav_by_their_declarations_not_by_a_hand_list(repo):
    hook = _hook(repo)
    written = _nav_pages(_mkdocs_config(repo)["nav"])
    assert not [p for p in written if p.startswith("methods/") and p != "methods/index.md"]  # none by hand
    derived = hook.method_pages(repo)
    assert derived[0] == ("SENSGEO", "methods/sensgeo.md")  # METHOD.position: sensgeo 2, empden 3, ...
    assert [page for _, page in derived] == ["methods/sensgeo.md", "methods/empden.md", "methods/dpdm.md",
                                             "methods/straightdp.md", "methods/baselines.md"]
    index = hook.on_page_markdown("pages: <!-- method-pages -->.", None,
                                  {"config_file_path": str(repo / "mkdocs.yml")}, None)
    assert "[DPDM](dpdm.md)" in index and "<!--" not in index


def test_readme_is_the_first_ten_minutes(repo):
    readme = (repo / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    # dated measurements and commit hashes live in docs/measurements.md
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", readme)
    assert not re.search(r"\b[0-9a-f]{7,40}\b", readme)
    # the README's test command is what CI runs
    assert "make test" in readme and "\nmake test\n" in (repo / ".ci" / "run").read_text()
    # CI builds the site strict once: the slow tier's test_docs_site_builds_strict_and_renders_in_chromium
    assert "\nmake test-slow\n" in (repo / ".ci" / "run").read_text()
    # a clone has nothing outside itself: every path the README names is in the repository, and each paper is
    # cited by its title (and arXiv id where our copy has one)
    assert "../" not in readme
    for path in re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|smk|yml))`", readme):
        assert (repo / path).exists(), path
    for arxiv in ("2610.27710", "2607.29100", "2210.09929"):
        assert f"arXiv:{arxiv}" in readme


def _screenshot(chromium: str, page: Path, shot: Path) -> None:
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1400,1000", "--virtual-time-budget=10000", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=180, check=True)


@pytest.mark.slow
def test_docs_site_builds_strict_and_renders_in_chromium(repo, tmp_path):
    site = tmp_path / "site"
    mkdocs = Path(sys.executable).with_name("mkdocs")
    cmd = [str(mkdocs)] if mkdocs.exists() else [sys.executable, "-m", "mkdocs"]
    res = subprocess.run([*cmd, "build", "--strict", "--config-file", str(repo / "mkdocs.yml"),
                          "--site-dir", str(site)], capture_output=True, text=True, timeout=300, cwd=repo)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("index.html", "configuration.html", "api/privacy.html", "methods/empden.html", "measurements.html"):
        assert (site / name).stat().st_size > 5000, name
    # generated at build time: the schema's keys and the privacy API's docstrings are on the pages
    assert "empden.grid" in (site / "configuration.html").read_text()
    assert "pipeline.privacy.ledger" in (site / "api" / "privacy.html").read_text()
    # offline: no page asks for Google fonts
    for page in site.rglob("*.html"):
        assert "fonts.googleapis.com" not in page.read_text(), page
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium not installed (.ci/run installs Debian's chromium): screenshots not taken")
    import matplotlib.image as mpimg
    import numpy as np

    for name in ("index.html", "methods/empden.html"):
        shot = tmp_path / (name.replace("/", "_") + ".png")
        _screenshot(chromium, site / name, shot)
        pixels = mpimg.imread(shot)
        # a rendered page, not a blank one: header bar, navigation and text put many distinct colours on it
        assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05, name
        colours = np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
        assert len(colours) > 50, (name, len(colours))
        assert shot.stat().st_size > 20_000, name

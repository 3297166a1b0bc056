"""MkDocs hook: the pages generated at build time, the configuration reference and the privacy API.

``docs/configuration.md`` holds the marker ``<!-- config-reference -->``; this hook replaces it with
one table per top-level section of the config schema (``pipeline/schema/config.schema.yaml`` and each
method's ``pipeline/methods/<method>/schema.yaml``, composed by ``pipeline.config.load_schema``: every key,
its type and constraints, its default and its description). Nothing is copied by hand, so the page cannot drift
from the schema that validates every run. ``render(schema)`` is also what the tests call.
``docs/api/privacy.md`` holds ``<!-- privacy-api -->``, replaced by one mkdocstrings block per module
of ``pipeline/privacy/`` found on disk, so a new mechanism module appears without editing the page.
A method page's ``<!-- config-reference: SECTION -->`` renders that section's keys, and its
``<!-- captions: PREFIX -->`` the report's caption of each of its tables and figures
(``report/captions/PREFIX*.rst``).
The nav's ``Methods`` section and the methods index's ``<!-- method-pages -->`` list each method's page
(``docs/methods/<method>.md``) from the methods' declarations (``pipeline.plugins``: ``METHOD.title``, in
``METHOD.position`` order), so a method added by its own folder and page is in the site without editing
``mkdocs.yml``.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

MARKER = "<!-- config-reference -->"
METHOD_PAGES_MARKER = "<!-- method-pages -->"
#: the nav section the method pages go in (its first entry, the methods index, stays as mkdocs.yml writes it)
METHODS_NAV = "Methods"
API_MARKER = "<!-- privacy-api -->"
PRIVACY = Path("pipeline") / "privacy"
CAPTIONS = Path("report") / "captions"

_BOUNDS = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))


def _importable(root: Path) -> None:
    """The checkout at ``root`` importable as ``pipeline`` (the build runs from any working directory)."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def load_schema(root: Path) -> dict:
    """The schema every run is validated against, composed by the package's own ``load_schema`` from the checkout
    at ``root`` (the house's file and each method's section)."""
    _importable(root)
    from pipeline.config import load_schema as composed

    return composed()


def _value(v) -> str:
    """A default or enum value as YAML-ish inline text (JSON for containers, None as null)."""
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _text(s: str) -> str:
    """A description as HTML: escaped, with `code` spans kept as <code>."""
    parts = re.split(r"`([^`]*)`", " ".join(str(s).split()))
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def type_of(node: dict) -> str:
    """The key's type with its constraints, in words (enum values, bounds, item types, alternatives)."""
    if "const" in node:
        return f"const {_value(node['const'])}"
    if "enum" in node:
        return "one of " + ", ".join(_value(v) for v in node["enum"])
    for alt in ("oneOf", "anyOf"):
        if alt in node:
            return " or ".join(type_of(n) for n in node[alt])
    t = node.get("type", "any")
    out = " or ".join(t) if isinstance(t, list) else t
    bounds = [f"{sym} {_value(node[k])}" for k, sym in _BOUNDS if k in node]
    if "pattern" in node:
        bounds.append(f"matching {node['pattern']}")
    if "minItems" in node:
        bounds.append(f"at least {node['minItems']} items")
    if "maxItems" in node:
        bounds.append(f"at most {node['maxItems']} items")
    if node.get("uniqueItems"):
        bounds.append("unique items")
    if isinstance(node.get("items"), dict):
        out += f" of ({type_of(node['items'])})"
    if isinstance(node.get("additionalProperties"), dict) and "properties" not in node.get("additionalProperties", {}):
        out += f", every value {type_of(node['additionalProperties'])}"
    if node.get("required") and node.get("properties"):
        bounds.append("requires " + ", ".join(node["required"]))
    return out + (" (" + "; ".join(bounds) + ")" if bounds else "")


def rows(node: dict, prefix: str):
    """(dotted key, type, default or None, description) of every key under ``node``, depth first."""
    for name, child in (node.get("properties") or {}).items():
        key = f"{prefix}.{name}" if prefix else name
        yield key, type_of(child), child.get("default", ...), child.get("description", "")
        yield from rows(child, key)
        extra = child.get("additionalProperties")
        if isinstance(extra, dict) and extra.get("properties"):
            yield f"{key}.<name>", type_of(extra), ..., extra.get("description", "one entry per name")
            yield from rows(extra, f"{key}.<name>")
        items = child.get("items")
        if isinstance(items, dict) and items.get("properties"):
            yield from rows(items, f"{key}[]")


def _table(entries) -> str:
    head = "<table>\n<thead><tr><th>key</th><th>type</th><th>default</th><th>description</th></tr></thead>\n<tbody>\n"
    body = "".join(
        f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(t)}</td>"
        f"<td>{'' if d is ... else '<code>' + html.escape(_value(d)) + '</code>'}</td><td>{_text(desc)}</td></tr>\n"
        for k, t, d, desc in entries)
    return head + body + "</tbody>\n</table>\n"


def render(schema: dict) -> str:
    """Markdown: the top-level scalar keys in one table, then a section per top-level object."""
    top = schema.get("properties") or {}
    scalars = [(k, type_of(v), v.get("default", ...), v.get("description", ""))
               for k, v in top.items() if not v.get("properties")]
    out = ["## Top-level keys\n", _table(scalars)]
    for name, node in top.items():
        if not node.get("properties"):
            continue
        out.append(f"\n## `{name}`\n")
        if node.get("description"):
            out.append(f"<p>{_text(node['description'])}</p>\n")
        out.append(_table(rows(node, name)))
    return "\n".join(out)


def privacy_modules(root: Path) -> list[str]:
    """Every module and sub-package of pipeline.privacy, found on disk (a new module gets its section)."""
    pkg = root / PRIVACY
    names = [p.stem for p in pkg.glob("*.py") if not p.name.startswith("_")]
    names += [p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(names)


def render_api(root: Path) -> str:
    """mkdocstrings blocks: the package, then one per module (sub-packages with their modules)."""
    blocks = ["::: pipeline.privacy\n    options:\n      members: false\n"]
    for name in privacy_modules(root):
        sub = root / PRIVACY / name
        blocks.append(f"::: pipeline.privacy.{name}\n")
        if sub.is_dir():
            blocks += [f"::: pipeline.privacy.{name}.{p.stem}\n    options:\n      heading_level: 3\n"
                       for p in sorted(sub.glob("*.py")) if not p.name.startswith("_")]
    return "\n".join(blocks)


def render_section(schema: dict, name: str) -> str:
    """One top-level section's table (a method page's config keys), from the same schema."""
    node = (schema.get("properties") or {}).get(name)
    if node is None or not node.get("properties"):
        raise ValueError(f"config-reference: no section {name!r} in the config schema (pipeline.config.load_schema)")
    return _table(rows(node, name))


def _rst_inline(s: str) -> str:
    """A caption's reStructuredText inline markup as Markdown (``code`` -> `code`; **bold** is the same)."""
    return " ".join(s.replace("``", "`").split())


def render_captions(root: Path, prefix: str) -> str:
    """The report's caption (report/captions/<name>.rst) of every table and figure whose name starts with prefix."""
    paths = sorted(p for p in (root / CAPTIONS).glob(f"{prefix}*.rst") if not p.name.startswith("_"))
    if not paths:
        raise ValueError(f"captions: no report/captions/{prefix}*.rst")
    return "\n".join(f"- `{p.stem}`: {_rst_inline(p.read_text())}" for p in paths) + "\n"


_SECTION = re.compile(r"<!-- config-reference: ([a-z_]+) -->")
_CAPTIONS = re.compile(r"<!-- captions: ([a-z_0-9]+) -->")


def method_pages(root: Path) -> list[tuple[str, str]]:
    """(title, ``methods/<method>.md``) of every method with a page in ``docs/methods/``, in the declarations' order
    (:func:`pipeline.plugins.in_order`)."""
    _importable(root)
    from pipeline.plugins import in_order

    return [(m.title or m.name, f"methods/{m.name}.md") for m in in_order()
            if (root / "docs" / "methods" / f"{m.name}.md").is_file()]


def on_config(config):
    """The nav's ``Methods`` section: its index page, then each method's page (:func:`method_pages`)."""
    root = Path(config["config_file_path"]).parent
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and METHODS_NAV in entry:
            index = [e for e in entry[METHODS_NAV] if e == "methods/index.md"]
            entry[METHODS_NAV] = index + [{title: page} for title, page in method_pages(root)]
            return config
    raise ValueError(f"mkdocs.yml: the nav has no {METHODS_NAV!r} section for the method pages")


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (MkDocs hook signature)
    root = Path(config["config_file_path"]).parent
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, render(load_schema(root)))
    if _SECTION.search(markdown):
        schema = load_schema(root)
        markdown = _SECTION.sub(lambda m: render_section(schema, m.group(1)), markdown)
    markdown = _CAPTIONS.sub(lambda m: render_captions(root, m.group(1)), markdown)
    if METHOD_PAGES_MARKER in markdown:
        markdown = markdown.replace(METHOD_PAGES_MARKER, ", ".join(
            f"[{title}]({Path(page).name})" for title, page in method_pages(root)))
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, render_api(root))
    return markdown

"""MkDocs hook: README.md as the site's home, the committed ledger (hypotheses/LEDGER.md and its
plots) as its `ledger.md`, and an executed probe, docs/probe-example.ipynb (the case study's
context_decode, copied from a `make run`), as the page `probe-example.md` with its real outputs
(the text, records and warnings it printed, and its plot).

README.md and the pages link to files as they lie in the repository (`docs/tutorial.md`,
`../hypotheses/LEDGER.md`), which GitHub follows; in the site those links name the site's own pages and
its copies of the plots instead.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LEDGER = ROOT / "hypotheses" / "LEDGER.md"
PLOTS = ROOT / "hypotheses" / "ledger" / "plots"
EXECUTED = ROOT / "docs" / "probe-example.ipynb"
#: a link or image source into hypotheses/, from a page in docs/ (`../`) or from README.md (none)
INTO_LEDGER = re.compile(r"(\]\(|src=\")(?:\.\./)?hypotheses/(LEDGER\.md|ledger/plots/)")
INTO_DOCS = re.compile(r"\]\(docs/")


def notebook_page(path: Path) -> str:
    """An executed notebook as Markdown: its markdown cells, each code cell's source and what it printed."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            out.append(source)
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        said = f"<!-- cell tagged {', '.join(tags)} -->\n" if tags else ""
        out.append(f"{said}```python\n{source}\n```")
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                png = "".join(data["image/png"]).replace("\n", "")
                base64.b64decode(png, validate=True)  # a page that shows a broken image must not build
                out.append(f'<img src="data:image/png;base64,{png}" alt="the probe\'s plot">')
            elif "text" in output or "text/plain" in data:
                text = "".join(output.get("text") or data["text/plain"])
                out.append(f"```text\n{text.rstrip()}\n```")
    return "\n\n".join(out) + "\n"


def on_files(files, config):
    files.append(File.generated(config, "probe-example.md", content=notebook_page(EXECUTED)))
    files.append(File.generated(config, "ledger.md", abs_src_path=str(LEDGER)))
    for plot in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"ledger/plots/{plot.name}", abs_src_path=str(plot)))
    return files


def _into_ledger(match: re.Match) -> str:
    return match.group(1) + ("ledger.md" if match.group(2) == "LEDGER.md" else match.group(2))


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri in ("ledger.md", "probe-example.md"):
        return markdown
    if page.file.src_uri == "index.md":
        markdown = INTO_DOCS.sub("](", README.read_text(encoding="utf-8"))
    return INTO_LEDGER.sub(_into_ledger, markdown)

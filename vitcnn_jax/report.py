"""One HTML page over a set of finished analyses (`configs/report.py`, run by
`jobs.run_report`): per section, the figures, each of the paper's findings (our
words, from the analysis's declaration) with whether this run shows it and the
numbers that decide it, the key numbers of its json, and the config and
checkpoints that made them. Figures are linked, not copied: the page works
wherever the workdir is opened or copied whole."""

from __future__ import annotations

import html
import json
import os
from typing import Any

import matplotlib
import ml_collections
import numpy as np

from vitcnn_jax import analyses
from vitcnn_jax import fileio
from vitcnn_jax.run import declaration


def _scalars(d: dict, prefix: str = "", limit: int = 12) -> list[tuple[str, str]]:
  """Numbers and short strings of a summary (nested dicts flattened), at most `limit`."""
  out = []
  for k, v in d.items():
    name = f"{prefix}{k}"
    if isinstance(v, (int, float)):
      out.append((name, f"{v:.4g}" if isinstance(v, float) else str(v)))
    elif isinstance(v, str) and len(v) < 80 and k not in ("analysis", "checkpoint"):
      out.append((name, v))
    elif isinstance(v, dict) and k not in ("files", "models"):
      out += _scalars(v, f"{name} / ", limit)
  return out[:limit]


def _findings(declared: declaration.Declaration, summary: dict) -> str:
  """The paper's findings, each with this run's verdict and its numbers, and
  under it the verdict of each variant of the choices it could rest on."""
  marks = {"shown": "yes", "not shown": "no"}
  mark = lambda status: f'<span class={marks.get(status, "na")}>{html.escape(status)}</span>'
  rows = []
  for finding, judged in declared.verdicts(summary):
    if judged is None:
      rows.append(f"<tr><td>{html.escape(finding.text)}</td><td>{mark('does not apply')}</td><td></td></tr>")
      continue
    variants = "".join(f"<li>{html.escape(k)}: {mark(status)} {html.escape(numbers)}</li>"
                       for k, status, numbers in judged.variants)
    rows.append(f"<tr><td>{html.escape(finding.text)}</td><td>{mark(judged.status)}</td>"
                f"<td>{html.escape(judged.numbers)}{f'<ul class=variants>{variants}</ul>' if variants else ''}"
                "</td></tr>")
  return ("<table class=findings><tr><th>The paper</th><th>this run</th><th>numbers</th></tr>"
          f"{''.join(rows)}</table>" if rows else "")


def _checkpoints(summary: Any) -> list[str]:
  """Every `checkpoint` value in a summary."""
  if isinstance(summary, dict):
    own = [summary["checkpoint"]] if isinstance(summary.get("checkpoint"), str) else []
    return own + [c for k, v in summary.items() if k != "checkpoint" for c in _checkpoints(v)]
  if isinstance(summary, list):
    return [c for v in summary for c in _checkpoints(v)]
  return []


def hover_map(matrix: np.ndarray, rows: list[str], cols: list[str], title: str) -> str:
  """An inline SVG heatmap whose cells name their two layers and value on hover
  (origin lower left, as in the PNG; its colour scale 0-1)."""
  colours = matplotlib.colormaps["magma"](np.clip(matrix, 0, 1))
  cells = []
  for i, row in enumerate(rows):
    for j, col in enumerate(cols):
      r, g, b, _ = (255 * colours[i, j]).astype(int)
      cells.append(f'<rect x="{j}" y="{len(rows) - 1 - i}" width="1" height="1" '
                   f'fill="#{r:02x}{g:02x}{b:02x}"><title>{html.escape(row)} / {html.escape(col)}: '
                   f"{matrix[i, j]:.3f}</title></rect>")
  return (f'<figure><svg class=hover viewBox="0 0 {len(cols)} {len(rows)}" '
          f'preserveAspectRatio="none" role="img" aria-label="{html.escape(title)}">{"".join(cells)}'
          f"</svg><figcaption>{html.escape(title)}: hover a cell for its layers</figcaption></figure>")


def _hover_maps(folder: str) -> str:
  """Hover maps of every CKA matrix in the section's npz files."""
  out = []
  for f in sorted(os.listdir(folder)):
    if not f.endswith(".npz") or f.endswith("_state.npz"):
      continue
    with np.load(os.path.join(folder, f)) as z:
      names = {k[len("names_"):]: list(z[k]) for k in z.files if k.startswith("names_")}
      for k in z.files:
        pair = k[len("cka_"):] if k.startswith("cka_") else ""
        a = next((m for m in names if pair.startswith(f"{m}_") and pair[len(m) + 1:] in names), None)
        if a is not None:
          out.append(hover_map(z[k], names[a], names[pair[len(a) + 1:]], k))
  return f"<details><summary>Every layer (hover)</summary>{''.join(out)}</details>" if out else ""


def _section(name: str, workdir: str, config: ml_collections.ConfigDict) -> str:
  declared = analyses.get(config.analysis)
  folder = os.path.join(workdir, name)
  summary_file = f"{declared.name}.json"
  summary = {}
  if os.path.exists(os.path.join(folder, summary_file)):
    with open(os.path.join(folder, summary_file)) as f:
      summary = json.load(f)
  try:
    numbers = declared.key_numbers(summary)
  except (KeyError, ValueError, TypeError, IndexError):  # an older summary: its scalars as they are
    numbers = _scalars(summary)
  rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in numbers)
  if summary.get("non_finite"):  # the run's own flag (`driver.write`), shown beside its numbers
    rows += (f'<tr><td class="no">NaN or inf in the results</td><td class="no">'
             f'{html.escape(", ".join(sorted(summary["non_finite"])))}</td></tr>')
  figures = sorted(f for f in os.listdir(folder) if f.endswith(".png"))
  images = "".join(f'<figure><img src="{html.escape(name)}/{html.escape(f)}" alt="{html.escape(f)}">'
                   f"<figcaption>{html.escape(f)}</figcaption></figure>" for f in figures)
  ckpts = "".join(f"<li><code>{html.escape(c)}</code></li>" for c in dict.fromkeys(_checkpoints(summary)))
  return (f'<section id="{html.escape(name)}"><h2>{html.escape(name.replace("_", " "))}'
          f'<span class="fig">{html.escape(declared.figures)}</span></h2>'
          f"{_findings(declared, summary)}{images}{_hover_maps(folder)}"
          f"<h3>Key numbers ({html.escape(name)}/{html.escape(summary_file)})</h3>"
          f"<table>{rows}</table><h3>Checkpoints</h3><ul>{ckpts}</ul>"
          f"<details><summary>Config</summary><pre>{html.escape(config.to_json_best_effort(indent=1))}"
          "</pre></details></section>")


STYLE = ("body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
         "color:#222}h1{font-size:1.6em}h2{border-top:1px solid #ccc;padding-top:1em}"
         ".fig{font-weight:normal;color:#666;font-size:.75em;margin-left:.8em}"
         ".findings td,.findings th{vertical-align:top;text-align:left;padding:.3em .6em}"
         ".findings{background:#f4f7fb;width:100%}.findings td:first-child{width:58%}"
         ".findings td:nth-child(2){white-space:nowrap}.variants{margin:.3em 0;padding-left:1.2em;font-size:.9em}"
         ".yes{color:#176b26;font-weight:bold}.no{color:#b3261e;font-weight:bold}.na{color:#666}"
         "figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}"
         "figcaption{color:#666;font-size:.85em}table{border-collapse:collapse}"
         "td{border-bottom:1px solid #eee;padding:.2em .8em .2em 0}pre{font-size:12px;"
         "background:#f6f6f6;padding:.6em;overflow:auto}.paper{background:#f4f7fb;padding:.6em}"
         "svg.hover{width:100%;max-width:640px;aspect-ratio:1;display:block}")
# Marks the page once every image has loaded or failed: a headless browser (and a
# reader) can tell a complete page from one with missing figures.
CHECK = ("<script>window.addEventListener('load',()=>{const i=[...document.images];"
         "const bad=i.filter(x=>!x.complete||x.naturalWidth===0);"
         "document.title+=` (${i.length} figures, ${bad.length} missing)`;"
         "bad.forEach(x=>x.insertAdjacentHTML('afterend','<b style=color:red>missing: '+x.alt+'</b>'));});"
         "</script>")


def write(workdir: str, sections: dict[str, ml_collections.ConfigDict], title: str) -> str:
  """WORKDIR/report.html over the finished runs in WORKDIR/<section>."""
  body = "".join(_section(name, workdir, cfg) for name, cfg in sections.items())
  toc = " · ".join(f'<a href="#{html.escape(n)}">{html.escape(n.replace("_", " "))}</a>'
                   for n in sections)
  page = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
          f"<style>{STYLE}</style>{CHECK}</head><body><h1>{html.escape(title)}</h1>"
          f"<p>Raghu et al., <i>Do Vision Transformers See Like Convolutional Neural Networks?</i> "
          f"(NeurIPS 2021). {len(sections)} analyses: {toc}</p>{body}</body></html>")
  path = os.path.join(workdir, "report.html")
  fileio.atomic_write(path, lambda f: f.write(page.encode()))
  return path

"""One HTML page for a set of analyses (`configs/report.py`): each one is run in
WORKDIR/SECTION (or its finished results reused), then `report.html` shows, per
paper figure, the figures, what the paper found, the key numbers of its json,
and the config and checkpoints that made them. Figures are linked, not copied:
the page works wherever the workdir is opened or copied whole."""

from __future__ import annotations

import html
import json
import os
from typing import Any, Callable

import jax
import matplotlib
import ml_collections
import numpy as np

from vitcnn_jax import fileio

# Per analysis: the paper's figures, and what they show (our summary of the paper).
PAPER = {
    "cka": ("Figs 1, 2, B.1", "ViT representations are far more uniform across depth than a "
            "ResNet's: CKA between ViT layers stays high over most of the network, while the "
            "ResNet shows a stage-wise block structure. Across models, the lower half of the "
            "ResNet matches about the lowest quarter of the ViT."),
    "attention_distance": ("Figs 3, 4, C.5, C.6", "With large pre-training data, lower ViT "
                           "blocks have both local and global heads; higher blocks attend "
                           "globally (near the uniform-attention distance). Trained on "
                           "ImageNet alone, lower blocks lose their local heads."),
    "head_subsets": ("Fig 5", "Subsets of first-block heads that attend more locally are more "
                     "similar (CKA) to the lower ResNet layers; CKA falls as the subset's mean "
                     "attention distance grows."),
    "receptive_field": ("Figs 6, C.1-C.4", "ViT receptive fields are more global than a "
                        "ResNet's from the lowest layers on, yet remain centred on the token's "
                        "own position; ResNet fields grow gradually with depth."),
    "skip_ratio": ("Figs 7, E.1, E.2", "ViT skip connections carry much of the signal: the "
                   "CLS token's ratio is high in the first half and the spatial tokens' in "
                   "the second half, with ratios far above a ResNet's."),
    "reference_cka": ("Figs 8, 12, G.1", "Removing a block's skip connection changes the "
                      "representations (and costs accuracy, most in the middle blocks); lower "
                      "layers trained on 3% of the data already resemble the full-data model."),
    "localization": ("Figs 9, 10, D.1-D.3", "Higher-layer ViT tokens trained with a CLS token "
                     "stay localised: each is most similar to its own input patch. GAP "
                     "training weakens this."),
    "linear_probe": ("Figs 11, 13, D.4, F.1-F.3", "With a CLS token, spatial tokens of the "
                     "last blocks hold little class information (the CLS token gathers it); "
                     "with GAP every token does. Layerwise probes rise with depth."),
}


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


def _attention(s: dict) -> list[tuple[str, str]]:
  mean = np.asarray(s["mean_distance_px"])
  return [("uniform-attention distance (px)", f"{s['uniform_ceiling_px']:.1f}"),
          (f"block {s['blocks'][0]}: heads from / to (px)", f"{mean[0].min():.1f} / {mean[0].max():.1f}"),
          (f"block {s['blocks'][-1]}: heads from / to (px)", f"{mean[-1].min():.1f} / {mean[-1].max():.1f}")]


def _skip(s: dict) -> list[tuple[str, str]]:
  out = []
  for k in ("vit", "mixer"):
    if k in s:
      cls, spatial = s[k].get("cls_ratio"), np.asarray(s[k]["spatial_ratio"])
      half = len(spatial) // 2
      if cls is not None:
        cls = np.asarray(cls)
        out.append((f"{s[k]['label']} CLS ratio, first / second half",
                    f"{cls[:half].mean():.2f} / {cls[half:].mean():.2f}"))
      out.append((f"{s[k]['label']} spatial ratio, first / second half",
                  f"{spatial[:half].mean():.2f} / {spatial[half:].mean():.2f}"))
  if "bit" in s:
    out.append((f"{s['bit']['label']} ratio, mean over units", f"{np.mean(s['bit']['ratio']):.2f}"))
  return out


KEY_NUMBERS: dict[str, Callable[[dict], list[tuple[str, str]]]] = {
    "cka": lambda s: [(f"mean CKA {k}", f"{v:.3f}") for k, v in s["mean_cka"].items()]
    + [("largest std over repeats", f"{s['max_std_over_repeats']:.4f}")],
    "attention_distance": _attention,
    "skip_ratio": _skip,
}


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


def _section(name: str, workdir: str, sub: str, config: ml_collections.ConfigDict) -> str:
  analysis = config.analysis
  folder = os.path.join(workdir, sub)
  jsons = sorted(f for f in os.listdir(folder) if f.endswith(".json"))
  summary = {}
  if jsons:
    with open(os.path.join(folder, jsons[0])) as f:
      summary = json.load(f)
  figures = sorted(f for f in os.listdir(folder) if f.endswith(".png"))
  figs, claim = PAPER.get(analysis, ("", ""))
  try:
    numbers = KEY_NUMBERS.get(analysis, _scalars)(summary)
  except (KeyError, ValueError, TypeError):  # an older summary: its scalars as they are
    numbers = _scalars(summary)
  rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in numbers)
  images = "".join(f'<figure><img src="{html.escape(sub)}/{html.escape(f)}" alt="{html.escape(f)}">'
                   f"<figcaption>{html.escape(f)}</figcaption></figure>" for f in figures)
  ckpts = "".join(f"<li><code>{html.escape(c)}</code></li>" for c in dict.fromkeys(_checkpoints(summary)))
  return (f'<section id="{html.escape(name)}"><h2>{html.escape(name.replace("_", " "))}'
          f'<span class="fig">{html.escape(figs)}</span></h2>'
          f"<p class=paper><b>The paper:</b> {html.escape(claim)}</p>{images}{_hover_maps(folder)}"
          f"<h3>Key numbers ({html.escape(sub)}/{html.escape(jsons[0] if jsons else '-')})</h3>"
          f"<table>{rows}</table><h3>Checkpoints</h3><ul>{ckpts}</ul>"
          f"<details><summary>Config</summary><pre>{html.escape(config.to_json_best_effort(indent=1))}"
          "</pre></details></section>")


STYLE = ("body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;"
         "color:#222}h1{font-size:1.6em}h2{border-top:1px solid #ccc;padding-top:1em}"
         ".fig{font-weight:normal;color:#666;font-size:.75em;margin-left:.8em}"
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
  body = "".join(_section(name, workdir, name, cfg) for name, cfg in sections.items())
  toc = " · ".join(f'<a href="#{html.escape(n)}">{html.escape(n.replace("_", " "))}</a>'
                   for n in sections)
  page = (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
          f"<style>{STYLE}</style>{CHECK}</head><body><h1>{html.escape(title)}</h1>"
          f"<p>Raghu et al., <i>Do Vision Transformers See Like Convolutional Neural Networks?</i> "
          f"(NeurIPS 2021). {len(sections)} analyses: {toc}</p>{body}</body></html>")
  path = os.path.join(workdir, "report.html")
  fileio.atomic_write(path, lambda f: f.write(page.encode()))
  return path


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs (or reuses) each analysis of `config.runs` in WORKDIR/<name>, then the page."""
  from vitcnn_jax import analyses  # pylint: disable=g-import-not-at-top  (analyses runs this)
  order = list(config.get("order") or ())
  missing = [n for n in order if n not in config.runs]
  if missing:
    raise ValueError(f"config.order names {missing}, which config.runs does not have.")
  sections = {n: config.runs[n] for n in order + sorted(set(config.runs) - set(order))}
  if not sections:
    raise ValueError("config.runs is empty; give the report the analyses to run (configs/report.py).")
  for i, (name, sub) in enumerate(sections.items(), 1):
    if jax.process_index() == 0:
      print(f"[{i}/{len(sections)}] {name} ({sub.analysis}) in {os.path.join(workdir, name)}")
    analyses.run(sub, os.path.join(workdir, name))
  if jax.process_index() != 0:
    return {}
  path = write(workdir, sections, config.get("title") or "vitcnn_jax report")
  print(f"Wrote {path}")
  return {"report": path, "sections": list(sections)}

"""Figures: every family drawn on small inputs is readable (no text under 8 pt),
titled and labelled; block ticks; plot options (format, colour scale, kept figures)."""

from __future__ import annotations

import matplotlib.text
import numpy as np
import pytest

from vitcnn_jax import plotting

VIT = [f"block{b:02d}/{p}" for b in range(4) for p in ("ln1", "attn/out", "ln2", "mlp/hidden",
                                                         "mlp/out", "out")]
BIT = ["root/conv", "root/pool"] + [f"block{s}/unit{u:02d}/{p}" for s in (1, 2) for u in (1, 2)
                                    for p in ("conv1", "out")] + ["head/preact"]


def _draw(fn, *args, tmp_path, **kwargs):
  with plotting.options(keep=True) as figs:
    fn(*args, path=str(tmp_path / "f.png"), **kwargs)
  assert (tmp_path / "f.png").stat().st_size > 1000
  return figs[0]


def _texts(fig):
  return [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]


def _check_readable(fig):
  small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < 8]
  assert not small, f"text under 8 pt: {small[:5]}"
  for ax in fig.axes:
    if ax.get_label() == "<colorbar>" or not ax.axison:
      continue
    assert ax.get_title() or fig._suptitle is not None, "an untitled panel"  # pylint: disable=protected-access
    assert ax.images or ax.get_xlabel() or ax.get_xticklabels(), "a plot with an unlabelled x axis"


def test_layer_groups_and_tick_text():
  assert plotting.layer_groups(VIT[:8]) == [("block00", 0, 6), ("block01", 6, 8)]
  groups = plotting.layer_groups(BIT)
  assert [g for g, _, _ in groups] == ["root", "block1/unit01", "block1/unit02", "block2/unit01",
                                       "block2/unit02", "head"]
  assert groups[1] == ("block1/unit01", 2, 4)
  assert [plotting._short(g) for g, _, _ in groups] == ["root", "1.1", "1.2", "2.1", "2.2", "head"]


def test_cka_heatmap_one_tick_per_block_and_colour_scale(tmp_path):
  m = np.random.default_rng(0).uniform(0.4, 1, (len(BIT), len(VIT)))
  with plotting.options(format="svg", vmin=0.4, vmax=1.0, keep=True) as figs:
    plotting.cka_heatmap(m, BIT, VIT, row_label="R", col_label="V", title="t",
                         path=str(tmp_path / "c.png"))
  fig = figs[0]
  assert (tmp_path / "c.png").exists() and (tmp_path / "c.svg").exists()
  ax = fig.axes[0]
  assert ax.images[0].get_clim() == (0.4, 1.0)
  assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]
  assert [t.get_text() for t in ax.get_yticklabels()] == ["root", "1.1", "1.2", "2.1", "2.2", "head"]
  assert ax.get_xticks().tolist() == [2.5, 8.5, 14.5, 20.5]  # block middles
  vertical, horizontal = (sorted(seg[0][i] for c in ax.collections for seg in c.get_segments()
                                 if seg[0][i] == seg[1][i]) for i in (0, 1))
  assert vertical == [5.5, 11.5, 17.5] and horizontal == [1.5, 3.5, 5.5, 7.5, 9.5]  # block edges
  _check_readable(fig)


def test_options_are_checked_and_restored(tmp_path):
  with pytest.raises(ValueError, match="jpg"):
    with plotting.options(format="jpg"):
      pass
  with pytest.raises(ValueError, match="vmin"):
    with plotting.options(vmin=1.0, vmax=0.5):
      pass
  with plotting.options(format="pdf"):
    pass
  fig = _draw(plotting.head_subsets, np.array([30.0, 60.0]), np.array([[0.5, 0.4], [0.3, 0.2]]),
              ["block1/unit01/out", "block2/unit01/out"], "ViT", "R50", tmp_path=tmp_path)
  assert not (tmp_path / "f.pdf").exists()  # the pdf option ended with its block
  assert fig.axes[0].get_legend() is not None
  _check_readable(fig)


def test_attention_distance_legend_and_integer_ticks(tmp_path):
  mean = list(np.random.default_rng(0).uniform(10, 100, (6, 4)))
  fig = _draw(plotting.attention_distance, mean, list(range(6)), None, "ViT", np.full(6, 110.0),
              tmp_path=tmp_path)
  for ax in fig.axes:
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "uniform attention" in labels
    ticks = ax.get_xticks()
    assert np.allclose(ticks, np.round(ticks)), ticks
  _check_readable(fig)


def test_attention_distance_of_stages_of_different_heads_and_windows(tmp_path):
  """A Swin: 2 then 4 heads, each stage's windows of their own uniform distance."""
  rng = np.random.default_rng(2)
  mean = [rng.uniform(2, 9, 2), rng.uniform(2, 9, 2), rng.uniform(5, 18, 4), rng.uniform(5, 18, 4)]
  fig = _draw(plotting.attention_distance, mean, [0, 1, 2, 3], None, "Swin",
              np.array([10.0, 9.5, 20.0, 19.0]), tmp_path=tmp_path)
  left, right = fig.axes
  assert [len(line.get_xdata()) for line in left.get_lines() if line.get_label().startswith("block")] == [
      2, 2, 4, 4]
  assert "each block's uniform attention" in left.get_title()
  assert "uniform attention (each block's)" in [t.get_text() for t in right.get_legend().get_texts()]
  marks = next(c for c in right.collections if c.get_label() == "uniform attention (each block's)")
  assert np.allclose([seg[0][1] for seg in marks.get_segments()], [10.0, 9.5, 20.0, 19.0])
  _check_readable(fig)


def test_attention_distance_comparison_names_every_model(tmp_path):
  rng = np.random.default_rng(1)
  models = [(list(rng.uniform(10, 100, (12, 12))), list(range(12)), "DINO-B/16", np.full(12, 110.0)),
            (list(rng.uniform(10, 60, (4, 3))), [0, 1, 2, 3], "ViT (demo)", np.full(4, 60.0)),
            ([rng.uniform(2, 9, 2), rng.uniform(5, 18, 4)], [0, 1], "Swin", np.array([10.0, 20.0]))]
  fig = _draw(plotting.attention_distance_compare, models, tmp_path=tmp_path)
  labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert labels == ["DINO-B/16", "ViT (demo)", "Swin", "uniform attention"]
  assert fig.axes[0].get_xlabel().startswith("relative depth")
  swin = fig.axes[0].get_lines()[2]  # each block's mean head over its own uniform distance
  assert np.allclose(swin.get_ydata(), [models[2][0][0].mean() / 10, models[2][0][1].mean() / 20])
  _check_readable(fig)


def test_skip_ratio_panels_titled_and_labelled(tmp_path):
  rng = np.random.default_rng(0)
  fig = _draw(plotting.skip_ratio, rng.uniform(0.5, 5, (3, 2, 17)), rng.uniform(-1, 1, (3, 2, 17)),
              1, 9, "ViT", [(rng.uniform(1, 2, 4), "R50"), (rng.uniform(1, 2, 5), "R101")],
              ["attn", "mlp"], tmp_path=tmp_path)
  panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
  assert len(panels) == 3 and all(ax.get_title() and ax.get_ylabel() for ax in panels)
  legend = [t.get_text() for t in panels[1].get_legend().get_texts()]
  assert legend == ["ViT CLS token", "ViT spatial tokens", "R50", "R101"]
  _check_readable(fig)


def test_receptive_fields_grid_without_waste_and_1x1_maps_labelled(tmp_path):
  assert plotting._columns([24]) == 8  # 3 full rows
  assert plotting._columns([10, 5]) == 5  # 2 + 1 rows, none empty
  rng = np.random.default_rng(0)
  grids = np.array([[8, 8], [4, 4], [1, 1]])
  fig = _draw(plotting.receptive_fields,
              [("ViT", [f"l{i}" for i in range(8)], rng.uniform(0, 1, (8, 32, 32)), np.tile([4, 4], (8, 1))),
               ("BiT", ["a", "b", "c"], rng.uniform(0, 1, (3, 32, 32)), grids)], tmp_path=tmp_path)
  titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
  assert sum("(1x1)" in t for t in titles) == 1
  assert "1x1" in fig._supxlabel.get_text()  # pylint: disable=protected-access
  shown = sum(1 for ax in fig.axes if ax.images)
  assert shown == 11 and len(fig.axes) <= 11 + 3  # at most a few empty cells
  assert not [t for t in _texts(fig) if t.get_fontsize() < 8]


def test_probe_and_reference_figures_readable(tmp_path):
  entry = {"points": ["block0/out", "block1/out"], "accuracy": [0.3, 0.6], "std_over_seeds": [0.01, 0.02]}
  fig = _draw(plotting.probe_depth, {"vit": {"cls": entry}}, {"vit": "ViT"}, "probes",
              tmp_path=tmp_path)
  assert len(fig.axes[0].collections) == 1 and "band" in fig.axes[0].get_legend().get_title().get_text()
  _check_readable(fig)
  fig = _draw(plotting.probe_depth, {"vit": {"cls": entry}}, {"vit": "ViT"}, "one seed", band=False,
              tmp_path=tmp_path)  # a spread over one seed says nothing: no band, none named
  assert not fig.axes[0].collections and "band" not in fig.axes[0].get_legend().get_title().get_text()
  fig = _draw(plotting.layer_lines, {"3%": (VIT, np.linspace(1, 0.4, len(VIT)))}, "CKA with 100%",
              "t", spread={"3%": np.full(len(VIT), 0.05)}, tmp_path=tmp_path)
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "1", "2", "3"]
  bands = [c for c in fig.axes[0].collections if isinstance(c, matplotlib.collections.PolyCollection)]
  assert fig.axes[0].get_ylabel() == "CKA with 100%" and len(bands) == 1
  _check_readable(fig)
  fig = _draw(plotting.localization, np.random.default_rng(0).uniform(0, 1, (16, 16)), (4, 4),
              [5, 10], "loc", tmp_path=tmp_path)
  _check_readable(fig)


def test_measure_maps_wrap_at_five_and_give_a_distance_its_own_scale(tmp_path):
  """Seven measures (one a distance) with their nulls: two rows of panels, five
  and two, none overlapping another or the figure's edge; similarities on the CKA scale, the distance from 0 to
  its largest value with the colour map reversed (alike is bright everywhere)."""
  rng = np.random.default_rng(3)
  names = [f"m{i}" for i in range(6)] + ["GULP distance"]
  maps = {m: rng.uniform(0, 3 if m.startswith("GULP") else 1, (len(BIT), len(VIT))) for m in names}
  nulls = {m: v[::-1] for m, v in maps.items()}
  fig = _draw(plotting.measure_maps, maps, BIT, VIT, row_label="BiT", col_label="ViT", title="t",
              nulls=nulls, distances=["GULP distance"], tmp_path=tmp_path)
  panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
  assert len(panels) == 7 * 2
  box = {ax.get_title(): ax.get_position() for ax in panels}
  assert len({round(b.x0, 6) for b in box.values()}) == 5 and len({round(b.y0, 6) for b in box.values()}) == 4
  assert box["m5"].x0 == box["m0"].x0 and box["m5"].y0 < box["m0 of the null (permuted)"].y0
  every = [ax.get_position() for ax in fig.axes]  # the colour bars too
  assert all(0 < b.x0 and b.x1 < 1 and 0 < b.y0 and b.y1 < 1 for b in every)
  assert not any(a.overlaps(b) for i, a in enumerate(every) for b in every[i + 1:])
  by_title = {ax.get_title(): ax.images[0] for ax in panels if ax.images}
  assert by_title["m0"].get_clim() == (0.0, 1.0) and by_title["m0"].get_cmap().name == "magma"
  top = max(float(maps["GULP distance"].max()), float(nulls["GULP distance"].max()))
  assert by_title["GULP distance"].get_clim() == (0.0, top)
  assert by_title["GULP distance"].get_cmap().name == "magma_r"
  assert by_title["GULP distance of the null (permuted)"].get_clim() == (0.0, top)
  _check_readable(fig)

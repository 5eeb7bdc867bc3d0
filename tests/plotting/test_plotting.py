"""Figures: every family drawn on small inputs is readable (no text under 8 pt),
titled and labelled; block ticks; the options passed in (format, colour scale), and
drawing that leaves matplotlib's session as it was (no pyplot, no backend, no rc)."""

from __future__ import annotations

import subprocess
import sys
import types

import matplotlib.text
import numpy as np
import pytest

from conftest import ROOT
from vitcnn_jax.plotting import attention
from vitcnn_jax.plotting import axes
from vitcnn_jax.plotting import cka
from vitcnn_jax.plotting import lines
from vitcnn_jax.plotting import localization
from vitcnn_jax.plotting import many_models
from vitcnn_jax.plotting import probes
from vitcnn_jax.plotting import receptive_field
from vitcnn_jax.plotting import skip_ratio
from vitcnn_jax.plotting import style

VIT = [f"block{b:02d}/{p}" for b in range(4) for p in ("ln1", "attn/out", "ln2", "mlp/hidden",
                                                         "mlp/out", "out")]
BIT = ["root/conv", "root/pool"] + [f"block{s}/unit{u:02d}/{p}" for s in (1, 2) for u in (1, 2)
                                    for p in ("conv1", "out")] + ["head/preact"]


def _draw(fn, *args, tmp_path, **kwargs):
  fig = fn(*args, path=str(tmp_path / "f.png"), figures=style.Figures(), **kwargs)
  assert (tmp_path / "f.png").stat().st_size > 1000
  return fig


def _texts(fig):
  return [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]


def _check_readable(fig):
  small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < 8]
  assert not small, f"text under 8 pt: {small[:5]}"
  for ax in fig.axes:
    if ax.get_label() == "<colorbar>" or not ax.axison:
      continue
    assert ax.get_title() or fig._suptitle is not None, "an untitled panel"
    assert ax.images or ax.get_xlabel() or ax.get_xticklabels(), "a plot with an unlabelled x axis"


def test_layer_groups_and_tick_text():
  assert axes.layer_groups(VIT[:8]) == [("block00", 0, 6), ("block01", 6, 8)]
  groups = axes.layer_groups(BIT)
  assert [g for g, _, _ in groups] == ["root", "block1/unit01", "block1/unit02", "block2/unit01",
                                       "block2/unit02", "head"]
  assert groups[1] == ("block1/unit01", 2, 4)
  assert [axes.tick_text(g) for g, _, _ in groups] == ["root", "1.1", "1.2", "2.1", "2.2", "head"]


def test_cka_heatmap_one_tick_per_block_and_colour_scale(tmp_path):
  m = np.random.default_rng(0).uniform(0.4, 1, (len(BIT), len(VIT)))
  fig = cka.heatmap(m, BIT, VIT, row_label="R", col_label="V", title="t", path=str(tmp_path / "c.png"),
                    figures=style.Figures(format="svg", vmin=0.4, vmax=1.0))
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


def test_options_are_checked_and_only_the_ones_passed_apply(tmp_path):
  with pytest.raises(ValueError, match="jpg"):
    style.Figures(format="jpg")
  with pytest.raises(ValueError, match="vmin"):
    style.Figures(vmin=1.0, vmax=0.5)
  args = (np.array([30.0, 60.0]), np.array([[0.5, 0.4], [0.3, 0.2]]), ["block1/unit01/out", "block2/unit01/out"],
          "ViT", "R50")
  attention.head_subsets(*args, str(tmp_path / "v.png"), style.Figures(format="pdf"))
  assert (tmp_path / "v.pdf").exists()
  fig = _draw(attention.head_subsets, *args, tmp_path=tmp_path)
  assert not (tmp_path / "f.pdf").exists()  # an earlier call's options do not linger
  assert fig.axes[0].get_legend() is not None
  _check_readable(fig)


def test_attention_distance_legend_and_integer_ticks(tmp_path):
  mean = list(np.random.default_rng(0).uniform(10, 100, (6, 4)))
  fig = _draw(attention.distances, mean, list(range(6)), None, "ViT", np.full(6, 110.0),
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
  fig = _draw(attention.distances, mean, [0, 1, 2, 3], None, "Swin",
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
  fig = _draw(attention.distances_compared, models, tmp_path=tmp_path)
  labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  assert labels == ["DINO-B/16", "ViT (demo)", "Swin", "uniform attention"]
  assert fig.axes[0].get_xlabel().startswith("relative depth")
  swin = fig.axes[0].get_lines()[2]  # each block's mean head over its own uniform distance
  assert np.allclose(swin.get_ydata(), [models[2][0][0].mean() / 10, models[2][0][1].mean() / 20])
  _check_readable(fig)


def test_skip_ratio_panels_titled_and_labelled(tmp_path):
  rng = np.random.default_rng(0)
  fig = _draw(skip_ratio.ratios, rng.uniform(0.5, 5, (3, 2, 17)), rng.uniform(-1, 1, (3, 2, 17)),
              1, 9, "ViT", [(rng.uniform(1, 2, 4), "R50"), (rng.uniform(1, 2, 5), "R101")],
              ["attn", "mlp"], tmp_path=tmp_path)
  panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
  assert len(panels) == 3 and all(ax.get_title() and ax.get_ylabel() for ax in panels)
  legend = [t.get_text() for t in panels[1].get_legend().get_texts()]
  assert legend == ["ViT CLS token", "ViT spatial tokens", "R50", "R101"]
  _check_readable(fig)


def test_receptive_fields_grid_without_waste_and_1x1_maps_labelled(tmp_path):
  assert receptive_field._columns([24]) == 8  # 3 full rows
  assert receptive_field._columns([10, 5]) == 5  # 2 + 1 rows, none empty
  rng = np.random.default_rng(0)
  grids = np.array([[8, 8], [4, 4], [1, 1]])
  fig = _draw(receptive_field.maps,
              [("ViT", [f"l{i}" for i in range(8)], rng.uniform(0, 1, (8, 32, 32)), np.tile([4, 4], (8, 1))),
               ("BiT", ["a", "b", "c"], rng.uniform(0, 1, (3, 32, 32)), grids)], tmp_path=tmp_path)
  titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
  assert sum("(1x1)" in t for t in titles) == 1
  assert "1x1" in fig._supxlabel.get_text()
  shown = sum(1 for ax in fig.axes if ax.images)
  assert shown == 11 and len(fig.axes) <= 11 + 3  # at most a few empty cells
  assert not [t for t in _texts(fig) if t.get_fontsize() < 8]


def test_probe_and_reference_figures_readable(tmp_path):
  entry = {"points": ["block0/out", "block1/out"], "accuracy": [0.3, 0.6], "std_over_seeds": [0.01, 0.02]}
  fig = _draw(probes.by_depth, {"vit": {"cls": entry}}, {"vit": "ViT"}, "probes",
              tmp_path=tmp_path)
  assert len(fig.axes[0].collections) == 1 and "band" in fig.axes[0].get_legend().get_title().get_text()
  _check_readable(fig)
  fig = _draw(probes.by_depth, {"vit": {"cls": entry}}, {"vit": "ViT"}, "one seed", band=False,
              tmp_path=tmp_path)  # a spread over one seed says nothing: no band, none named
  assert not fig.axes[0].collections and "band" not in fig.axes[0].get_legend().get_title().get_text()
  fig = _draw(lines.layer_lines, {"3%": (VIT, np.linspace(1, 0.4, len(VIT)))}, "CKA with 100%",
              "t", spread={"3%": np.full(len(VIT), 0.05)}, tmp_path=tmp_path)
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "1", "2", "3"]
  bands = [c for c in fig.axes[0].collections if isinstance(c, matplotlib.collections.PolyCollection)]
  assert fig.axes[0].get_ylabel() == "CKA with 100%" and len(bands) == 1
  _check_readable(fig)
  fig = _draw(localization.token_patches, np.random.default_rng(0).uniform(0, 1, (16, 16)), (4, 4),
              [5, 10], "loc", tmp_path=tmp_path)
  _check_readable(fig)


def test_measure_maps_wrap_at_five_and_give_a_distance_its_own_scale(tmp_path):
  """Seven measures (one a distance) with their nulls: two rows of panels, five
  and two, none overlapping another or the figure's edge, one colour bar beside each
  map and its null; similarities on the CKA scale, the distance from 0 to
  its largest value with the colour map reversed (alike is bright everywhere)."""
  rng = np.random.default_rng(3)
  names = [f"m{i}" for i in range(6)] + ["GULP distance"]
  maps = {m: rng.uniform(0, 3 if m.startswith("GULP") else 1, (len(BIT), len(VIT))) for m in names}
  nulls = {m: v[::-1] for m, v in maps.items()}
  fig = _draw(cka.measure_maps, maps, BIT, VIT, row_label="BiT", col_label="ViT", title="t",
              nulls=nulls, distances=["GULP distance"], tmp_path=tmp_path)
  panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
  assert len(panels) == 7 * 2
  box = {ax.get_title(): ax.get_position() for ax in panels}
  assert len({round(b.x0, 6) for b in box.values()}) == 5 and len({round(b.y0, 6) for b in box.values()}) == 4
  assert box["m5"].x0 == box["m0"].x0 and box["m5"].y0 < box["m0 of the null (permuted)"].y0
  bars = [ax.get_position() for ax in fig.axes if ax.get_label() == "<colorbar>"]
  assert len(bars) == 7  # a map and its null share a scale: one bar beside both
  null = box["m0 of the null (permuted)"]
  assert any(np.isclose(b.y0, null.y0) and np.isclose(b.y1, box["m0"].y1) and b.x0 > null.x1 for b in bars)
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


def test_the_jobs_figures_of_each_pair_read_their_arrays_by_tag(tmp_path):
  """The CKA job's figures: `cka_TAG.png` and `measures_TAG.png` per pair, a
  measure's maps found by its arrays' prefix, its score in the title of a pair of
  different models, its null below it where the arrays have one."""
  bit, vit = types.SimpleNamespace(label="BiT", names=BIT), types.SimpleNamespace(label="ViT", names=VIT)
  rng = np.random.default_rng(5)
  pairs = [("bit_vit", bit, vit), ("vit_vit", vit, vit)]
  arrays = {f"{p}_{t}": rng.uniform(0, 1, (len(a.names), len(b.names))) for t, a, b in pairs
            for p in ("cka", "gulp", "null_cka")}
  arrays.update(best_cka_bit_vit=rng.integers(0, len(VIT), len(BIT)),
                monotone_cka_bit_vit=np.sort(rng.integers(0, len(VIT), len(BIT))))
  figs = cka.heatmaps(pairs, arrays, "8 examples, 1 repeat", str(tmp_path), style.Figures(), only=["bit_vit"])
  assert [f.axes[0].get_title() for f in figs] == ["CKA: BiT vs ViT\n8 examples, 1 repeat"]
  shown = [cka.Measure("cka", "linear CKA", scores={"bit_vit": "0.500 [0.400, 0.600]"}),
           cka.Measure("gulp", "GULP distance", distance=True)]
  figs = cka.measures(pairs, arrays, shown, "8 examples, 1 repeat", str(tmp_path), style.Figures())
  assert sorted(p.name for p in tmp_path.glob("*.png")) == [
      "cka_bit_vit.png", "measures_bit_vit.png", "measures_vit_vit.png"]
  panels = {ax.get_title(): ax for ax in figs[0].axes if ax.get_label() != "<colorbar>"}
  assert list(panels) == ["linear CKA\nscore 0.500 [0.400, 0.600]", "linear CKA of the null (permuted)",
                          "GULP distance"]
  assert panels["GULP distance"].images[0].get_cmap().name == "magma_r"
  assert figs[1].get_suptitle() == "Similarity within ViT\n8 examples, 1 repeat"
  for fig in figs:  # the first with each row's matches and their legend
    _check_readable(fig)


def test_drawing_leaves_the_session_as_it_was(tmp_path):
  """A notebook's matplotlib stays the user's: importing every figure module and
  drawing imports no pyplot, chooses no backend and leaves every rc setting as it was;
  the figure still shows itself in a notebook (`_repr_png_`) whatever its backend."""
  code = ("import sys, matplotlib\n"
          "before = matplotlib.rcParams.copy()\n"
          "import numpy as np\n"
          "from vitcnn_jax.plotting import attention, axes, cka, lines, localization, probes, "
          "receptive_field, skip_ratio, style\n"
          "fig = cka.heatmap(np.eye(3), ['a', 'b', 'c'], ['a', 'b', 'c'], row_label='r', col_label='c', "
          f"title='t', path={str(tmp_path / 'h.png')!r}, figures=style.Figures())\n"
          "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
          "assert matplotlib.rcParams.copy() == before, 'an rc setting changed'\n"
          "assert fig._repr_png_().startswith(bytes([137]) + b'PNG'), 'no PNG for a notebook'\n"
          "assert matplotlib.rcParams.copy() == before, 'an rc setting changed on display'\n"
          "print(type(fig).__mro__[1].__name__, type(fig.canvas).__name__)\n")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == ["Figure", "FigureCanvasBase"]
  assert (tmp_path / "h.png").stat().st_size > 1000


@pytest.mark.parametrize("n", [3, 5, 12, 30])
def test_the_models_order_is_scipy_s_average_linkage_dendrogram(n):
  """Merges, heights and leaf order equal scipy's on random similarities (no
  ties); each link joins its two children's rows at its height."""
  from scipy.cluster import hierarchy
  rng = np.random.default_rng(n)
  for _ in range(5):
    x = rng.random((n, n))
    similar = (x + x.T) / 2
    np.fill_diagonal(similar, 1.0)
    apart = 1.0 - similar
    want = hierarchy.linkage(apart[np.triu_indices(n, 1)], method="average")
    got = many_models.average_linkage(apart)
    np.testing.assert_array_equal(np.asarray([m[:2] for m in got]), want[:, :2])
    np.testing.assert_allclose([m[2] for m in got], want[:, 2], rtol=8 * n * np.finfo(float).eps)
    leaves, links = many_models.order(similar)
    assert leaves == hierarchy.dendrogram(want, no_plot=True)["leaves"]
    assert [h[1] for h, _ in links] == [m[2] for m in got] and len(links) == n - 1
    assert all(rows[0] == rows[1] and rows[2] == rows[3] and rows[0] != rows[2] for _, rows in links)


def test_a_row_of_measures_without_nulls_has_no_null_row(tmp_path):
  """Measures with no null (the descriptive differences) in a row of their own:
  their interval widths sit right below their maps, as far below as a null's
  widths sit below the null, not a blank row further down."""
  rng = np.random.default_rng(4)
  names = [f"m{i}" for i in range(7)]
  maps = {m: rng.uniform(0, 1, (len(BIT), len(VIT))) for m in names}
  nulls = {m: maps[m][::-1] for m in names[:5]}
  widths = {m: rng.uniform(0, 0.1, (len(BIT), len(VIT))) for m in names}
  fig = _draw(cka.measure_maps, maps, BIT, VIT, row_label="BiT", col_label="ViT", title="t",
              nulls=nulls, widths=widths, tmp_path=tmp_path)
  box = {ax.get_title(): ax.get_position() for ax in fig.axes if ax.get_label() != "<colorbar>"}
  gap = lambda upper, width: box[upper].y0 - box[f"{width}: 95% interval width"].y1
  assert np.isclose(gap("m5", "m5"), gap("m0 of the null (permuted)", "m0"))
  assert box["m5"].y0 < box["m0: 95% interval width"].y0
  _check_readable(fig)

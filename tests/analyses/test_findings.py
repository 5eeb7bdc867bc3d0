"""Each analysis's checks of the paper's findings, on summaries made to show the
finding, to contradict it, and to leave it nothing to judge; and the report's
verdicts beside the paper's words."""

from __future__ import annotations

import json


from vitcnn_jax import analyses, report
from vitcnn_jax.run import declaration


def _verdicts(name: str, summary: dict) -> list:
  """Each finding's verdict: True / False (shown or not under every variant), its
  status where that is neither ("depends on ..."), None where it does not apply."""
  return [v if v is None else v.status if v.shown is None else v.shown
          for _, v in analyses.get(name).verdicts(summary)]


def _models(**kinds) -> dict:
  return {k: {"label": k.upper(), "attention": a, "tokens": t} for k, (a, t) in kinds.items()}


def test_cka_uniformity_and_lower_half():
  kinds = _models(vit=(True, True), resnet=(False, False))
  s = {"models": kinds, "mean_off_diagonal_cka": {"vit": 0.8, "resnet": 0.6},
       "lower_half_best_match": {"resnet_in_vit": 0.2}}
  assert _verdicts("cka", s) == [True, True]
  # A Swin (attention, no token grid) and a Mixer (tokens, no attention) are neither ViT nor CNN.
  mixed = dict(s, models=_models(vit=(True, True), resnet=(False, False), swin=(True, False),
                                 mixer=(False, True)),
               mean_off_diagonal_cka={"vit": 0.8, "resnet": 0.6, "swin": 0.9, "mixer": 0.3})
  assert _verdicts("cka", mixed) == [True, True]
  s.update(mean_off_diagonal_cka={"vit": 0.5, "resnet": 0.6}, lower_half_best_match={"resnet_in_vit": 0.6})
  assert _verdicts("cka", s) == [False, False]
  alone = {"models": _models(vit=(True, True)), "mean_off_diagonal_cka": {"vit": 0.8},
           "lower_half_best_match": {}}
  assert _verdicts("cka", alone) == [None, None]  # no ResNet to compare with


def test_cka_findings_under_the_layer_set_and_the_bootstrap_replicates():
  """The verdict on every captured layer, on the block outputs alone and over the
  bootstrap replicates: "depends on C" names the choice that splits it."""
  s = {"models": _models(vit=(True, True), resnet=(False, False)), "layer_set": "paper",
       "mean_off_diagonal_cka": {"vit": 0.66, "resnet": 0.58}, "lower_half_best_match": {"resnet_in_vit": 0.2},
       "block_outputs": {"mean_off_diagonal_cka": {"vit": 0.61, "resnet": 0.64},
                         "lower_half_best_match": {"resnet_in_vit": 0.25}}}
  assert _verdicts("cka", s) == ["depends on layers", True]
  judged = analyses.get("cka").verdicts(s)[0][1]
  assert [(k, status) for k, status, _ in judged.variants] == [
      ("layers=paper, sample=as drawn", "shown"), ("layers=blocks, sample=as drawn", "not shown")]
  assert judged.numbers == "VIT 0.660, RESNET 0.580"  # the run's own layer set
  # 48 of 50 replicates keep the ViT above: shown over the images (at least 95%); 45 do not.
  vit = [0.66] * 48 + [0.5] * 2
  s["block_outputs"]["mean_off_diagonal_cka"]["vit"] = 0.7
  s["bootstrap"] = {"findings": {"mean_off_diagonal_cka": {"vit": vit, "resnet": [0.58] * 50},
                                 "lower_half_best_match": {"resnet_in_vit": [0.2] * 50}}}
  assert _verdicts("cka", s) == [True, True]
  assert analyses.get("cka").verdicts(s)[0][1].variants[-1] == (
      "layers=paper, sample=bootstrap", "shown", "shown in 48 of 50 replicates")
  s["bootstrap"]["findings"]["mean_off_diagonal_cka"]["vit"] = [0.66] * 45 + [0.5] * 5
  assert _verdicts("cka", s) == ["depends on sample", True]
  s["block_outputs"]["mean_off_diagonal_cka"]["vit"] = 0.5
  assert _verdicts("cka", s)[0] == "depends on layers and sample"


def test_attention_local_and_global_heads():
  s = {"mean_distance_px": [[10.0, 70.0], [70.0, 75.0]], "uniform_ceiling_px": 80.0, "blocks": [0, 11]}
  assert _verdicts("attention_distance", s) == [True]
  s["mean_distance_px"] = [[70.0, 75.0], [70.0, 75.0]]  # no local head
  assert _verdicts("attention_distance", s) == [False]
  # A Swin: stages of 1 and 2 heads, each block read against its own window's uniform distance.
  swin = {"mean_distance_px": [[4.0], [9.0], [17.0, 18.0], [17.0, 18.0]],
          "uniform_ceiling_px": [10.0, 10.0, 20.0, 20.0], "blocks": [0, 1, 2, 3]}
  # The two lowest blocks have a local (4 < 5) and a global head (9 > 8); the lowest quarter,
  # block 0, has its one local head only.
  assert _verdicts("attention_distance", swin) == ["depends on blocks"]
  swin["mean_distance_px"][0] = [4.0, 9.0]
  assert _verdicts("attention_distance", swin) == [True]
  swin["mean_distance_px"][-1] = [15.0, 18.0]  # global against stage 0's window, not its own
  assert _verdicts("attention_distance", swin) == [False]


def test_attention_finding_reads_the_two_lowest_blocks_and_both_cls_conventions():
  """Block 0 all global, block 1 mixing a local and a global head (as the real
  DINOv2): shown, where a reading of block 0 alone would not; a local head that
  is local only because CLS mass counts as distance 0 makes it depend on the convention."""
  ceiling, blocks = 100.0, list(range(8))
  drop = [[85.0, 90.0], [30.0, 95.0]] + [[85.0, 92.0]] * 6
  s = {"mean_distance_px": drop, "uniform_ceiling_px": ceiling, "blocks": blocks, "cls": "drop",
       "prefix_tokens": ["cls"], "prefix_attention": [[0.1, 0.1], [0.6, 0.0]] + [[0.0, 0.0]] * 6}
  assert _verdicts("attention_distance", s) == [True]
  judged = analyses.get("attention_distance").verdicts(s)[0][1]
  assert judged.numbers.startswith("block 0: 85.0-90.0 px (uniform 100.0); block 1: 30.0-95.0 px")
  assert "block 6" in judged.numbers and "prefix tokens 10.0% in block 0" in judged.numbers
  s["mean_distance_px"] = [[85.0, 90.0]] + [[85.0, 92.0]] * 7  # no local head: not shown
  assert _verdicts("attention_distance", s) == [False]
  renormalized = [[85.0, 90.0], [75.0, 95.0]] + [[85.0, 92.0]] * 6  # the head's CLS mass spread out
  s.update(mean_distance_px=drop, mean_distance_px_by_cls={"drop": drop, "renormalize": renormalized})
  assert _verdicts("attention_distance", s) == ["depends on cls"]
  judged = analyses.get("attention_distance").verdicts(s)[0][1]
  assert [(k, status) for k, status, _ in judged.variants] == [
      ("cls=drop, blocks=two lowest and highest", "shown"),
      ("cls=renormalize, blocks=two lowest and highest", "not shown")]  # 8 blocks: two are a quarter


def test_head_subsets_correlation():
  s = {"subset_distance_px": [10.0, 20.0, 30.0], "cka": [[0.9, 0.8], [0.6, 0.5], [0.3, 0.2]]}
  assert _verdicts("head_subsets", s) == [True]
  s["cka"] = s["cka"][::-1]
  assert _verdicts("head_subsets", s) == [False]
  assert _verdicts("head_subsets", {"subset_distance_px": [5.0, 5.0], "cka": [[1.0], [1.0]]}) == [None]


def test_receptive_fields():
  vit = {"label": "ViT", "tokens": True, "stem": None, "token_pixels": 16,
         "half_mass_radius_px": [60.0, 70.0], "peak_offset_px": [3.0, 8.0]}
  res = {"label": "R50", "tokens": False, "stem": "root/conv", "token_pixels": None,
         "half_mass_radius_px": [2.0, 10.0, 40.0], "peak_offset_px": [0.0, 0.0, 0.0]}
  assert _verdicts("receptive_field", {"models": {"vit": vit, "resnet": res}}) == [True, True, True]
  res = {**res, "half_mass_radius_px": [2.0, 90.0, 1.0]}  # the stem is left out: first unit 90 px
  vit = {**vit, "peak_offset_px": [3.0, 50.0]}
  assert _verdicts("receptive_field", {"models": {"vit": vit, "resnet": res}}) == [False, False, False]


def test_skip_ratios():
  vit = {"label": "ViT", "tokens": True, "cls_ratio": [[9.0, 8.0], [1.0, 1.0]],
         "spatial_ratio": [[1.0, 1.0], [6.0, 7.0]]}
  res = {"label": "R50", "tokens": False, "ratio": [1.0, 1.2]}
  assert _verdicts("skip_ratio", {"models": {"vit": vit, "resnet": res}}) == [True, True]
  mixer = {"label": "Mixer", "tokens": True, "cls_ratio": None, "spatial_ratio": [[0.5, 0.5], [0.5, 0.5]]}
  assert _verdicts("skip_ratio", {"models": {"mixer": mixer, "resnet": res}}) == [None, False]


def test_ends_read_as_the_finding_and_by_parts():
  """A finding about lower and higher layers under each reading of its ends: the
  first against the last, and the means of the lowest and highest parts."""
  v = [3.0, 1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 2.0]
  assert declaration.ends(v, "first and last") == (3.0, 2.0)
  assert declaration.ends(v, "quarters") == (2.0, 3.5)
  assert declaration.ends(v, "thirds") == (2.0, 3.5) and declaration.ends([7.0], "thirds") == (7.0, 7.0)
  res = {"label": "R50", "tokens": False, "stem": None, "token_pixels": None, "half_mass_radius_px": v,
         "peak_offset_px": [0.0] * 8}
  assert _verdicts("receptive_field", {"models": {"resnet": res}})[2] == "depends on ends"
  # Sublayers: a middle where spatial tokens peak hides CLS above spatial in the first half;
  # the first and last thirds leave it out.
  cls, spatial = [5.0, 5.0, 0.5, 5.0, 0.5, 0.5], [1.0, 1.0, 9.0, 0.1, 1.0, 1.0]
  vit = {"label": "ViT", "tokens": True, "cls_ratio": cls, "spatial_ratio": spatial}
  assert _verdicts("skip_ratio", {"models": {"vit": vit}})[0] == "depends on parts"
  judged = analyses.get("skip_ratio").verdicts({"models": {"vit": vit}})[0][1]
  assert [(k, status) for k, status, _ in judged.variants] == [("parts=halves", "not shown"),
                                                              ("parts=thirds", "shown")]
  # Five sublayers: the halves, as the finding reads them, put the middle one in the second.
  vit = {**vit, "cls_ratio": [3.0, 3.0, 0.5, 1.3, 1.3], "spatial_ratio": [1.0, 1.0, 5.0, 1.2, 1.2]}
  judged = analyses.get("skip_ratio").verdicts({"models": {"vit": vit}})[0][1]
  assert [(k, status) for k, status, _ in judged.variants] == [("parts=halves", "shown"),
                                                              ("parts=thirds", "not shown")]
  assert judged.numbers == "ViT: CLS 3.00 / 1.03, spatial 1.00 / 2.47 (first / second half)"
  probes = {"models": {"vit": {"cls": {"accuracy": [0.5, 0.3, 0.6, 0.7, 0.8, 0.9, 0.9, 0.4]}}}}
  assert _verdicts("linear_probe", probes) == [None, "depends on ends"]  # no per-token probe: None
  # Spatial tokens below CLS at the last point, above it over the highest quarter.
  probes["models"]["vit"]["each"] = {"accuracy": [0.5, 0.3, 0.6, 0.7, 0.8, 0.9, 0.95, 0.38]}
  assert _verdicts("linear_probe", probes)[0] == "depends on ends"


def test_reference_cka():
  blocks = ["block00", "block01", "block02", "block03"]
  models = {"full": {"label": "full", "blocks": blocks, "without_skip": []},
            **{f"ns{b}": {"label": f"no skip {b}", "blocks": blocks, "without_skip": [blocks[b]]}
               for b in range(4)}}
  lines = {k: {"block00/out": 1.0, "block03/out": 0.9 if k == "full" else 0.7} for k in models}
  s = {"models": models, "reference": "full", "same_layer_cka": lines,
       "accuracy_drop_points": {"full": 0.0, "ns0": 1.0, "ns1": 4.0, "ns2": 2.0, "ns3": 0.5}}
  assert _verdicts("reference_cka", s) == [True, True]
  s["accuracy_drop_points"]["ns3"] = 9.0
  assert _verdicts("reference_cka", s) == [True, False]
  del s["accuracy_drop_points"]  # data scale, fine-tuning: no skip ablation
  assert _verdicts("reference_cka", s) == [True, None]


def test_localization_and_probes_and_pc_share():
  s = {"class_token": True, "own_patch_best_fraction": 0.9, "own_patch_cka_mean": 0.5, "layer": "b"}
  assert _verdicts("localization", s) == [True]
  assert _verdicts("localization", {**s, "class_token": False}) == [None]  # GAP: a cross-run finding
  probes = {"models": {"vit": {"cls": {"accuracy": [0.3, 0.8]}, "each": {"accuracy": [0.2, 0.1]}}}}
  assert _verdicts("linear_probe", probes) == [True, True]
  probes["models"]["vit"]["each"]["accuracy"] = [0.2, 0.9]
  assert _verdicts("linear_probe", probes) == [False, True]
  # Every probe at 99% or more (crops labelled by their photograph): nothing to rank.
  saturated = {"models": {"vit": {"cls": {"accuracy": [0.995, 1.0]}, "each": {"accuracy": [0.99, 1.0]}}}}
  assert _verdicts("linear_probe", saturated) == ["uninformative", "uninformative"]
  judged = analyses.get("linear_probe").verdicts(saturated)[1][1]
  assert judged.numbers.startswith("every probe at 99.0% or more: saturated") and "data.path" in judged.numbers
  # Crops labelled by their photograph (the packaged photographs): uninformative at any accuracy.
  photos = {**probes, "data": {"data": {"labels": "photographs"}, "test": {"labels": "photographs"}}}
  assert _verdicts("linear_probe", photos) == ["uninformative", "uninformative"]
  assert analyses.get("linear_probe").verdicts(photos)[0][1].numbers.startswith(
      "the labels are the photographs the images come from, not classes")
  assert _verdicts("linear_probe", {**probes, "data": {"data": {"labels": "classes"}}}) == [False, True]
  saturated["models"]["vit"]["each"]["accuracy"][0] = 0.98
  assert _verdicts("linear_probe", saturated) == [False, True]  # informative again: judged
  assert _verdicts("pc_share", {"models": {"v": {"label": "V", "share": [0.2, 0.7]}}}) == [True, None]
  # The dominant component inside a block, not at its output: shown on every layer, not on the outputs.
  blocks = {"models": {"v": {"label": "V", "share": [0.2, 0.7, 0.3], "block_outputs": [0, 2]}}}
  assert _verdicts("pc_share", blocks) == ["depends on layers", None]
  dropped = {"models": {"v": {"label": "V", "share": [0.2, 0.3]}}, "mean_off_diagonal_cka": {"v": 0.8},
             "mean_off_diagonal_cka_without": {"v": 0.6}}
  assert _verdicts("pc_share", dropped) == [False, True]
  dropped["mean_off_diagonal_cka_without"]["v"] = 0.85
  assert _verdicts("pc_share", dropped) == [False, False]


def test_a_summary_lacking_what_a_check_reads_is_not_judged():
  assert _verdicts("cka", {}) == [None, None]
  assert declaration.above({}, {"a": 1.0}) is None


def test_the_report_shows_each_verdict_beside_the_paper(tmp_path):
  import ml_collections
  (tmp_path / "att").mkdir()
  summary = {"mean_distance_px": [[10.0, 70.0], [70.0, 75.0]], "uniform_ceiling_px": 80.0,
             "blocks": [0, 11], "checkpoint": "x.npz"}
  (tmp_path / "att" / "attention_distance.json").write_text(json.dumps(summary))
  page = open(report.write(str(tmp_path), {"att": ml_collections.ConfigDict(
      {"analysis": "attention_distance"})}, "t")).read()
  assert "lower ViT blocks have both local and global heads" in page
  assert "<span class=yes>shown</span>" in page and "block 0: 10.0-70.0 px" in page

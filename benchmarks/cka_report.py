"""What the CKA benchmark prints and records: ours' lines (time, bound, accuracy,
compile phases), the table of every tool with its ratios to ours, workload W's
targets, and the `--json` record."""

from __future__ import annotations

import json
import os
import platform

from benchmarks import workload


def table(rows: list[dict]) -> list[str]:
  """One line per tool: time, time beyond the forward, peak, max |CKA - float64| (the
  unbiased minibatch CKA, which every tool computes; the same with the tool's own
  changes to it, see the notes; the biased one), ratios to ours (cold); where
  measured, a second call in the same process and the device's peak memory."""
  ours = rows[0]
  extra = any(r.get("second_s") is not None or r.get("device_peak_gib") for r in rows)
  lines = [f"{'tool':<17} | {'end to end':>10} | {'beyond fwd':>10} | {'peak GiB':>8} | "
           f"{'max |CKA - f64|':>15} | {'its formula':>11} | {'biased f64':>10} | {'e2e / ours':>10} | "
           f"{'beyond / ours':>13}" + (f" | {'2nd call':>8} | {'device GiB':>10}" if extra else "")]
  opt = lambda v, f: "-" if v is None else f.format(v)
  for r in rows:
    if "error" in r:
      lines.append(f"{r['tool']:<17} | not run: {r['error']}")
      continue
    r["e2e_ratio"] = r["end_to_end_s"] / ours["end_to_end_s"]
    r["beyond_ratio"] = r["beyond_forward_s"] / max(ours["beyond_forward_s"], 1e-9)
    own = opt(r.get("formula_err", r["max_abs_err"]), "{:.1e}")
    lines.append(f"{r['tool']:<17} | {r['end_to_end_s']:>8.1f} s | {r['beyond_forward_s']:>8.1f} s | "
                 f"{r['peak_gib']:>8.2f} | {opt(r['max_abs_err'], '{:.1e}'):>15} | {own:>11} | "
                 f"{opt(r.get('biased_err'), '{:.1e}'):>10} | {r['e2e_ratio']:>9.2f}x | "
                 f"{r['beyond_ratio']:>12.2f}x"
                 + (f" | {opt(r.get('second_s'), '{:.2f} s'):>8} | {opt(r.get('device_peak_gib'), '{:.2f}'):>10}"
                    if extra else ""))
  return lines


def ours_rows(cold: dict, warm: dict, ref: dict) -> list[dict]:
  """The table's rows of our cold and warm-cache runs."""
  rows = []
  for label, got in (("ours (cold)", cold), ("ours (warm cache)", warm)):
    rows.append(dict(tool=label, version=f"jax {got['jax']}", end_to_end_s=got["total_s"],
                     compile_s=got["compile_s"], steps_s=got["ours_s"], forward_s=got["forward_s"],
                     beyond_forward_s=got["total_s"] - got["forward_s"], peak_gib=got["peak_gib"],
                     max_abs_err=ref.get("max_abs_err"), reference="unbiased", estimator="unbiased",
                     second_s=got.get("second_s"), device_peak_gib=got.get("device_peak_gib"),
                     how="HSIC_1 of every layer pair, one sharded XLA step per minibatch (vitcnn_jax "
                     "driver.compile_pass of analyses.cka.CKA)", note=""))
  return rows


def print_ours(s: workload.Setup, cold: dict, warm: dict, ref: dict, dots_s: float) -> None:
  """Our runs: time, the FLOP bound and the Grams' at their own shapes (`dots_s`,
  `ours.part_gram_dots`), accuracy, device memory, compile phases, a second call."""
  bound = (cold["fwd_flops"] + cold["gram_flops"]) / cold["matmul_flops_per_s"]
  for label, got in (("ours (cold)", cold), ("ours (warm cache)", warm)):
    print(f"{label}: {got['total_s']:.1f} s end to end = compile {got['compile_s']:.1f} s + steps "
          f"{got['ours_s']:.1f} s; forward only {got['forward_s']:.1f} s; peak {got['peak_gib']:.2f} GiB; "
          f"{got['cache_entries']} programs in the compilation cache after it")
  print(f"lower bound: {bound:.1f} s = ({cold['fwd_flops'] / 1e9:.0f} forward + "
        f"{cold['gram_flops'] / 1e9:.0f} Gram GFLOP) / {cold['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s "
        f"-> ours' steps (compile excluded) / bound = {cold['ours_s'] / bound:.2f}x"
        + (" (target <= 1.15x)" if s.workload == "W" else ""))
  beyond, grams_s = cold["ours_s"] - cold["forward_s"], cold["gram_flops"] / cold["matmul_flops_per_s"]
  print(f"the Grams' bound at their own shapes: {dots_s:.1f} s, one bare (batch, D) x (D, batch) "
        f"dot a point at each captured point's D -> ours' steps beyond the forward (compile excluded), "
        f"{beyond:.1f} s, / that = {beyond / dots_s:.2f}x; / the FLOP bound's Grams, {grams_s:.1f} s, = "
        f"{beyond / grams_s:.2f}x" + (" (target <= 2x)" if s.workload == "W" else ""))
  if ref:
    print(f"accuracy: max |CKA - float64 reference| = {ref['max_abs_err']:.2e}"
          + (" (target <= 1e-5)" if s.workload == "W" else ""))
  if cold.get("device_peak_gib") is not None:
    print(f"ours' peak {s.device} memory: {cold['device_peak_gib']:.2f} GiB (JAX's allocator)")
  print(f"ours' compile in a new process with the cache: {warm['compile_s']:.1f} s = "
        f"{warm['compile_s'] / max(cold['compile_s'], 1e-9):.0%} of the first process's {cold['compile_s']:.1f} s"
        + (" (target <= 25%)" if s.workload == "W" else ""))
  for label, got in (("cold", cold), ("warm cache", warm)):
    print(f"ours' compile ({label}), JAX's events: " + ", ".join(
        f"{k} {v:.2f} s" for k, v in sorted(got.get("compile_phases", {}).items(), key=lambda kv: -kv[1])))
  if cold.get("second_s") is not None:
    print(f"ours, a second call in the same process (compiled step reused): {cold['second_s']:.2f} s "
          f"(its sums {cold['second_diff']:.1e} from the first's, relative)")


def print_peer(r: dict) -> None:
  """A peer's line as it finishes: its time, forward, peak, or why it did not run."""
  print(f"{r['tool']}: " + (f"not run: {r['error']}" if "error" in r else
                            f"{r['end_to_end_s']:.1f} s, forward only {r['forward_s']:.1f} s, peak "
                            f"{r['peak_gib']:.2f} GiB" + _device_parts(r)), flush=True)


def _device_parts(r: dict) -> str:
  """A peer's second call and device peak, where measured."""
  out = f", a second call {r['second_s']:.2f} s" if r.get("second_s") is not None else ""
  return out + (f", peak device memory {r['device_peak_gib']:.2f} GiB" if r.get("device_peak_gib") else "")


def print_notes(rows: list[dict]) -> None:
  """Under the table: what each peer computes, its version and its notes."""
  for r in rows[2:]:
    print(f"  {r['tool']}" + (f" {r['version']}" if "version" in r else "") + f": {r['how']}"
          + (f"; {r['note']}" if r.get("note") else ""))


def print_targets(rows: list[dict]) -> None:
  """Workload W's targets against torch-cka, end to end with our compile included."""
  tc = next((r for r in rows if r["tool"] == "torch-cka" and "error" not in r), None)
  if tc is None:
    return
  cold, warm = rows[0], rows[1]
  theirs, steady = tc["beyond_forward_s"], cold["steps_s"] - cold["forward_s"]
  ratio = lambda ours: f"{theirs / max(ours, 1e-9):.1f}x"
  print(f"CKA overhead beyond the forward passes, torch-cka ({theirs:.1f} s) / ours: "
        f"{ratio(cold['beyond_forward_s'])} with our compile ({cold['beyond_forward_s']:.1f} s), "
        f"{ratio(warm['beyond_forward_s'])} with a warm cache ({warm['beyond_forward_s']:.1f} s), "
        f"{ratio(steady)} without it ({steady:.1f} s) (target >= 40x)")
  print(f"end to end, compile included: torch-cka / ours = {tc['end_to_end_s'] / cold['end_to_end_s']:.1f}x; "
        f"{tc['end_to_end_s'] / warm['end_to_end_s']:.1f}x with a warm cache (target >= 5x)")


def write_record(s: workload.Setup, cold: dict, rows: list[dict], path: str, runs: dict[str, list[dict]],
                 dots_s: float) -> None:
  """The run's settings, machine, rows and each tool's end-to-end time by round as json at `path` (`--json`)."""
  record = dict(workload=s.workload, images=s.images, batch=s.batch, size=s.size,
                layers=[cold["layers_x"], cold["layers_y"]], cpu_cores=os.cpu_count(),
                machine=platform.processor() or platform.machine(), python=platform.python_version(),
                bound_s=(cold["fwd_flops"] + cold["gram_flops"]) / cold["matmul_flops_per_s"],
                gram_dots_s=dots_s,
                matmul_flops_per_s=cold["matmul_flops_per_s"], rows=rows,
                end_to_end_by_round={k: [x.get("total_s") for x in v] for k, v in runs.items()})
  with open(path, "w") as f:
    json.dump(record, f, indent=1)

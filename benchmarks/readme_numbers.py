r"""The README's measured demo numbers, regenerated from runs at one commit.

  .venv/bin/python -m benchmarks.readme_numbers all WORKDIR   # run, every bench recorded, write
  .venv/bin/python -m benchmarks.readme_numbers run WORKDIR   # the runs, then collect (~30 min fresh)
  .venv/bin/python -m benchmarks.readme_numbers collect WORKDIR   # their json -> RESULTS
  .venv/bin/python -m benchmarks.readme_numbers real WORKDIR  # the real report (`make real` first)
  .venv/bin/python -m benchmarks.readme_numbers bench NAME [ARGS]   # a benchmark's output -> RESULTS
  .venv/bin/python -m benchmarks.readme_numbers suite             # `make test`, timed -> RESULTS
  .venv/bin/python -m benchmarks.readme_numbers device FILE COMMAND   # an accelerator run -> RESULTS
  .venv/bin/python -m benchmarks.readme_numbers write             # RESULTS -> README blocks
  .venv/bin/python -m benchmarks.readme_numbers check             # exit 1 if the README drifted

`run` runs the demo report (`configs/report.py:demo`) and the demo variants the
README quotes beside it (EXTRAS) into WORKDIR, timing each; `collect` reads
their json files and writes RESULTS (`benchmarks/readme_numbers.json`, committed:
the commit, machine and date they were measured on, each section's findings
with this run's verdict and numbers, key numbers, and the tables' rows);
`bench` runs `python -m benchmarks.NAME ARGS` and records its output the same way,
for the block `bench-NAME-ARGS` (e.g. `bench-paper-scale` for the PLAN lines);
`suite` runs `make test` (run it alone on the machine, on a fresh clone) and
records its time, pytest's own and the slowest tests, for the block `test-suite`;
`real` runs `configs/report.py:real` (the real pretrained pair on the offline
photographs) into WORKDIR/real_report, timed, records its findings and key
numbers for the blocks `real-findings` and `real-key-numbers`, and copies its
figures that the README shows (REAL_FIGURES) into `benchmarks/real_figures/`;
`device` records the file `python -m benchmarks.accelerator --json FILE` wrote on a
machine with an accelerator (COMMAND: how it was run there), for the block
`accelerator` (`all` leaves it as it is: this machine may have none);
`all` does `run`, then `bench` again for every benchmark RESULTS holds, then
`write`. `write` rewrites every block of the README between `<!-- numbers:NAME -->` and
`<!-- /numbers:NAME -->` from RESULTS alone. `tests/project/test_readme.py` runs `check`,
so a change to a marked block without RESULTS (or the reverse) fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

from benchmarks import accelerator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")


def pages() -> list[str]:
  """The files whose marked blocks this writes: the README and every page of docs/."""
  return [README] + sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))
RESULTS = os.path.join(ROOT, "benchmarks", "readme_numbers.json")
REPORT = "report"
# Demo variants the README quotes that the report does not run: (config, variant).
EXTRAS = (("localization", "demo_gap"), ("cka_vit_resnet", "demo_mixer"),
          ("linear_probe", "demo_mixer"), ("data_scale", "demo_finetune"))
CODE = ("vitcnn_jax", "configs", "main.py", "requirements.txt")  # what the numbers depend on
BENCHMARKS = os.path.join("benchmarks", "*.py")  # and a benchmark's: its module and the ones it shares
REAL_REPORT = "real_report"
# The real report's figures the README shows: (section, file), copied into REAL_FIGURES_DIR.
REAL_FIGURES = (("cka", "cka_vit_vit.png"), ("cka", "cka_resnet_resnet.png"),
                ("cka", "cka_resnet_vit.png"), ("attention_distance", "attention_distance.png"),
                ("receptive_field", "receptive_field.png"), ("skip_ratio", "skip_ratio_vit.png"),
                ("localization", "localization.png"), ("layerwise_probe", "linear_probe.png"))
REAL_FIGURES_DIR = os.path.join(ROOT, "benchmarks", "real_figures")
BLOCK = re.compile(r"(<!-- numbers:(\w[\w-]*) -->\n)(.*?)(<!-- /numbers:\2 -->)", re.S)


# --- run and collect ------------------------------------------------------------------


def _main_py(config: str, workdir: str) -> float:
  """Seconds of one `main.py` run, which must succeed."""
  t = time.perf_counter()
  subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), f"--config={config}",
                  f"--workdir={workdir}"], cwd=ROOT, check=True)
  return time.perf_counter() - t


def run(workdir: str) -> None:
  """The report and the extras, timed; a second report run times the reuse."""
  from vitcnn_jax import fileio
  cache = os.path.expanduser(fileio.CACHE_DIR)
  cached = sorted(f for f in os.listdir(cache) if f.endswith(".npz")) if os.path.isdir(cache) else []
  measured = _measured()  # before the runs: the code they ran
  times = {"report": _main_py("configs/report.py:demo", os.path.join(workdir, REPORT)),
           "report again (every section reused)":
               _main_py("configs/report.py:demo", os.path.join(workdir, REPORT))}
  times["make demo's job, models cached"] = _main_py("configs/cka_vit_resnet.py:demo",
                                                     os.path.join(workdir, "cka_demo"))
  for config, variant in EXTRAS:
    times[f"{config}:{variant}"] = _main_py(f"configs/{config}.py:{variant}",
                                            os.path.join(workdir, f"{config}_{variant}"))
  with open(os.path.join(workdir, "times.json"), "w") as f:
    json.dump({"seconds": times, "demo models cached before": cached, "measured": measured}, f,
              indent=1)
  collect(workdir)


def _machine() -> str:
  model = ""
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
  import jax
  return (f"{len(os.sched_getaffinity(0))} CPU cores ({model or platform.processor() or platform.machine()}), "
          f"jax {jax.__version__}, Python {platform.python_version()}")


def _summary(folder: str) -> tuple[str, dict]:
  """The analysis of a run's folder and its json summary."""
  from vitcnn_jax import analyses
  for name in analyses.names():
    path = os.path.join(folder, f"{name}.json")
    if os.path.exists(path):
      with open(path) as f:
        return name, json.load(f)
  raise FileNotFoundError(f"{folder} holds no analysis json: run `{sys.argv[0]} run` first.")


def _section(folder: str) -> dict:
  """What the README shows of one run: findings with verdicts, key numbers."""
  from vitcnn_jax import analyses
  name, s = _summary(folder)
  declared = analyses.get(name)
  findings = [{"text": f.text, "verdict": None if v is None else v.status,
               "numbers": "" if v is None else v.numbers,
               "variants": [] if v is None else [list(x) for x in v.variants]}
              for f, v in declared.verdicts(s)]
  return {"analysis": name, "figures": declared.figures, "findings": findings,
          "key_numbers": declared.key_numbers(s), "tables": tables(name, s)}


def _measured(*paths: str) -> dict:
  """Where and when: the commit, marked "+changes" if the code that makes the
  numbers (`CODE` and `paths`) differed from it, the date and the machine."""
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
  dirty = subprocess.run(["git", "status", "--porcelain", "--", *CODE, *paths], cwd=ROOT,
                         capture_output=True, text=True).stdout.strip()
  return {"commit": commit + ("+changes" if dirty else ""), "date": datetime.date.today().isoformat(),
          "machine": _machine()}


def _record(part: str, value: dict) -> None:
  """RESULTS with `part` replaced (the others kept), written atomically."""
  out = {}
  if os.path.exists(RESULTS):
    with open(RESULTS) as f:
      out = json.load(f)
  out[part] = value
  with open(RESULTS + ".tmp", "w") as f:
    json.dump(out, f, indent=1)
  os.replace(RESULTS + ".tmp", RESULTS)
  print(f"Wrote {part} to {RESULTS}")


def collect(workdir: str) -> None:
  from configs import report as report_config
  with open(os.path.join(workdir, "times.json")) as f:
    times = json.load(f)
  from vitcnn_jax import fileio
  cache = os.path.expanduser(fileio.CACHE_DIR)
  trained = {}
  for f in sorted(os.listdir(cache)):
    if f.endswith(".json"):  # a demo training's record, beside its npz
      with open(os.path.join(cache, f)) as g:
        t = json.load(g)
      if "test_accuracy" in t:
        trained[f.rsplit("-", 1)[0]] = {k: t.get(k) for k in ("test_accuracy", "steps", "test_data")}
  _record("demo", {**(times.pop("measured", None) or _measured()), "times": times, "trained": trained,
                   "report": {sec: _section(os.path.join(workdir, REPORT, sec))
                              for sec in report_config.sections()},
                   "extras": {f"{c}:{v}": _section(os.path.join(workdir, f"{c}_{v}"))
                              for c, v in EXTRAS}})


def bench(args: list[str]) -> None:
  """A benchmark's output (`python -m benchmarks.NAME ARGS`), timed, into RESULTS."""
  measured, t = _measured(BENCHMARKS), time.perf_counter()
  command = ["python", "-m", f"benchmarks.{args[0]}", *args[1:]]
  lines = []
  with subprocess.Popen([sys.executable, *command[1:]], cwd=ROOT, stdout=subprocess.PIPE, text=True) as p:
    for line in p.stdout:  # shown as it comes: these run for minutes
      print(line, end="", flush=True)
      lines.append(line.rstrip("\n"))
  if p.returncode:
    raise SystemExit(f"benchmarks.{args[0]} failed (exit {p.returncode}); nothing recorded.")
  _record(bench_key(args), {**measured, "command": " ".join(command), "seconds": time.perf_counter() - t,
                            "lines": lines})


def suite() -> None:
  """`make test` timed: the whole command, and pytest's summary and slowest tests
  (`--durations` in the Makefile), into RESULTS. Reported, never asserted."""
  measured, t = _measured("tests", "Makefile"), time.perf_counter()
  lines = []
  with subprocess.Popen(["make", "test"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True) as p:
    for line in p.stdout:
      print(line, end="", flush=True)
      lines.append(line.rstrip("\n"))
  if p.returncode:
    raise SystemExit(f"make test failed (exit {p.returncode}); nothing recorded.")
  summary = next(line for line in reversed(lines) if re.search(r"\d+ passed.* in [\d.]+s", line))
  slowest = [line for line in lines if re.match(r"[\d.]+s (setup|call|teardown) ", line)]
  _record("suite", {**measured, "command": "make test", "seconds": time.perf_counter() - t,
                    "pytest": summary.strip("= "), "slowest": slowest})


def device(path: str, command: str) -> None:
  """An accelerator run's record (`benchmarks.accelerator --json`), or the log of a
  `benchmarks/gpu.sh` stage (a .txt file: block `device-NAME`), stamped with this
  checkout's commit (the code the run was sent with) and its device, into RESULTS."""
  if path.endswith(".txt"):
    return device_log(path, command)
  with open(path) as f:
    record = json.load(f)
  measured = _measured(BENCHMARKS)
  measured["machine"] = f"{record['devices']} x {record['device']} ({record['backend']}), jax {record['jax']}"
  _record("accelerator", {**measured, "command": command, "lines": accelerator.report_lines(record),
                          "record": record})


def device_log(path: str, command: str) -> None:
  """A `gpu.sh` stage's log: its lines (progress bars left out), the machine read
  from its environment lines."""
  with open(path) as f:
    lines = [line.rstrip("\n") for line in f if "\r" not in line and not re.search(r"\d+it/s|step/s", line)]
  gpu = next((line.split(",")[0] for line in lines if line.startswith("NVIDIA")), None)
  jax_version = next((line.split()[1] for line in lines if line.startswith("jax ")), None)
  if not gpu or not jax_version:
    raise SystemExit(f"{path}: no 'NVIDIA ...' and 'jax X' environment lines (gpu.sh's first step).")
  measured = _measured(BENCHMARKS, os.path.join("benchmarks", "gpu.sh"))
  measured["machine"] = f"1 x {gpu}, jax {jax_version}"
  name = os.path.basename(path).removesuffix(".txt")
  _record(f"device-{name}", {**measured, "command": command, "lines": lines})


def bench_key(args: list[str]) -> str:
  """`paper_scale --groups 1,4` -> "bench-paper-scale-groups-1-4": its block's name."""
  return "bench-" + re.sub(r"[^a-z0-9]+", "-", " ".join(args).lower()).strip("-")


# --- the analyses' tables -------------------------------------------------------------


def tables(name: str, s: dict) -> dict[str, list[list[str]]]:
  """Rows (header first) of the README's tables of one analysis's summary."""
  if name == "linear_probe":
    rows = [[f"{k}: {how}", *(f"{100 * a:.1f}" for a in v["accuracy"])]
            for k, hows in s["models"].items() for how, v in hows.items() if "accuracy" in v]
    width = max(len(r) for r in rows) - 1
    return {"accuracy (%) per captured point": [["model: features", *map(str, range(1, width + 1))],
                                                *rows]}
  if name == "reference_cka":
    ref, acc = s["models"][s["reference"]]["label"], s.get("accuracy", {})
    head = ["model", *(["top-1 (%)", f"drop from {ref} (points)"] if acc else []),
            f"CKA with {ref}, block outputs"]
    rows = []
    for k, m in s["models"].items():
      same = s["same_layer_cka"].get(k, {})
      outs = [v for layer, v in same.items() if re.fullmatch(r"block\d+/out", layer)] or list(same.values())
      rows.append([m["label"], *([f"{100 * acc[k]:.2f}", f"{s['accuracy_drop_points'][k]:.2f}"] if acc else []),
                   ", ".join(f"{v:.2f}" for v in outs)])
    return {"per model": [head, *rows]}
  return {}


# --- write and check ------------------------------------------------------------------


def real(workdir: str) -> None:
  """The real report, timed; its findings and key numbers into RESULTS, its
  README figures into REAL_FIGURES_DIR."""
  import shutil
  from configs import report as report_config
  measured = _measured()
  folder = os.path.join(workdir, REAL_REPORT)
  seconds = _main_py("configs/report.py:real", folder)
  os.makedirs(REAL_FIGURES_DIR, exist_ok=True)
  for sec, name in REAL_FIGURES:
    shutil.copyfile(os.path.join(folder, sec, name), os.path.join(REAL_FIGURES_DIR, f"{sec}_{name}"))
  _record("real", {**measured, "seconds": seconds,
                   "report": {sec: _section(os.path.join(folder, sec))
                              for sec in report_config.sections(real=True)}})


def _findings_table(report: dict) -> str:
  rows = [["section", "paper", "the paper's finding (our words)", "this run", "numbers", "under each variant"]]
  for sec, e in report.items():
    for f in e["findings"]:
      variants = "; ".join(f"{k}: {status}" for k, status, _ in f.get("variants", [])) or "-"
      rows.append([sec, e["figures"], f["text"].replace("|", "/"),
                   f["verdict"] or "does not apply", f["numbers"].replace("|", "/") or "-", variants])
  return _md_table(rows)


def _md_table(rows: list[list[str]]) -> str:
  head, *body = rows
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def _stamp(r: dict) -> str:
  return f"Measured at commit `{r['commit']}` on {r['date']}, {r['machine']}"


def _demo_blocks(r: dict) -> dict[str, str]:
  keys = [f"- `{sec}` ({e['analysis']}): " + "; ".join(f"{k} {v}" for k, v in e["key_numbers"])
          for part in ("report", "extras") for sec, e in r[part].items()]
  cached = r["times"]["demo models cached before"]
  times = [f"- `{k}`: {v:.0f} s" for k, v in r["times"]["seconds"].items()]
  trained = [f"- `{k}`: {100 * t['test_accuracy']:.1f}% test accuracy after {t['steps']} steps"
             for k, t in r["trained"].items()]
  out = {
      "demo-findings": f"*{_stamp(r)}:*\n\n" + _findings_table(r["report"]),
      "demo-key-numbers": f"*{_stamp(r)}:*\n\n" + "\n".join(keys),
      "demo-times": f"*{_stamp(r)}" + (
          f"; demo models already in the cache: {', '.join(cached)}*" if cached else
          "; the model cache was empty, so the first report run trained every demo model*")
      + "\n\n" + "\n".join(times),
      "demo-models": f"*{_stamp(r)}:*\n\n" + "\n".join(trained),
  }
  for part in ("report", "extras"):
    for sec, e in r[part].items():
      for title, rows in e["tables"].items():
        out[f"table-{re.sub(r'[^a-z0-9]+', '-', sec)}"] = (
            f"*{_stamp(r)}; `{sec}`, {title}:*\n\n{_md_table(rows)}")
  return out


def blocks(r: dict) -> dict[str, str]:
  """The text of each marked block, from RESULTS."""
  out = _demo_blocks(r["demo"]) if "demo" in r else {}
  for key, e in r.items():
    if key.startswith("bench-"):
      out[key] = (f"*{_stamp(e)}; `{e['command']}` took {e['seconds'] / 60:.1f} min:*\n\n```\n"
                  + "\n".join(e["lines"]) + "\n```")
  if "real" in r:
    e = r["real"]
    stamp = f"*{_stamp(e)}; `configs/report.py:real` took {e['seconds'] / 60:.0f} min"
    out["real-findings"] = f"{stamp}:*\n\n" + _findings_table(e["report"])
    out["real-key-numbers"] = f"{stamp}:*\n\n" + "\n".join(
        f"- `{sec}` ({s['analysis']}): " + "; ".join(f"{k} {v}" for k, v in s["key_numbers"])
        for sec, s in e["report"].items())
  for key, e in r.items():
    if key.startswith("device-"):
      out[key] = f"*{_stamp(e)}; `{e['command']}`:*\n\n```\n" + "\n".join(e["lines"]) + "\n```"
  if "accelerator" in r:
    e = r["accelerator"]
    out["accelerator"] = f"*{_stamp(e)}; `{e['command']}`:*\n\n```\n" + "\n".join(e["lines"]) + "\n```"
  if "suite" in r:
    e = r["suite"]
    out["test-suite"] = (f"*{_stamp(e)}, alone on the machine: `{e['command']}` took "
                         f"{e['seconds'] / 60:.1f} min in all; pytest: {e['pytest']}. Its slowest "
                         f"tests:*\n\n```\n" + "\n".join(e["slowest"]) + "\n```")
  return out


def rewrite(text: str, made: dict[str, str], page: str = "README.md") -> str:
  """`text` with each marked block's body replaced; a marker RESULTS cannot fill is an error."""
  unknown = [m[2] for m in BLOCK.finditer(text) if m[2] not in made]
  if unknown:
    raise KeyError(f"{page}: blocks {unknown} have no numbers in {RESULTS}; blocks: {sorted(made)}.")
  return BLOCK.sub(lambda m: f"{m[1]}{made[m[2]]}\n{m[4]}", text)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("command", choices=("all", "run", "collect", "real", "bench", "suite",
                                          "device", "write", "check"))
  parser.add_argument("workdir", nargs="?", default="workdir/readme_numbers",
                      help="run, collect: the runs' folder; bench: the benchmark's NAME; device: the record")
  parser.add_argument("script_args", nargs=argparse.REMAINDER,
                      help="bench: its arguments; device: the command that ran it")
  args = parser.parse_args()
  if args.command == "all":
    with open(RESULTS) as f:
      commands = [e["command"].split() for k, e in json.load(f).items() if k.startswith("bench-")]
    run(args.workdir)
    for _, _, module, *rest in commands:  # python -m benchmarks.NAME ARGS
      bench([module.removeprefix("benchmarks."), *rest])
  elif args.command == "run":
    run(args.workdir)
  elif args.command == "collect":
    collect(args.workdir)
  elif args.command == "real":
    real(args.workdir)
  elif args.command == "bench":
    bench([args.workdir, *args.script_args])
  elif args.command == "suite":
    suite()
  elif args.command == "device":
    device(args.workdir, " ".join(args.script_args))
  with open(RESULTS) as f:
    made = blocks(json.load(f))
  texts = {}
  for page in pages():
    with open(page) as f:
      texts[page] = f.read()
  new = {page: rewrite(text, made, os.path.relpath(page, ROOT)) for page, text in texts.items()}
  drifted = [os.path.relpath(p, ROOT) for p in texts if new[p] != texts[p]]
  if args.command == "check":
    if drifted:
      print(f"The marked blocks of {', '.join(drifted)} differ from {RESULTS}: run "
            "`python -m benchmarks.readme_numbers write` (or `run` to measure again).")
      return 1
    print("The marked blocks of the README and docs/ match", RESULTS)
    return 0
  for page in drifted:
    path = os.path.join(ROOT, page)
    with open(path + ".tmp", "w") as f:
      f.write(new[path])
    os.replace(path + ".tmp", path)
  print(f"Rewrote {sum(len(BLOCK.findall(t)) for t in new.values())} blocks of {len(new)} pages "
        f"({', '.join(drifted) or 'none changed'})")
  return 0


if __name__ == "__main__":
  sys.exit(main())

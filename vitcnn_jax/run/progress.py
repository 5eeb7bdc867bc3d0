"""Progress bars with examples/s for long loops (tqdm ships with tensorflow-datasets)."""

from __future__ import annotations

import time

import tqdm


class Bar:
  """Steps done out of `total`, plus throughput in examples per second."""

  def __init__(self, total: int, desc: str, enabled: bool = True, initial: int = 0):
    self.bar = tqdm.tqdm(total=total, desc=desc, initial=initial, disable=not enabled,
                         unit="step", dynamic_ncols=True)
    self.start, self.examples = time.time(), 0

  def update(self, steps: int, examples: int) -> None:
    self.examples += examples
    rate = self.examples / max(time.time() - self.start, 1e-9)
    self.bar.set_postfix_str(f"{rate:,.1f} examples/s", refresh=False)
    self.bar.update(steps)

  def close(self) -> None:
    self.bar.close()

  def __enter__(self) -> "Bar":
    return self

  def __exit__(self, *exc) -> None:  # closed on errors too, so a traceback is not cut
    self.close()

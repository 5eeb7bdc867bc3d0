"""Compiled programs (`run/programs`): how a step is compiled."""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np

from vitcnn_jax.run import programs


def test_the_cycle_collector_is_paused_while_a_step_compiles_and_left_as_it_was():
  """Tracing a large step starts full collections over the whole process (W: 0.11
  s of a 0.8 s trace); the collector is off while it compiles, then as the caller
  had it, also where compiling fails."""
  seen = []

  def make(prescale):
    def step(x):
      seen.append(gc.isenabled())
      if x.shape[0] == 0:
        raise ValueError("no rows")
      return x * 2
    return jax.jit(step)

  try:
    for enabled in (True, False):
      gc.enable() if enabled else gc.disable()
      step = programs.Step(make, None)
      np.testing.assert_array_equal(step(jnp.ones(3)), 2 * np.ones(3))
      assert gc.isenabled() is enabled
      try:
        step(jnp.ones(0))
      except ValueError:
        pass
      assert gc.isenabled() is enabled
  finally:
    gc.enable()
  assert seen == [False] * 4, seen

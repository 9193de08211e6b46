"""DAdaQuant: the client-adaptive levels against the optimisation problems of
the paper's Theorem 1 and Lemma 4 (solved numerically with SciPy, not by the
closed form) and a NumPy transcription of the closed form; the time-adaptive
doubling against loss sequences worked out by hand; resume from a JSON round
trip of the state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import optimize

from fedsim.config.typed import parse
from fedsim.control import CONTROLLERS
from fedsim.control.dadaquant import client_levels
from tests.control.views import client, knob, view

EXAMPLES = [12, 40, 7, 95, 33]


def _controller(**params):
  entry = CONTROLLERS.get("dadaquant")
  return entry.build(parse(entry.params, params, "bits"))


def _weights():
  n = np.array(EXAMPLES, dtype=float)
  return n / n.sum()


def _variance(w, q):  # the paper's model of Var(sum_k w_k Q_{q_k}(x_k)), up to a constant
  return np.sum(w ** 2 / np.asarray(q) ** 2)


@pytest.mark.filterwarnings("ignore:Values in x were outside bounds")
@pytest.mark.parametrize("q", [1.0, 4.0, 15.0])
def test_equal_variance_levels_minimise_communication(q):
  w = _weights()
  got = np.array(client_levels(q, list(w), "variance"))
  # min sum q_k  s.t.  sum w_k^2 / q_k^2 = sum w_k^2 / q^2, solved numerically.
  target = _variance(w, np.full_like(w, q))
  solved = optimize.minimize(
      np.sum, np.full_like(w, q), method="SLSQP", bounds=[(1e-3, None)] * len(w),
      constraints=[{"type": "eq", "fun": lambda x: (_variance(w, x) - target) / target}],
      options={"ftol": 1e-12, "maxiter": 500})
  assert solved.success
  np.testing.assert_allclose(got, solved.x, rtol=1e-4)
  assert _variance(w, got) == pytest.approx(target, rel=1e-12)
  assert got.sum() < len(w) * q  # fewer levels in total than every client at q


def _quantization_variance(w, q, t=1.0, samples=400_000, seed=0):
  """E_p[Var(sum_i w_i Q_{q_i}(p_i))] by simulation: p_i ~ U[-t, t], each stochastically
  rounded to the grid of step t / q_i (q_i intervals on each side of 0), unbiasedly."""
  rng = np.random.default_rng(seed)
  p = rng.uniform(-t, t, size=(samples, len(w)))
  step = t / np.asarray(q)
  low = np.floor(p / step) * step
  up = rng.random(p.shape) < (p - low) / step
  error = (low + up * step - p) @ w
  return float(np.mean(error ** 2))


def test_simulated_quantization_keeps_the_variance_with_fewer_levels():
  # Theorem 1 checked on the quantizer itself, not on the variance formula.
  w, q = _weights(), 8.0
  adaptive = np.array(client_levels(q, list(w), "variance"))
  static = _quantization_variance(w, np.full_like(w, q))
  assert static == pytest.approx(np.sum(w ** 2) / q ** 2 / 6, rel=0.02)  # Lemma 3, t = 1
  assert _quantization_variance(w, adaptive, seed=1) == pytest.approx(static, rel=0.03)
  assert adaptive.sum() < 0.85 * len(w) * q


@pytest.mark.parametrize("q", [2.0, 7.0])
def test_equal_communication_levels_minimise_variance(q):
  w = _weights()
  got = np.array(client_levels(q, list(w), "communication"))
  solved = optimize.minimize(
      lambda x: _variance(w, x), np.full_like(w, q), method="SLSQP",
      bounds=[(1e-3, None)] * len(w),
      constraints=[{"type": "eq", "fun": lambda x: np.sum(x) - len(w) * q}],
      options={"ftol": 1e-14, "maxiter": 500})
  assert solved.success
  np.testing.assert_allclose(got, solved.x, rtol=1e-4)
  assert got.sum() == pytest.approx(len(w) * q, rel=1e-12)  # the paper's communication, equal
  assert _variance(w, got) < _variance(w, np.full_like(w, q))


def test_per_client_values_are_the_closed_form_rounded_and_mapped_to_bits():
  clients = [client(f"c{i}", examples=n) for i, n in enumerate(EXAMPLES)]
  the_knob = knob("bits", initial=4, minimum=1, maximum=8)
  state, got = _controller().decide(_controller().initial_state(),
                                    view(1, the_knob, clients=clients))
  w, q = _weights(), 2.0 ** 4 - 1
  a, b = np.sum(w ** (2 / 3)), np.sum(w ** 2) / q ** 2
  levels = np.maximum(np.floor(np.sqrt(a / b) * w ** (2 / 3) + 0.5), 1)
  want = np.clip(np.ceil(np.log2(levels + 1)), 1, 8)
  assert [got[f"c{i}"] for i in range(len(EXAMPLES))] == list(want)
  assert list(want) == [3, 4, 3, 5, 4]  # the heaviest client (95 examples) gets the most bits
  _, one = _controller(client_adaptive=False).decide(
      _controller().initial_state(), view(1, the_knob, clients=clients))
  assert one == 4


def _levels_by_round(losses, maximum=64, **params):
  controller = _controller(client_adaptive=False, **params)
  the_knob = knob("levels", initial=4, minimum=1, maximum=maximum, encoder="qsgd")
  state, out = controller.initial_state(), []
  for r in range(1, len(losses) + 2):
    state, value = controller.decide(state, view(r, the_knob, losses[:r - 1]))
    out.append(value)
  return out


def test_levels_double_when_the_smoothed_loss_stalls():
  # The paper's 3.4 as its authors' code tests it: double when GG_t > GG_{t+1-phi}, then
  # hold phi rounds. Worked by hand. No smoothing, phi 2: after row 3, 2.5 > 2.0 -> 8;
  # rows 4-5 are held and falling; row 6, 1.0 = 1.0, is no rise; after row 7, 1.5 > 1.0 -> 16.
  losses = [3.0, 2.0, 2.5, 2.2, 1.0, 1.0, 1.5, 0.5]
  assert _levels_by_round(losses, smoothing=0.0, patience=2) == [4, 4, 4, 8, 8, 8, 8, 16, 16]
  # psi 0.5 on 1, 2, 2, 2: GG = 1, 1.5, 1.75, 1.875, rising: doubles after rows 2 and 4.
  assert _levels_by_round([1.0, 2.0, 2.0, 2.0], smoothing=0.5, patience=2) == [4, 4, 8, 8, 16]
  # psi 0.9 on a falling loss: GG = 4, 3.9, 3.76, 3.624, 3.4916 never rises: no doubling.
  assert _levels_by_round([4.0, 3.0, 2.5, 2.4, 2.3], smoothing=0.9, patience=2) == [4] * 6
  # A rising loss doubles every phi rounds up to the knob's max (10); phi 1 never doubles.
  rising = [1.0, 2.0, 3.0, 4.0, 5.0]
  assert _levels_by_round(rising, smoothing=0.0, patience=2, maximum=10) == [4, 4, 8, 8, 10, 10]
  assert _levels_by_round(rising, smoothing=0.0, patience=1) == [4] * 6


def test_resume_from_the_saved_state_decides_as_an_uninterrupted_run():
  losses = [3.0, 2.0, 2.5, 2.2, 1.0, 1.0, 1.5, 0.5]
  the_knob = knob("levels", initial=4, minimum=1, maximum=64, encoder="qsgd")
  controller = _controller(smoothing=0.5, patience=2, client_adaptive=False)
  state, straight = controller.initial_state(), []
  for r in range(1, 10):
    state, value = controller.decide(state, view(r, the_knob, losses[:r - 1]))
    straight.append(value)
    if r == 4:
      saved = json.dumps(state)
  state, resumed = json.loads(saved), straight[:4]
  for r in range(5, 10):  # a new process: a fresh controller, the state from JSON
    state, value = _controller(smoothing=0.5, patience=2, client_adaptive=False).decide(
        state, view(r, the_knob, losses[:r - 1]))
    resumed.append(value)
  assert resumed == straight and straight[-1] > straight[0]

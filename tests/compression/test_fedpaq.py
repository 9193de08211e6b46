"""FedPAQ (Reisizadeh et al. 2020) as experiments/fedpaq.yaml composes it (fedavg
with tau local steps, uniform weighting, server SGD 1, a mean over a QSGD encode
stage) against the paper's update, written in NumPy:

  x_{k+1} = x_k + (1/r) sum_i Q(x^i_{k,tau} - x_k),
  x^i_{k,t+1} = x^i_{k,t} - eta grad f_i(x^i_{k,t}; batch t).

The quantizer's draws are seeded by the values fedsim encodes, which a NumPy
reference cannot reproduce bit for bit, so the round is compared twice: with Q
the identity (the same config, the encoder replaced), to float tolerance; and
with the config's QSGD, each coordinate of r (x_{k+1} - x_k) being a sum over
clients of one of the two neighbouring levels the paper's quantizer allows
(||d|| sign(d_j) l / s, l = floor or ceil of s |d_j| / ||d||; its
unbiasedness is tested in test_paper_encoders)."""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pytest
import yaml

from tests.learning import builders, reference

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "fedpaq.yaml"


def _config() -> dict:
  return yaml.safe_load(CONFIG.read_text())


def _composition(aggregation):
  """The config's algorithm on a toy softmax regression (3 features, 3 classes)."""
  params = dict(_config()["algorithm"])
  name = params.pop("name")
  return builders.algorithm(name, params, builders.task_model(num_classes=3),
                            aggregation=aggregation, batch_size=4)


def _clients(seed: int, tau: int, r: int):
  """r clients with tau batches each; unequal example counts (padding), so a
  mean weighted by examples would differ from the paper's 1/r."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(r):
    mask = np.ones((tau, 4), np.float32)
    mask[-1, :i] = 0.0
    out.append({"x": rng.normal(size=(tau, 4, 3)).astype(np.float32),
                "y": rng.integers(0, 3, (tau, 4)).astype(np.int32), "mask": mask})
  return out


def _differences(x_k, clients, eta):
  """Each client's x^i_{k,tau} - x_k after tau steps of minibatch SGD (float64)."""
  out = []
  for batches in clients:
    params = [p.copy() for p in x_k]
    for x, y in reference.real_batches(batches):
      params = [p - eta * g for p, g in zip(params, reference.mean_grad(params, x, y))]
    out.append([p - q for p, q in zip(params, x_k)])
  return out


def _one_round(aggregation, seed=3):
  config = _config()
  tau, r = config["algorithm"]["local_steps"], config["clients_per_round"]
  eta = config["algorithm"]["client_optimizer"]["learning_rate"]
  algorithm = _composition(aggregation)
  state = algorithm.process.initialize()
  x_k = [np.array(v, np.float64) for v in algorithm.model_weights(state).trainable]
  clients = _clients(seed, tau, r)
  state, _ = algorithm.process.next(state, clients)
  x_next = [np.asarray(v, np.float64) for v in algorithm.model_weights(state).trainable]
  return x_k, x_next, _differences(x_k, clients, eta), r


def test_the_config_is_fedavg_with_local_steps_and_a_quantized_mean():
  config = _config()
  assert config["algorithm"]["name"] == "fedavg"
  assert config["algorithm"]["client_weighting"] == "uniform"
  assert config["algorithm"]["server_optimizer"] == {"name": "sgd", "learning_rate": 1.0}
  assert [s["name"] for s in config["aggregation"]] == ["mean", "encode"]
  assert config["aggregation"][1]["encoder"] == "qsgd"


def test_one_round_with_the_identity_quantizer_is_the_papers_update(tff_runtime):
  aggregation = [{"name": "mean"}, {"name": "encode", "encoder": "identity"}]
  x_k, x_next, differences, r = _one_round(aggregation)
  for j, got in enumerate(x_next):
    want = x_k[j] + sum(d[j] for d in differences) / r
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
  # The clients' unequal example counts: weighting by them would differ.
  assert np.abs(x_next[0] - x_k[0]).max() > 1e-3


def _levels(d: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
  """The two values QSGD (Alistarh et al. 2017) may send for each coordinate of d."""
  norm = np.linalg.norm(d)
  scaled = s * np.abs(d) / norm
  return (norm * np.sign(d) * np.floor(scaled) / s, norm * np.sign(d) * np.ceil(scaled) / s)


def test_one_round_with_qsgd_sends_the_papers_quantized_levels(tff_runtime):
  config = _config()
  s = config["aggregation"][1]["levels"]
  x_k, x_next, differences, r = _one_round(config["aggregation"])
  for j in range(len(x_k)):
    summed = r * (x_next[j] - x_k[j])
    # Every way the r clients' roundings can combine, per coordinate.
    options = [_levels(d[j], s) for d in differences]
    sums = np.stack([sum(options[i][pick] for i, pick in enumerate(picks))
                     for picks in itertools.product((0, 1), repeat=r)])
    assert np.all(np.abs(sums - summed[None]).min(axis=0) <= 1e-5), j
    # Quantized, not the plain sum of the differences.
    assert np.abs(summed - sum(d[j] for d in differences)).max() > 1e-3


@pytest.mark.parametrize("variant, steps, levels", [
    ("fedpaq_tau5_s4", 5, 4), ("fedpaq_tau1_s1", 1, 1), ("fedavg_tau5", 5, None)])
def test_variants_change_tau_or_s_only(variant, steps, levels):
  from fedsim.experiment.config.loader import expand_variants, load_config
  _, raw = load_config(CONFIG, [])
  configs = dict(expand_variants(raw))
  algorithm = configs[variant].algorithm
  assert algorithm.name == "fedavg" and algorithm.params.local_steps == steps
  stages = configs[variant].aggregation
  assert stages[0].name == "mean"
  if levels is None:
    assert len(stages) == 1
  else:
    assert stages[1].params.encoder.params.levels == levels

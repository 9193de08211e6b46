"""`fedsim check encoder`: each built-in encoder's line against the papers'
formulas (docs/reference/encoders.md), and a broken plugin encoder caught by
the check and, on first use, stopping a run in one line.

The references are written from the formulas: bits per coordinate from what
one n-element tensor sends (n' = n padded to a power of two for a rotation;
bit packing fills 28 bits of each int32), vNMSE E||x^ - x||^2 / ||x||^2 from
each encoder's definition where it has a closed form.
"""

from __future__ import annotations

import math
import pathlib
import re
import textwrap

import numpy as np
import pytest

from fedsim import cli
from fedsim.compression import ENCODERS
from fedsim.compression import check
from tests.registries import builtin_names

VECTORS = {v.name: v for v in check.VECTORS}


def _client0(name: str) -> np.ndarray:
  """The reported vector (client 0's) of test vector `name`, float64, flat."""
  return check.client_values(VECTORS[name], clients=1, seed=0)[0].astype(np.float64).ravel()


def _packed(symbols: int, bits: int) -> int:
  return math.ceil(symbols * bits / 28) * 32


def _pow2(n: int) -> int:
  return 1 << (n - 1).bit_length()


def _kashin_coefficients(n: int) -> int:
  padded = _pow2(n)
  return 2 * padded if n > 0.85 * padded else padded


# Bits one client sends for an n-element tensor (docs/reference/encoders.md's table).
BITS = {
    "identity": lambda n, x: 32 * n,
    "uniform": lambda n, x: _packed(n, 8) + 64,                      # min and max
    "hadamard": lambda n, x: _packed(_pow2(n), 8) + 64 + 64,         # + the seed
    "qsgd": lambda n, x: _packed(n, math.ceil(math.log2(15))) + 32,  # s = 7; the norm
    "terngrad": lambda n, x: _packed(n, 2) + 32,
    "sign": lambda n, x: _packed(n, 1) + 32,
    "drive": lambda n, x: _packed(_pow2(n), 1) + 32 + 64,
    "eden": lambda n, x: _packed(_pow2(n), 1) + 32 + 64,
    "topk": lambda n, x: 64 * math.ceil(0.01 * n),
    "randk": lambda n, x: 32 * math.ceil(0.01 * n) + 64,
    "threshold": lambda n, x: 64 * int(np.sum(np.abs(x) >= 1.0)),
    "kashin": lambda n, x: _packed(_kashin_coefficients(n), 2) + 64 + 64,
    "float16": lambda n, x: 16 * n,
    "bfloat16": lambda n, x: 16 * n,
    "nf4": lambda n, x: _packed(n, 4) + 32 * math.ceil(n / 64),
}
PARAMS = {"threshold": ["tau=1.0"]}
SHAPES = {"gaussian": (77, 13), "sparse": (101, 99)}


def _topk_vnmse(x: np.ndarray) -> float:
  k = math.ceil(0.01 * x.size)
  kept = np.sort(x**2)[-k:].sum()
  return 1 - kept / (x @ x)


def _vnmse(encoder: str, x: np.ndarray) -> tuple[float, float] | None:
  """(vNMSE by the formula, relative tolerance), or None where there is no closed form."""
  n, norm2 = x.size, float(x @ x)
  if encoder == "identity":
    return 0.0, 0.0
  if encoder == "topk":   # deterministic: what the k largest leave out
    return _topk_vnmse(x), 1e-3
  if encoder == "sign":   # x^ = (||x||_1 / n) sign(x)
    return 1 - np.abs(x).sum()**2 / (n * norm2), 1e-3
  if encoder == "threshold":   # deterministic: the values below tau are dropped
    return float(np.sum(x[np.abs(x) < 1.0]**2) / norm2), 1e-3
  # Expectations, estimated from 32 draws: tolerances of ~4 standard errors.
  if encoder == "randk":   # unbiased: kept coordinates times n/k
    return n / math.ceil(0.01 * n) - 1, 0.15
  if encoder == "terngrad":   # Var x^_i = max|x| |x_i| - x_i^2
    return (np.abs(x).max() * np.abs(x).sum() - norm2) / norm2, 0.1
  if encoder == "uniform":   # stochastic rounding: Var = step^2 f (1 - f), f the remainder
    step = (x.max() - x.min()) / 255
    f = (x - x.min()) / step % 1
    return float(np.sum(step**2 * f * (1 - f)) / norm2), 0.1
  if encoder in ("drive", "eden"):   # 1 bit, unbiased: pi/2 - 1 = D / (1 - D) at large n
    return math.pi / 2 - 1, 0.12
  return None


UNBIASED = {"uniform", "hadamard", "qsgd", "terngrad", "randk", "drive", "eden", "kashin"}
BIASED = {"sign": -1, "topk": -1, "threshold": -1}    # shrink x: the mean error is along -x


def _rows(output: str) -> dict[str, list[str]]:
  return {line.split()[0]: line.split() for line in output.splitlines()
          if line.split() and line.split()[0] in VECTORS}


@pytest.mark.slow
def test_every_builtin_encoder_checks_against_its_formulas(capsys):
  names = builtin_names(ENCODERS)
  assert set(names) == set(BITS) | {"powersgd"}   # a new encoder gets its formula here
  for name in names:
    code = cli.main(["check", "encoder", name, *PARAMS.get(name, [])])
    output = capsys.readouterr().out
    assert code == 0, output
    assert output.splitlines()[-2:] == [
        f"{name}: the sum decodes as the sum of the decodes on every vector",
        f"{name}: its random draws repeat (seeded)"]
    rows = _rows(output)
    assert sorted(rows) == sorted(VECTORS)
    for vector, row in rows.items():
      x = _client0(vector)
      n = x.size
      vnmse, bias_z, bits = float(row[2]), float(row[3]), float(row[4])
      if name == "powersgd":   # rank 1 of the 2-D vectors: (rows + columns) float32; 1-D as is
        shape = SHAPES.get(vector)
        want_bits = 32 * (shape[0] + shape[1]) if shape else 32 * n
      else:
        want_bits = BITS[name](n, x)
      assert bits == pytest.approx(want_bits / n, abs=6e-4), (name, vector)
      formula = _vnmse(name, x)
      if formula is not None and not (name in ("drive", "eden") and vector != "gaussian"):
        want, tolerance = formula
        assert vnmse == pytest.approx(want, rel=tolerance, abs=1e-4 * (tolerance == 0)), (
            name, vector)
      if name in UNBIASED:
        assert abs(bias_z) < 4.5, (name, vector, bias_z)
      if name in BIASED:
        assert bias_z == -math.inf, (name, vector)
      assert float(row[8]) > check.MIN_SUM_Z or float(row[9]) < 1.1   # sum z, sum NMSE


BROKEN_PLUGIN = textwrap.dedent('''
    """An encoder whose decode forgets to undo its random sign flips."""
    import collections

    from fedsim.compression import register_encoder


    @register_encoder("forgetful_signs")
    def forgetful_signs(params):
      import tensorflow as tf
      from fedsim.compression import tensor_encoding_api as te

      @te.tf_style_encoding_stage
      class ForgetfulSigns(te.EncodingStageInterface):
        name = "forgetful_signs"
        compressible_tensors_keys = ["values"]
        commutes_with_sum = False
        decode_needs_input_shape = False

        def __init__(self):
          self._salt = te.salt_or_current(None)

        def get_params(self):
          return collections.OrderedDict(), collections.OrderedDict()

        def encode(self, x, encode_params):
          noise = tf.random.stateless_uniform(tf.shape(x), te.noise_seed(x, self._salt))
          return collections.OrderedDict(values=tf.where(noise < 0.5, -x, x))

        def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
          return encoded_tensors["values"]   # the signs stay flipped

      return te.chain(te.stages.FlattenEncodingStage(), ForgetfulSigns())
    ''')


@pytest.fixture
def broken_plugin(tmp_path, monkeypatch):
  monkeypatch.setattr(ENCODERS, "_entries", dict(ENCODERS._entries))
  monkeypatch.setattr(check, "_CHECKED", set())
  path = tmp_path / "forgetful.py"
  path.write_text(BROKEN_PLUGIN)
  return path


@pytest.mark.slow
def test_a_plugin_encoder_whose_decode_forgets_its_sign_flips_fails_the_check(
    broken_plugin, capsys):
  code = cli.main(["check", "encoder", "forgetful_signs", "--plugin", str(broken_plugin)])
  output = capsys.readouterr().out
  assert code == 1
  assert output.splitlines()[-2] == ("forgetful_signs: the sum does not decode on gaussian,"
                                     " heavy_tailed, sparse (see sum gap, sum z)")
  for row in _rows(output).values():
    assert row[-1] == "NO"
    assert abs(float(row[8])) < check.MIN_SUM_Z
    assert float(row[9]) == pytest.approx(2.0, rel=0.15)   # sum NMSE
    assert float(row[2]) == pytest.approx(2.0, rel=0.15)   # E||Dx - x||^2 = 2 ||x||^2


@pytest.mark.slow
def test_a_run_with_the_broken_plugin_encoder_stops_in_one_line(broken_plugin, tmp_path,
                                                                capsys):
  config = tmp_path / "broken.yaml"
  config.write_text(textwrap.dedent(f"""
      name: broken
      plugins: [{broken_plugin}]
      rounds: 2
      clients_per_round: 2
      data: {{name: digits, num_clients: 4, batch_size: 16}}
      model: {{name: mlp, hidden: [32]}}
      algorithm: {{name: fedavg, client_optimizer: {{name: sgd, learning_rate: 0.3}}}}
      compression: {{aggregation: {{encoder: forgetful_signs, min_elements: 1000}}}}
      """))
  code = cli.main(["run", str(config), "--logdir", str(tmp_path / "runs"), "--no-progress"])
  err = capsys.readouterr().err
  assert code == 2
  assert len(err.strip().splitlines()) == 1, err
  assert re.fullmatch(
      r"fedsim: error: encoder 'forgetful_signs': the sum of 4 clients' encodings does not"
      r" decode \(the decoded sum is unrelated to the true sum \(z -?\d+\.\d < 5, NMSE"
      r" \d\.\d\d >= 1\.5\)\);"
      r" see `fedsim check encoder forgetful_signs`\n", err), err


ROOT = pathlib.Path(__file__).resolve().parents[2]
OWN_ENCODER = ROOT / "experiments/plugin_example/own_encoder.py"


def test_the_guides_plugin_is_the_file_the_tests_run():
  guide = (ROOT / "docs/guides/own-encoder.md").read_text()
  block = guide.split("<!-- file: own_encoder.py -->\n```python\n", 1)[1].split("```\n", 1)[0]
  assert block == OWN_ENCODER.read_text()


@pytest.mark.slow
def test_the_guides_stochastic_sign_keeps_the_contract(capsys, monkeypatch):
  monkeypatch.setattr(ENCODERS, "_entries", dict(ENCODERS._entries))
  code = cli.main(["check", "encoder", "stochastic_sign", "--plugin", str(OWN_ENCODER)])
  output = capsys.readouterr().out
  assert code == 0, output
  for vector, row in _rows(output).items():
    x = _client0(vector)
    n, norm2 = x.size, float(x @ x)
    assert float(row[4]) == pytest.approx((_packed(n, 1) + 32) / n, abs=6e-4)
    # E||x^ - x||^2 = n max|x|^2 - ||x||^2 (each coordinate is +-max|x|, unbiased).
    assert float(row[2]) == pytest.approx(n * np.abs(x).max()**2 / norm2 - 1, rel=0.1)
    assert abs(float(row[3])) < 4.5


# Encoders whose stages draw with unseeded TensorFlow ops, as a user writes them
# without fedsim's `chain`: fedsim seeds tf.random.uniform / normal in any
# encoder (`tensor_encoding_api.seeded`); `tf.random.shuffle` it cannot, and
# the check stops that encoder.
UNSEEDED_PLUGIN = textwrap.dedent('''
    """Encoders drawing unseeded random numbers."""
    import collections

    from fedsim.compression import register_encoder


    def _te():
      from fedsim.compression import tensor_encoding_api as te
      return te


    @register_encoder("composed_hadamard")
    def composed_hadamard(params):
      """tensor_encoding's stages composed by its own EncoderComposer, not fedsim's chain."""
      from tensorflow_model_optimization.python.core.internal import tensor_encoding as raw
      stages = _te().stages
      return (raw.core.EncoderComposer(stages.BitpackingEncodingStage(4))
              .add_parent(stages.UniformQuantizationEncodingStage(4, stochastic=False),
                          "quantized_values")
              .add_parent(stages.HadamardEncodingStage(), "hadamard_values")
              .add_parent(stages.FlattenEncodingStage(), "flattened_values").make())


    @register_encoder("te_hadamard_quantization")
    def te_hadamard_quantization(params):
      """tensor_encoding's own encoder: rotation and stochastic 8-bit rounding."""
      from tensorflow_model_optimization.python.core.internal import tensor_encoding as raw
      return raw.encoders.hadamard_quantization(8)


    def _adaptive_dither():
      import tensorflow as tf
      te = _te()

      @te.tf_style_adaptive_encoding_stage
      class AdaptiveDither(te.AdaptiveEncodingStageInterface):
        """Subtractive dither on a grid of step `scale` (the state: the largest |x| of
        the last round over 8); the dither is drawn once a round in get_params."""
        name = "adaptive_dither"
        compressible_tensors_keys = ["values"]
        commutes_with_sum = False
        decode_needs_input_shape = False
        state_update_aggregation_modes = {"max_abs": te.StateAggregationMode.MAX}

        def initial_state(self):
          return {"scale": tf.constant(0.5)}

        def update_state(self, state, state_update_tensors):
          return {"scale": state_update_tensors["max_abs"] / 8 + 1e-6}

        def get_params(self, state):
          params = {"step": state["scale"], "dither": tf.random.uniform([])}
          return params, params

        def encode(self, x, encode_params):
          step, dither = encode_params["step"], encode_params["dither"]
          return ({"values": tf.round(x / step + dither)},
                  {"max_abs": tf.reduce_max(tf.abs(x))})

        def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
          return (encoded_tensors["values"] - decode_params["dither"]) * decode_params["step"]

      return AdaptiveDither()


    @register_encoder("adaptive_dither")
    def adaptive_dither(params):
      return _te().chain(_adaptive_dither())


    @register_encoder("composed_adaptive_dither")
    def composed_adaptive_dither(params):
      from tensorflow_model_optimization.python.core.internal import tensor_encoding as raw
      return raw.core.EncoderComposer(_adaptive_dither()).make()


    @register_encoder("shuffled_signs")
    def shuffled_signs(params):
      """Random signs whose seed is drawn by tf.random.shuffle, which fedsim does not seed."""
      import tensorflow as tf
      te = _te()

      @te.tf_style_encoding_stage
      class ShuffledSigns(te.EncodingStageInterface):
        name = "shuffled_signs"
        compressible_tensors_keys = ["values"]
        commutes_with_sum = True
        decode_needs_input_shape = False

        def get_params(self):
          seed = tf.random.shuffle(tf.range(1 << 16))[:2]
          return {"seed": seed}, {"seed": seed}

        def _signs(self, x, seed):
          return tf.sign(tf.random.stateless_uniform(tf.shape(x), seed) - 0.5)

        def encode(self, x, encode_params):
          return {"values": x * self._signs(x, encode_params["seed"])}

        def decode(self, encoded_tensors, decode_params, num_summands=None, shape=None):
          values = encoded_tensors["values"]
          return values * self._signs(values, decode_params["seed"])

      return te.chain(te.stages.FlattenEncodingStage(), ShuffledSigns())
    ''')


@pytest.fixture
def unseeded_plugin(tmp_path, monkeypatch):
  """The path of UNSEEDED_PLUGIN, its encoders registered for this test only."""
  from fedsim import plugins
  monkeypatch.setattr(ENCODERS, "_entries", dict(ENCODERS._entries))
  monkeypatch.setattr(check, "_CHECKED", set())
  path = tmp_path / "unseeded.py"
  path.write_text(UNSEEDED_PLUGIN)
  plugins.load_plugins([str(path)], tmp_path)
  return path


SPEC_SHAPE = (33, 31)   # 1,023 values: a rotation pads them to 1,024


@pytest.mark.parametrize("name", ["composed_hadamard", "te_hadamard_quantization",
                                  "adaptive_dither", "composed_adaptive_dither"])
def test_unseeded_uniform_draws_of_any_encoder_are_seeded_by_fedsim(unseeded_plugin, name):
  """tf.random.uniform in a stage's get_params (a rotation's seed, a dither) or
  encode (stochastic rounding), in an encoder composed without `chain` or in an
  adaptive stage: the draws repeat, so the server decodes with the parameters its
  clients encoded with, and the run passes its first-use check."""
  import tensorflow as tf
  spec = tf.TensorSpec(SPEC_SHAPE, tf.float32)
  direction = check.direction_of(name, {})
  assert check.unseeded_draws(direction, spec) is None
  check.first_use(direction, spec)   # does not raise


def test_an_encoder_drawing_with_an_op_fedsim_cannot_seed_stops_in_one_line(unseeded_plugin):
  import tensorflow as tf
  from fedsim.errors import UserError
  direction = check.direction_of("shuffled_signs", {})
  with pytest.raises(UserError) as error:
    check.first_use(direction, tf.TensorSpec(SPEC_SHAPE, tf.float32))
  assert str(error.value) == (
      "encoder 'shuffled_signs': its parameters differ between two draws in one round (an"
      " unseeded random op in get_params: the server would decode with parameters its"
      " clients did not encode with); draw with tf.random.stateless_* seeded by"
      " noise_seed(x, salt) in encode or params_seed(salt) in get_params"
      " (fedsim.compression.tensor_encoding_api; docs/guides/own-encoder.md)")


@pytest.mark.slow
def test_fedsim_check_encoder_says_whether_the_draws_repeat(unseeded_plugin, capsys):
  code = cli.main(["check", "encoder", "shuffled_signs", "--plugin", str(unseeded_plugin)])
  lines = capsys.readouterr().out.splitlines()
  assert code == 1   # its sum decodes: only its draws fail
  assert lines[-2] == "shuffled_signs: the sum decodes as the sum of the decodes on every vector"
  assert lines[-1].startswith("shuffled_signs: its parameters differ between two draws in one"
                              " round (an unseeded random op in get_params:")
  code = cli.main(["check", "encoder", "composed_hadamard", "--plugin", str(unseeded_plugin)])
  lines = capsys.readouterr().out.splitlines()
  assert code == 0
  assert lines[-1] == "composed_hadamard: its random draws repeat (seeded)"


@pytest.mark.parametrize("args,said", [
    (["uniform", "bits"], "bits: expected KEY=VALUE, a parameter of encoder 'uniform'"),
    (["uniform", "=3"], "=3: expected KEY=VALUE, a parameter of encoder 'uniform'"),
    (["uniform", "a.b=1"], "a.b=1: expected KEY=VALUE, a parameter of encoder 'uniform'"),
    (["uniform", "bits=["], "bits=[: value is not valid YAML"),
    (["uniform", "bits=4", "bits=8"], "bits=8: bits is given twice"),   # the last one won
    (["uniform", "bits=0"], "encoder.bits: must be >= 1, got 0"),
    (["nosuch"], "encoder: unknown encoder 'nosuch'; choose one of: "),
    # Checked 'sign' under the name 'uniform', and ignored min_elements.
    (["uniform", "encoder=sign"], "encoder.encoder: the check sets it ('uniform': the NAME"
                                  " argument); give only the encoder's own parameters"),
    (["uniform", "min_elements=50"], "encoder.min_elements: the check sets it (1: every vector"
                                     " is encoded); give only the encoder's own parameters"),
    # threshold was refused for a min_elements the user never gave; the others were ignored.
    *[(["uniform", f"{key}={value}"], f"encoder.{key}: a run's option, not the encoder's: the"
       " check encodes each vector afresh; give only the encoder's own parameters")
      for key, value in [("threshold", 10), ("error_feedback", "true"),
                         ("lossless", "huffman")]],
    (["uniform", "bits={initial: 4, controller: adaquantfl}"],
     "encoder.bits.controller: a run's controller sets bits each round; give the value to"
     " check, e.g. bits=4"),
])
def test_bad_check_arguments_are_named_in_one_line(args, said, capsys):
  """The culprit is the argument as typed (check takes no --set)."""
  assert cli.main(["check", "encoder", *args]) == 2
  error = capsys.readouterr().err
  assert error.startswith(f"fedsim: error: {said}")
  assert error.count("\n") == 1


def test_check_needs_only_the_encoders_name(capsys):
  with pytest.raises(SystemExit):
    cli.main(["check", "encoder"])
  assert capsys.readouterr().err == (
      "fedsim check encoder: error: the following arguments are required: NAME"
      " (see fedsim check encoder --help)\n")

"""Lossy compression of what crosses the wire, per direction.

Config:

  compression:
    broadcast:   {encoder: uniform, bits: 8, min_elements: 10000}  # server -> clients
    aggregation: {encoder: hadamard, bits: 4}                       # clients -> server

A missing direction sends float tensors unchanged. Within a direction, a
tensor with fewer than `min_elements` elements (or, with `threshold: N`
instead, with N elements or fewer: TFF's compression tutorial encodes tensors
with *more* than 10,000), or one that is not floating point, is sent
unchanged too: small tensors (biases) gain little and are the most sensitive
to error.

This module holds the encoder registry and parses config; fedsim's own
encoders are registered in `fedsim.compression.encoder_catalog`. TensorFlow is
imported by the builders, when a process is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Mapping

from fedsim.config.typed import Component, bounded, parse
from fedsim.errors import UserError
from fedsim.control.parsing import ControlSpec, parse_control
from fedsim.registry import NoParams, Registry, closest

# reports_own_bits: the encoder sends shapes that depend on the values (see `reports_own_bits`).
ENCODERS = Registry("encoder", traits={"reports_own_bits": False})

_DIRECTIONS = ("broadcast", "aggregation")


def register_encoder(name: str, params: type = NoParams, replace: bool = False, *,
                     reports_own_bits: bool = False) -> Callable:
  """Decorator that adds a user encoder, selectable as `encoder: NAME` in config.

  The decorated function receives the parsed `params` dataclass (built from the
  direction's remaining config keys) and returns either a tensor_encoding
  `Encoder` or a single encoding stage. It is called once per tensor that the
  policy encodes. Import TensorFlow inside the function, not at module level.

  Example (round-to-nearest quantization, a fixed 4 bits by default):

    @dataclasses.dataclass(frozen=True)
    class NearestParams:
      bits: int = 4

    @register_encoder("uniform_nearest", params=NearestParams)
    def uniform_nearest(params):
      from fedsim.compression import tensor_encoding_api as te
      return te.chain(
          te.stages.FlattenEncodingStage(),
          te.stages.UniformQuantizationEncodingStage(params.bits, stochastic=False),
          te.stages.BitpackingEncodingStage(params.bits))

  and in the config: `aggregation: {encoder: uniform_nearest, bits: 4}`.

  A stage you write yourself must be a tensor_encoding encoding stage class
  decorated with `te.tf_style_encoding_stage` (its methods then take
  TensorFlow values); an undecorated one fails when chained after
  `FlattenEncodingStage`. `replace=True` re-registers a taken name (a notebook
  cell run twice). `reports_own_bits=True`: the encoded shapes depend on the
  values; the round measures what each client sends (see `reports_own_bits`).

  Returns:
    The decorator; it returns the function unchanged.

  Raises:
    TypeError: if `params` is not a dataclass.
    ValueError: if another function is already registered under `name` and
      `replace` is false.
  """
  return ENCODERS.register(name, params=params, replace=replace,
                           traits={"reports_own_bits": reports_own_bits})


DEFAULT_MIN_ELEMENTS = 10000


@dataclasses.dataclass(frozen=True)
class _Threshold:
  min_elements: int | None = bounded(None, min=0)   # encode tensors with at least this many
  threshold: int | None = bounded(None, min=0)      # encode tensors with more than this many

  def check(self, key: str) -> None:
    if self.min_elements is not None and self.threshold is not None:
      raise UserError(f"{key}.threshold: give min_elements (at least) or threshold (more"
                      f" than), not both")


@dataclasses.dataclass(frozen=True)
class DirectionSpec:
  """How one direction is compressed: the encoder and which tensors it applies to.

  A float tensor is encoded when it has at least `min_elements` elements or,
  if `threshold` is set (then `min_elements` is None), more than `threshold`.
  """

  encoder: Component
  min_elements: int | None = DEFAULT_MIN_ELEMENTS
  threshold: int | None = None
  # Upload: each client keeps what its encoder dropped and adds it to its next
  # update; broadcast: the server does (see `fedsim.compression.feedback`).
  error_feedback: bool = False
  # "huffman": the packed symbols are sent as their Huffman code, and counted
  # at its size (see `fedsim.compression.lossless`).
  lossless: Literal["none", "huffman"] = "none"
  # A parameter of the encoder set before each round by a controller (see
  # `fedsim.control`); `encoder.params` holds its initial value.
  control: "ControlSpec | None" = None

  def encodes(self, num_elements: int) -> bool:
    """True if a float tensor of `num_elements` elements gets the encoder."""
    if self.threshold is not None:
      return num_elements > self.threshold
    return num_elements >= self.min_elements

  def to_dict(self) -> dict[str, Any]:
    """The config mapping this spec was parsed from (defaults filled in)."""
    rule = ({"threshold": self.threshold} if self.threshold is not None
            else {"min_elements": self.min_elements})
    feedback = {"error_feedback": True} if self.error_feedback else {}
    if self.lossless != "none":
      feedback["lossless"] = self.lossless
    params = dataclasses.asdict(self.encoder.params)
    if self.control is not None:
      params[self.control.param] = self.control.to_dict()
    return {"encoder": self.encoder.name, **rule, **feedback, **params}

  def with_value(self, value: float) -> "DirectionSpec":
    """This direction with its controlled parameter fixed at `value` (no controller)."""
    params = dataclasses.replace(self.encoder.params, **{self.control.param: value})
    return dataclasses.replace(self, encoder=Component(self.encoder.name, params), control=None)


@dataclasses.dataclass(frozen=True)
class CompressionSpec:
  """Compression per direction; None means tensors are sent unchanged that way."""

  broadcast: DirectionSpec | None = None
  aggregation: DirectionSpec | None = None

  def to_dict(self) -> dict[str, Any]:
    return {name: getattr(self, name).to_dict()
            for name in _DIRECTIONS if getattr(self, name) is not None}


def _require_mapping(data: Any, key: str) -> Mapping[str, Any]:
  if not isinstance(data, Mapping):
    raise UserError(f"{key}: expected a mapping of keys, got {data!r:.40}")
  return data


def parse_direction(data: Any, key: str) -> DirectionSpec:
  """Parses `{encoder: NAME, min_elements: N | threshold: N, error_feedback: BOOL,
  lossless: none | huffman, **encoder params}` (or `NAME`).

  Returns:
    The DirectionSpec.

  Raises:
    UserError: naming the key under `key` that is missing, unknown or out of
      bounds (e.g. 'compression.broadcast.bits: must be <= 16, got 32'), or an
      unknown encoder name with the closest registered one.
  """
  if isinstance(data, str):
    data = {"encoder": data}
  data = _require_mapping(data, key)
  if "encoder" not in data:
    raise UserError(f"{key}.encoder: missing required key"
                    f" (one of: {', '.join(ENCODERS.names())})")
  entry = ENCODERS.get(data["encoder"], f"{key}.encoder")
  own = {f.name for f in dataclasses.fields(entry.params)}
  valid = own | {"encoder", "min_elements", "threshold", "error_feedback", "lossless"}
  for name in data:
    if name not in valid:
      raise UserError(f"{key}.{name}: unknown key for encoder '{entry.name}'"
                      f"{closest(name, valid)}; valid keys here: {', '.join(sorted(valid))}")
  rule = parse(_Threshold, {k: v for k, v in data.items()
                            if k in ("min_elements", "threshold")}, key)
  control = parse_control(entry, data, key)
  own_values = {k: v for k, v in data.items() if k in own}
  if control is not None:
    own_values[control.param] = control.initial
  params = parse(entry.params, own_values, key)
  feedback = data.get("error_feedback", False)
  if not isinstance(feedback, bool):
    raise UserError(f"{key}.error_feedback: expected true or false, got {feedback!r:.40}")
  lossless = data.get("lossless", "none")
  if lossless not in ("none", "huffman"):
    raise UserError(f"{key}.lossless: expected none or huffman, got {lossless!r:.40}")
  if rule.threshold is not None:
    return DirectionSpec(Component(entry.name, params), None, rule.threshold, feedback, lossless,
                         control)
  return DirectionSpec(Component(entry.name, params),
                       DEFAULT_MIN_ELEMENTS if rule.min_elements is None else rule.min_elements,
                       error_feedback=feedback, lossless=lossless, control=control)


def parse_compression(data: Any, key: str = "compression") -> CompressionSpec:
  """Parses the `compression` section; absent, null, `none` or `{}`: no compression.

  Returns:
    The CompressionSpec.

  Raises:
    UserError: naming the offending key, as `parse_direction` does.
  """
  if data is None or data == "none":  # `none` reads better in a variant than null
    return CompressionSpec()
  data = _require_mapping(data, key)
  for name in data:
    if name not in _DIRECTIONS:
      raise UserError(f"{key}.{name}: unknown key{closest(name, _DIRECTIONS)};"
                      f" valid keys here: {', '.join(_DIRECTIONS)}")
  spec = CompressionSpec(**{
      name: parse_direction(data[name], f"{key}.{name}")
      for name in _DIRECTIONS if data.get(name) is not None})
  for name in _DIRECTIONS:
    if getattr(spec, name) is not None and getattr(spec, name).error_feedback:
      raise UserError(f"{key}.{name}.error_feedback: only an encode stage of an"
                      f" `{name}:` chain keeps residuals")
  return spec


def reports_own_bits(spec: DirectionSpec | None) -> bool:
  """True if `spec`'s encoder sends shapes that depend on the values (e.g.
  `threshold`): static sizing counts the rest, the round measures these
  (registered with `reports_own_bits=True`)."""
  return spec is not None and bool(ENCODERS.get(spec.encoder.name).traits["reports_own_bits"])


def _feedback_stage(stages: Any) -> tuple[int, Any] | None:
  """(index, stage) of the chain's first `encode` stage asking for error feedback."""
  return next(((i, s) for i, s in enumerate(stages)
               if s.name == "encode" and getattr(s.params, "error_feedback", False)), None)


def check_upload_feedback(stages: Any, model_delta: bool | None,
                          keeps_client_state: bool | None) -> None:
  """Refuses error feedback on the upload (`stages`' encode stage asks for it)
  for an algorithm whose clients have no residual to keep: their upload is not
  a model delta alone, or they keep no state between rounds. None: not known
  (a plugin algorithm before its build), not refused.

  Raises:
    UserError: naming `aggregation[i].error_feedback`.
  """
  found = _feedback_stage(stages)
  if found is None:
    return
  key = f"{found[1].key or f'aggregation[{found[0]}]'}.error_feedback"
  if model_delta is False:
    raise UserError(f"{key}: this algorithm's upload is not a model delta alone, so its"
                    " clients have no residual to carry (fedavg, fedprox and fedsgd do)")
  if keeps_client_state is False:
    raise UserError(f"{key}: this algorithm's clients keep no state between rounds, so"
                    " none can keep a residual (fedavg, fedprox and fedsgd do)")


def upload_feedback(stages: Any) -> DirectionSpec | None:
  """The aggregation chain's `encode` stage if it asks for error feedback, else None.

  Raises:
    UserError: if a stage other than `mean` shares the chain: the client
      could not predict what it does to the value before the encoder.
  """
  found = _feedback_stage(stages)
  if found is None:
    return None
  index, stage = found
  others = [s.name for s in stages if s.name not in ("encode", "mean")]
  if others:
    raise UserError(f"{stage.key or f'aggregation[{index}]'}.error_feedback: needs the"
                    f" encode stage alone (or after mean); the client cannot predict what"
                    f" '{others[0]}' does to its update")
  return stage.params


# fedsim's own encoders, registered as a plugin's would be.
from fedsim.compression import encoder_catalog as _encoder_catalog  # noqa: E402,F401

"""The `lockstep` runtime: a round's clients trained as one computation over a client axis.

`inprocess` runs the compiled round's client loop one client per iteration, so
a round executes a fixed number of kernels per client (~25-40 per local step):
on a GPU, launches rather than arithmetic. Here every client's weights and
optimizer state are stacked on a leading client axis [C, ...] and each local
step is one batched computation for all clients (`tf.vectorized_map` turns the
per-client step into batched kernels: matmuls become batched matmuls), so the
kernels a round executes depend on its longest client, not on how many it has.

Clients have different numbers of batches: each is padded to the round's
longest with all-padding batches (mask 0). A step updates a client's weights
and optimizer state only where its batch has a target, exactly the rule of
`fedsim.learning.local_training` (a batch without a target is skipped), and a
partial batch's loss is the mean over its real examples, so a padded client
stops contributing exactly where it would have stopped.

What the clients send then goes through the algorithm's own aggregation and
server update: the algorithm rebuilt around a client work that passes the
trained results on (`ClientRule.rebuild`), compiled to its MapReduceForm as
`inprocess` compiles a round. Its per-client part (update weighting, upload
encoders) is vectorized over the client axis too, and the clients' uploads
summed in one op when the form's `accumulate` is a sum (else accumulated one
client an iteration, as `inprocess` does: an upload encoder's decoding).

It runs the algorithms whose `FederatedAlgorithm.client_rule` says what each
client computes (FedAvg, FedProx, FedSGD without gradient accumulation and
without client state), for models with one label per example whose every op
TensorFlow can batch over clients, without a broadcast encoder.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedsim.backend import computations
from fedsim.backend.mapreduce import map_reduce_form, state_initialization
from fedsim.learning.client_work import ClientWork, metrics_finalizer, stateless_client_work
from fedsim.learning.loss import dense_gradient, masked_loss, target_mask
from fedsim.runtime.contract import RoundProcess
from fedsim.runtime.devices import select_device

# Clients trained in one graph call: bounds their stacked weights, optimizer
# states, gradients and padded data (1,000 W2 clients would be ~3 GiB at once).
_CHUNK_BYTES = 512 * 2**20

_STATS = ("loss_sum", "correct", "num_examples")


class NotLockstep(Exception):
  """The round cannot be trained in lockstep; the message is one line saying why."""


def unsupported(algorithm: Any) -> str | None:
  """Why `algorithm` cannot run in lockstep (one line), or None when it can.

  Checks what is known without compiling; `LockstepRound` raises `NotLockstep`
  for what only compiling finds (an op TensorFlow cannot batch over clients).
  """
  if algorithm.schedule != "synchronous":
    return f"its rounds are '{algorithm.schedule}', lockstep trains synchronous rounds"
  rule = algorithm.client_rule
  if rule is None:
    if algorithm.stateful_clients:
      return "its clients keep state between rounds"
    return ("the algorithm does not say what its clients compute (lockstep runs fedavg,"
            " fedprox and fedsgd without gradient accumulation)")
  if rule.kind not in _KINDS:
    return f"it has no lockstep form of '{rule.kind}' client work"
  task = rule.task
  if task.broadcast:
    return "clients train from the server's weights: a broadcast encoder is not supported"
  if task.model.label_shape or task.model.pad_label is not None:
    return "the model predicts sequences; lockstep trains one label per example"
  return None


class LockstepRound(RoundProcess):
  """`algorithm`'s round with its clients trained in lockstep (see the module docstring).

  `initialize()` and `next(state, clients)` take and return what the
  algorithm's process does on TFF's runtime (`clients`: packed client data).
  """

  def __init__(self, algorithm: Any, device: str = "auto", chunk_bytes: int = _CHUNK_BYTES):
    """Compiles the round; takes a few seconds.

    Raises:
      NotLockstep: see `unsupported`, or an op of the model's training step
        cannot be batched over clients.
      UserError: see `select_device`.
    """
    reason = unsupported(algorithm)
    if reason is not None:
      raise NotLockstep(reason)
    self.device = select_device(device)
    rule = algorithm.client_rule
    self._rule = rule
    self._model = rule.task.model
    self._chunk_bytes = chunk_bytes
    weights_type = self._model.weights_type
    self._trainable = [tf.TensorSpec(t.shape, tf.as_dtype(t.dtype))
                       for t in computations.tensor_leaves(weights_type.trainable)]
    replay = rule.rebuild(_passed_on_work(weights_type)).process
    next_type = replay.next.type_signature
    self._state_type = next_type.parameter[0].member
    self._result_type = next_type.result
    self._init_type = replay.initialize.type_signature.result
    if next(iter(tff.structure.iter_elements(self._state_type)))[0] != "global_model_weights":
      raise NotLockstep("the server state does not start with the global model weights")
    try:
      form = map_reduce_form(replay)
    except ValueError as e:
      raise NotLockstep(f"no MapReduceForm for its aggregation: {e}") from None
    if form.securely_aggregates_tensors:
      raise NotLockstep("the aggregation uses secure aggregation")
    try:
      self._build(form, replay)
    except computations.NotTensorFlow as e:
      raise NotLockstep(str(e)) from None

  @property
  def stateful_clients(self) -> bool:
    return False

  def _build(self, form, replay) -> None:
    init = state_initialization(replay.initialize)
    self._init = computations.concrete_function(init, "initialize")
    prepare, work, zero, accumulate, _, report, update = computations.form_phases(form)
    acc_specs = tuple(computations.tensor_specs(form.zero.type_signature.result))
    state_specs = tuple(computations.tensor_specs(self._state_type))
    input_specs = tuple(computations.tensor_specs(form.prepare.type_signature.result))
    input_shape, x_dtype = self._model.input_shape, tf.as_dtype(self._model.x_dtype)
    data_specs = (tf.TensorSpec([None, None, None, *input_shape], x_dtype),  # x [C, S, B, ...]
                  tf.TensorSpec([None, None, None], tf.int32),               # y [C, S, B]
                  tf.TensorSpec([None, None, None], tf.float32))             # mask [C, S, B]
    n_weights = len(self._trainable)
    train = self._training_function()
    accumulate_is_sum = _is_elementwise_sum(accumulate, len(acc_specs))

    def clients_graph(state, client_input, acc, x, y, mask):
      """`acc` with the clients of x, y, mask accumulated."""
      trained = train(*state[:n_weights], x, y, mask)
      uploads = tf.vectorized_map(lambda leaves: tuple(work(*leaves, *client_input)),
                                  tuple(trained), fallback_to_while_loop=True)
      if accumulate_is_sum:
        return tuple(accumulate(*acc, *(tf.reduce_sum(u, axis=0) for u in uploads)))
      # Accumulators whose shapes depend on the values (a decoded upload): one client
      # an iteration, as inprocess adds them.
      count = tf.shape(mask)[0]

      def body(i, acc):
        summed = accumulate(*acc, *(u[i] for u in uploads))
        for a, spec in zip(summed, acc_specs):
          a.set_shape(spec.shape)
        return i + 1, tuple(summed)

      return tf.while_loop(lambda i, _: i < count, body, (tf.constant(0), tuple(acc)))[1]

    def finish_graph(state, acc):
      return tuple(update(*state, *report(*acc)))

    @computations.graph_function(state_specs)
    def start(*state):
      with tf.device(self.device):
        return tuple(prepare(*state)), tuple(zero())

    @computations.graph_function((state_specs, input_specs, tuple(acc_specs), data_specs))
    def clients(state, client_input, acc, data):
      with tf.device(self.device):
        return clients_graph(state, client_input, acc, *data)

    @computations.graph_function((state_specs, tuple(acc_specs)))
    def finish(state, acc):
      with tf.device(self.device):
        return finish_graph(state, acc)

    # A round of one chunk is one graph call.
    @computations.graph_function((state_specs, data_specs))
    def whole_round(state, data):
      with tf.device(self.device):
        client_input, acc = tuple(prepare(*state)), tuple(zero())
        acc = clients_graph(state, client_input, acc, *data)
        return finish_graph(state, acc)

    self.whole_round = whole_round.get_concrete_function()
    self._start, self._clients, self._finish = start, clients, finish
    self._round = computations.direct_call(self.whole_round)
    self._state_specs = state_specs

  def _training_function(self):
    """The clients' lockstep training as a function of flat tensors: (*weights, x,
    y, mask) -> their stacked updates, weights and statistics.

    Traced as a TFF TensorFlow computation: TFF's functional Keras models only
    trace in a graph of their own, as TFF builds one.
    """
    rule, model = self._rule, self._model
    batch = rule.task.batch_size
    stacked = collections.OrderedDict(
        x=tff.TensorType(np.dtype(model.x_dtype), [None, None, batch, *model.input_shape]),
        y=tff.TensorType(np.int32, [None, None, batch]),
        mask=tff.TensorType(np.float32, [None, None, batch]))
    train = _KINDS[rule.kind]
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("CRITICAL")  # pfor logs each op it cannot batch before raising
    try:
      computation = tff.tensorflow.computation(
          lambda weights, data: train(rule, model, tuple(weights), data["x"], data["y"],
                                      data["mask"]),
          model.weights_type.trainable, stacked)
    except (ValueError, TypeError) as e:  # what pfor says of an op it cannot batch
      raise NotLockstep(_unbatched(e)) from None
    finally:
      logger.setLevel(level)
    return computations.concrete_function(computation, "lockstep_training")

  def initialize(self) -> Any:
    """The initial server state, as the algorithm's `process.initialize()` returns it."""
    with tf.device(self.device):
      leaves = self._init()
    return computations.pack(leaves, self._init_type)

  def next(self, state: Any, clients: Sequence[Any],
           client_states: Sequence[Any] | None = None) -> tuple[Any, Any]:
    """One round: `(new_state, measurements)`, as the algorithm's `process.next`.

    Raises:
      ValueError: `client_states` given (lockstep clients keep no state).
    """
    if client_states is not None:
      raise ValueError("lockstep clients keep no state: client_states must be None")
    state_leaves = computations.eager_tensors(
        computations.flatten(state, self._state_type), self._state_specs)
    chunks = list(padded_chunks(clients, self._chunk_bytes, self._weight_bytes()))
    if len(chunks) == 1:
      leaves = self._round([*state_leaves, *(tf.constant(d) for d in chunks[0])])
    else:
      client_input, acc = self._start(*state_leaves)
      for chunk in chunks:
        acc = self._clients(tuple(state_leaves), client_input, acc,
                            tuple(tf.constant(d) for d in chunk))
      leaves = self._finish(tuple(state_leaves), acc)
    return computations.pack(leaves, self._result_type)

  def _weight_bytes(self) -> int:
    """Bytes one client's stacked weights, optimizer state and gradient take (about)."""
    return 4 * 4 * sum(math.prod(s.shape) for s in self._trainable)


def _unbatched(error: BaseException) -> str:
  """One line from pfor's error: the op it could not batch over clients, and why."""
  text = str(error)
  op = re.search(r'op: "(\w+)"', text)
  why = re.search(r"(Input \"\w+\" of op '\w+' expected to be loop invariant"
                  r"|No pfor vectorization defined for \w+)", text)
  reason = why.group(1) if why else (text.strip().splitlines() or [type(error).__name__])[-1]
  return (f"TensorFlow cannot batch the model's training step over clients"
          f"{f' (op {op.group(1)})' if op else ''}: {reason}")


def padded_chunks(clients: Sequence[Any], chunk_bytes: int, per_client_bytes: int):
  """The clients as `(x, y, mask)` arrays [C, S, B, ...], C clients padded to the
  longest one's S batches with batches of mask 0, in chunks of at most
  `chunk_bytes` (about; at least one client each)."""
  group, size = [], 0
  for client in clients:
    arrays = (np.asarray(client["x"]), np.asarray(client["y"], np.int32),
              np.asarray(client["mask"], np.float32))
    nbytes = sum(a.nbytes for a in arrays) + per_client_bytes
    if group and size + nbytes > chunk_bytes:
      yield _padded(group)
      group, size = [], 0
    group.append(arrays)
    size += nbytes
  if group:
    yield _padded(group)


def _padded(group):
  steps = max(x.shape[0] for x, _, _ in group)
  out = []
  for j in range(3):
    first = group[0][j]
    stacked = np.zeros((len(group), steps, *first.shape[1:]), first.dtype)
    for c, arrays in enumerate(group):
      stacked[c, :arrays[j].shape[0]] = arrays[j]
    out.append(stacked)
  return tuple(out)


def _passed_on_work(weights_type) -> ClientWork:
  """Client work whose data is what a client trained (`update`, `weight`, its
  statistics) and which sends it on: the algorithm rebuilt around it is the
  round after local training, with the same state, aggregation and measurements."""
  stats = collections.OrderedDict((name, np.float32) for name in _STATS)
  data_type = tff.types.to_type(collections.OrderedDict(
      update=weights_type.trainable, weight=np.float32, stats=stats))

  @tff.tensorflow.computation(weights_type, data_type)
  def client_fn(model_weights, trained):
    del model_weights
    result = tff.learning.templates.ClientResult(update=trained["update"],
                                                 update_weight=trained["weight"])
    return result, trained["stats"]

  return stateless_client_work(weights_type, data_type, client_fn,
                               metrics_finalizer(sequence=False), model_delta=True)


def _is_elementwise_sum(accumulate, count: int) -> bool:
  """Whether `accumulate(acc, upload)` is their sum, leaf by leaf (then the clients'
  uploads add up in one op instead of a loop over clients): each of its `count`
  outputs is an add of two of its inputs."""
  def source(tensor):
    while tensor.op.type == "Identity":
      tensor = tensor.op.inputs[0]
    return tensor

  outputs = [source(t) for t in accumulate.outputs]
  inputs = {t.ref() for t in accumulate.inputs}
  return len(outputs) == count and all(
      t.op.type in ("AddV2", "Add") and all(source(i).ref() in inputs for i in t.op.inputs)
      for t in outputs)


def _client_targets(model, y, mask):
  """Per client and step, the targets of its batch [C, S], and its examples [C]."""
  real = target_mask(y, mask, model.pad_label)          # [C, S, B]
  step_targets = tf.reduce_sum(real, axis=2)
  return real, step_targets, tf.reduce_sum(step_targets, axis=1)


def _stacked(value, count):
  value = tf.convert_to_tensor(value)
  return tf.broadcast_to(value[None], tf.concat([[count], tf.shape(value)], 0))


def _where(active, new, old):
  """`new` for the clients where `active` [C], else `old` (any leading-C shapes)."""
  mask = tf.reshape(active, [-1] + [1] * (len(new.shape) - 1))
  return tf.where(mask, new, old)


def _local_training(rule, model, weights, x, y, mask):
  """Each client's `rule.optimizer` steps over its batches, from `weights`:
  `(update [C, ...] per weight, weight [C], stats)`; update = received - trained."""
  count, steps = tf.shape(mask)[0], tf.shape(mask)[1]
  real, step_targets, examples = _client_targets(model, y, mask)
  specs = tuple(tf.TensorSpec(w.shape, w.dtype) for w in weights)
  opt_state = tf.nest.map_structure(lambda v: _stacked(v, count),
                                    rule.optimizer.initialize(specs))
  extra = rule.extra_gradient(weights) if rule.extra_gradient is not None else None

  def one_client(w, state, x, labels, real, targets):
    grads, (batch_sum, batch_correct) = dense_gradient(
        lambda v: _loss_and_sums(masked_loss(model.predict, v, x, labels, real, targets)),
        tuple(w), extra)
    new_state, new_w = rule.optimizer.next(state, tuple(w), grads)
    return tuple(new_w), new_state, batch_sum, batch_correct

  def step(s, w, state, loss_sum, correct):
    new_w, new_state, batch_sum, batch_correct = tf.vectorized_map(
        lambda a: one_client(*a),
        (w, state, x[:, s], y[:, s], real[:, s], step_targets[:, s]),
        fallback_to_while_loop=False)
    active = step_targets[:, s] > 0

    def masked():
      return (tuple(_where(active, n, o) for n, o in zip(new_w, w)),
              tf.nest.map_structure(lambda n, o: _where(active, n, o), new_state, state))

    # Only the steps past a short client's end select: most steps take every client's.
    w, state = tf.cond(tf.reduce_all(active), lambda: (tuple(new_w), new_state), masked)
    zero = tf.zeros_like(batch_sum)
    return (s + 1, w, state, loss_sum + tf.where(active, batch_sum, zero),
            correct + tf.where(active, batch_correct, zero))

  start = tuple(_stacked(w, count) for w in weights)
  zeros = tf.zeros([count])
  _, trained, _, loss_sum, correct = tf.while_loop(
      lambda s, *_: s < steps, step, (tf.constant(0), start, opt_state, zeros, zeros))
  update = tuple(r[None] - t for r, t in zip(weights, trained))
  weight = tf.ones([count]) if rule.uniform_weighting else examples
  return update, weight, collections.OrderedDict(loss_sum=loss_sum, correct=correct,
                                                 num_examples=examples)


def _gradient(rule, model, weights, x, y, mask):
  """Each client's gradient of its mean loss over all its batches at `weights`:
  `(gradient [C, ...] per weight, weight [C], stats)`."""
  count, steps = tf.shape(mask)[0], tf.shape(mask)[1]
  real, step_targets, examples = _client_targets(model, y, mask)

  def one_client(x, labels, real, targets):
    grads, sums = dense_gradient(
        lambda v: _loss_and_sums(masked_loss(model.predict, v, x, labels, real, targets)),
        weights, None)
    return grads, sums

  def step(s, acc, loss_sum, correct):
    targets = step_targets[:, s]
    grads, (batch_sum, batch_correct) = tf.vectorized_map(
        lambda a: one_client(*a), (x[:, s], y[:, s], real[:, s], targets),
        fallback_to_while_loop=False)
    acc = tuple(a + g * tf.reshape(targets, [-1] + [1] * (len(g.shape) - 1))
                for a, g in zip(acc, grads))
    return s + 1, acc, loss_sum + batch_sum, correct + batch_correct

  zeros = tf.zeros([count])
  start = tuple(tf.zeros_like(_stacked(w, count)) for w in weights)
  _, acc, loss_sum, correct = tf.while_loop(
      lambda s, *_: s < steps, step, (tf.constant(0), start, zeros, zeros))
  total = tf.maximum(examples, 1.0)
  update = tuple(a / tf.reshape(total, [-1] + [1] * (len(a.shape) - 1)) for a in acc)
  weight = tf.ones([count]) if rule.uniform_weighting else examples
  return update, weight, collections.OrderedDict(loss_sum=loss_sum, correct=correct,
                                                 num_examples=examples)


def _loss_and_sums(masked):
  loss, loss_sum, correct = masked
  return loss, (loss_sum, correct)


_KINDS = {"local_training": _local_training, "gradient": _gradient}

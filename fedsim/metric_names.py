"""Names of the metrics that more than one module writes or reads.

metrics.csv's columns and TensorBoard's tags are these strings; a metric
named by a single module (a stage's measurements, a schedule's own counters)
stays a literal there.
"""

ROUND = "round"
TRAIN_LOSS = "train/loss"
EVAL_ACCURACY = "eval/accuracy"
EVAL_LOSS = "eval/loss"
# Eval accuracy again at step = cumulative bits sent both ways, and at step =
# simulated milliseconds (TensorBoard only): a chart has one x unit.
EVAL_ACCURACY_BY_BITS = "eval/accuracy_by_bits"
EVAL_ACCURACY_BY_SIMULATED_MS = "eval/accuracy_by_simulated_ms"

# Both schedules (synchronous rounds and buffered server updates) log these.
CLIENTS_AGGREGATED = "clients/aggregated"
CLIENTS_FAILED = "clients/failed"
ROUND_SKIPPED = "round_skipped"
ROUND_SECONDS = "round_seconds"  # wall-clock seconds of the runtime's round
ROUND_SIMULATED_SECONDS = "round_simulated_seconds"
SIMULATED_SECONDS = "simulated_seconds"  # since the run began

# Bits sent so far (sizing writes them; the bits axis of plots reads them).
CUMULATIVE_BROADCAST_BITS = "cumulative_broadcast_bits"
CUMULATIVE_AGGREGATE_BITS = "cumulative_aggregate_bits"


def bits_sent(row) -> float:
  """Bits sent so far both ways (broadcast + aggregate) at a metrics row: the
  x axis of accuracy-versus-bits plots; 0 for a row without them."""
  return row.get(CUMULATIVE_BROADCAST_BITS, 0) + row.get(CUMULATIVE_AGGREGATE_BITS, 0)

"""The TensorBoard tag of each metric (a metrics.csv column).

TensorBoard's Scalars and Time Series tabs sort a run's tags by name, group
them by the text before the first '/' and open the first groups: under their
metrics.csv names `aggregate_bits`, `aggregation/...` and `clients/...` come
before `eval/accuracy`. So a column whose group already sorts where it
belongs keeps its name as its tag (`GROUPS_KEPT`: `eval/` and
`eval_clients/` first, then `privacy/`, `train/` last), and every other one is
filed under a group whose name puts it in order:

  eval/     eval accuracy and loss, also by bits and by simulated time
  eval_clients/  with `eval.federated`: the clients' own test splits
  final/    (not a column: the HParams ranking metrics, `hparams.FINAL_PREFIX`)
  privacy/  a differentially private run's epsilon and delta
  sent/     bits on the wire (`sent/broadcast_bits`, `sent/cumulative_aggregate_bits`,
            ...) and what a controller set (`sent/control/bits_mean`)
  stages/   the stages' own measurements (`stages/aggregation/encode/wire/packed_bits`,
            `stages/distributor/...`, `stages/finalizer/...`)
  system/   clients and the clock (`system/clients/sampled`, `system/round_seconds`,
            `system/simulated_seconds`, `system/staleness/mean`)
  train/    the clients' training metrics

metrics.csv, `fedsim compare` and the Python API keep the column names.
"""

from __future__ import annotations

GROUPS_KEPT = ("eval", "eval_clients", "privacy", "train")
SENT_GROUPS = ("control",)  # what a controller set: the size of what is sent
SYSTEM_GROUPS = ("clients", "staleness")


def board_tag(column: str) -> str:
  """The TensorBoard tag of metrics.csv column `column` (see the module docstring)."""
  group, slash, _ = column.partition("/")
  if group in GROUPS_KEPT:
    return column
  if group in SENT_GROUPS or (not slash and "bits" in column):
    return f"sent/{column}"
  if group in SYSTEM_GROUPS or not slash:
    return f"system/{column}"
  return f"stages/{column}"

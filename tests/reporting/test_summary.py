"""The end-of-run summary's size comparison when a controller sets each client's upload."""

from fedsim.reporting.summary import controlled_upload


def _row(aggregated, mean_bits, bits_range=(4.0, 4.0)):
  return {"clients/aggregated": aggregated, "aggregate_bits_per_client_mean": mean_bits,
          "control/bits_mean": sum(bits_range) / 2, "control/bits_min": bits_range[0],
          "control/bits_max": bits_range[1]}


def test_a_controlled_upload_is_compared_by_its_mean_over_every_aggregated_client():
  # 3 clients at 1,000 bits, then 1 at 5,000: 8,000 bits over 4 uploads = 2,000 a client,
  # against 32,000 uncompressed: 16x. (One client's size would say 32x or 6.4x.)
  rows = [_row(3, 1000, (2.0, 2.0)), _row(1, 5000, (1.0, 8.0))]
  assert controlled_upload(32_000, rows) == (
      "set per client by a controller: 16.00x fewer bits than uncompressed on average")


def test_a_controller_setting_one_value_per_round_is_said_to_set_it_each_round():
  # AdaQuantFL: every client of a round gets the round's value (min = max each round).
  rows = [_row(3, 1000, (1.0, 1.0)), _row(1, 5000, (2.0, 2.0))]
  assert controlled_upload(32_000, rows) == (
      "set each round by a controller: 16.00x fewer bits than uncompressed on average")


def test_rounds_that_aggregated_nobody_do_not_count():
  rows = [_row(0, 0), _row(2, 64_000, (4.0, 6.0))]
  assert controlled_upload(32_000, rows) == (
      "set per client by a controller: 2.00x more bits than uncompressed on average")
  assert controlled_upload(32_000, [_row(0, 0)]) == "set each round by a controller"


def test_a_controlled_runs_model_share_per_round_is_its_clients_own():
  """Two rounds of 2 clients: model bits 1,000 and 9,000 of uploads of 1,100 and 9,100
  (100 bits of weight and metrics each): per round 10,200 bits, of which the model
  10,000; the last client's variant alone would say 10,200 x 1,000 / 1,100."""
  import types
  from fedsim.reporting.summary import per_round
  from fedsim.sizing import ClientWireBits, SizeInfo
  rows = [{**_row(2, 5100), "aggregate_bits_per_client": 5100,
           "aggregate_model_bits_per_client": 5000, "distributor/x": 0}] * 2
  sizes = SizeInfo(per_client=ClientWireBits(broadcast=64, broadcast_model=64,
                                             aggregate=1100, aggregate_model=1000))
  sizes.broadcast_history, sizes.aggregate_history = [128, 128], [10_200, 10_200]
  result = types.SimpleNamespace(size_info=sizes, metrics=rows,
                                 controlled_direction="aggregation")
  assert per_round(result).endswith("aggregate 9.96 Kibit (model 9.77 Kibit); mean of 2 rounds")


def test_a_private_runs_summary_says_the_epsilon_it_spent():
  import pathlib
  import types
  from fedsim.reporting.summary import run_summary
  from fedsim.sizing import ClientWireBits, SizeInfo
  sizes = SizeInfo(per_client=ClientWireBits(broadcast=64, broadcast_model=64,
                                             aggregate=64, aggregate_model=64))
  rows = [{"round": 1, "privacy/epsilon": 0.5, "privacy/delta": 1e-5},
          {"round": 2, "privacy/epsilon": 0.71234, "privacy/delta": 1e-5}]
  result = types.SimpleNamespace(final={**rows[0], **rows[1]}, size_info=sizes, metrics=rows,
                                 uncompressed_bits_per_client=(64, 64),
                                 run_dir=pathlib.Path("runs/x/dp"), controlled_direction=None)
  assert run_summary(result, "dp").splitlines()[-1] == (
      "[dp] privacy: epsilon 0.7123 at delta 1e-05 after 2 rounds")
  result.final = {"round": 2}
  assert "privacy" not in run_summary(result)


def test_a_controller_on_the_broadcast_is_said_of_the_broadcast_not_the_upload():
  """It was said of the aggregate ('set each round by a controller: uncompressed on
  average'), and the broadcast got its first round's static ratio."""
  import pathlib
  import types
  from fedsim.reporting.summary import run_summary
  from fedsim.sizing import ClientWireBits, SizeInfo
  # 3 clients a round: 1,000 bits each in round 1, then 3,000 (the controller raised the
  # levels): 12,000 bits over 6 broadcasts = 2,000 a client, against 32,000: 16x.
  rows = [{"round": 1, "broadcast_bits": 3000, "broadcast_bits_per_client": 1000,
           "control/levels_mean": 1.0, "control/levels_min": 1.0, "control/levels_max": 1.0},
          {"round": 2, "broadcast_bits": 9000, "broadcast_bits_per_client": 3000,
           "control/levels_mean": 4.0, "control/levels_min": 4.0, "control/levels_max": 4.0}]
  sizes = SizeInfo(per_client=ClientWireBits(broadcast=1000, broadcast_model=1000,
                                             aggregate=32_128, aggregate_model=32_000))
  result = types.SimpleNamespace(final=rows[-1], size_info=sizes, metrics=rows,
                                 uncompressed_bits_per_client=(32_000, 32_128),
                                 run_dir=pathlib.Path("runs/x/b"), controlled_direction="broadcast")
  communicated = run_summary(result).splitlines()[2]
  assert communicated.endswith(
      "(set each round by a controller: 16.00x fewer bits than uncompressed on average),"
      " aggregate 0 bit (uncompressed)")

"""The end-of-run summary's size comparison when a controller sets each client's upload."""

from fedsim.reporting.summary import controlled_upload


def _row(aggregated, mean_bits):
  return {"clients/aggregated": aggregated, "aggregate_bits_per_client_mean": mean_bits,
          "control/bits_mean": 1.0}


def test_a_controlled_upload_is_compared_by_its_mean_over_every_aggregated_client():
  # 3 clients at 1,000 bits, then 1 at 5,000: 8,000 bits over 4 uploads = 2,000 a client,
  # against 32,000 uncompressed: 16x. (One client's size would say 32x or 6.4x.)
  rows = [_row(3, 1000), _row(1, 5000)]
  assert controlled_upload(32_000, rows) == (
      "set per client by a controller: 16.00x fewer bits than uncompressed on average")


def test_rounds_that_aggregated_nobody_do_not_count():
  rows = [_row(0, 0), _row(2, 64_000)]
  assert controlled_upload(32_000, rows) == (
      "set per client by a controller: 2.00x more bits than uncompressed on average")
  assert controlled_upload(32_000, [_row(0, 0)]) == "set per client by a controller"

"""pack/stack: exact batch contents, padding and epoch boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim.data.federated import Examples
from fedsim.data.packing import pack, packed_examples, stack


def numbered(n: int, feature_shape: tuple[int, ...] = (1,)) -> Examples:
  """Example i has label i and every feature equal to i + 1 (so padding's 0 stands out)."""
  x = np.broadcast_to((np.arange(n) + 1.0).reshape(-1, *[1] * len(feature_shape)),
                      (n, *feature_shape)).astype(np.float32)
  return Examples(x, np.arange(n, dtype=np.int32))


def indices(batches) -> list[list[int]]:
  """The example index of each slot, -1 for padding."""
  return np.where(batches.mask > 0, batches.y, -1).tolist()


def test_one_epoch_without_shuffle_is_consecutive_batches_with_the_last_padded():
  batches = pack(numbered(7), 3, shuffle=False)
  assert indices(batches) == [[0, 1, 2], [3, 4, 5], [6, -1, -1]]
  assert batches.x.shape == (3, 3, 1) and batches.x.dtype == np.float32
  assert batches.y.dtype == np.int32 and batches.mask.dtype == np.float32
  np.testing.assert_array_equal(batches.mask, [[1, 1, 1], [1, 1, 1], [1, 0, 0]])
  np.testing.assert_array_equal(batches.x[2, :, 0], [7, 0, 0])
  assert batches.num_examples == 7


def test_batches_without_padding_are_copies_of_the_examples_with_a_full_mask():
  examples = Examples(numbered(6, (2,)).x, np.arange(6, dtype=np.int64))
  batches = pack(examples, 3, shuffle=False)
  assert indices(batches) == [[0, 1, 2], [3, 4, 5]]
  assert (batches.x.dtype, batches.y.dtype, batches.mask.dtype) == (np.float32, np.int32,
                                                                      np.float32)
  np.testing.assert_array_equal(batches.x[1, :, 1], [4, 5, 6])
  np.testing.assert_array_equal(batches.mask, np.ones((2, 3)))
  batches.x[0, 0] = -1  # the batches are the runtime's own, not views of the data
  assert examples.x[0, 0] == 1


def test_epochs_never_mix_two_passes_in_a_batch():
  batches = pack(numbered(5), 2, epochs=2, shuffle=False)
  assert indices(batches) == [[0, 1], [2, 3], [4, -1], [0, 1], [2, 3], [4, -1]]
  assert batches.num_examples == 10


def test_shuffled_epochs_are_reshuffled_permutations_and_reproducible():
  batches = pack(numbered(5), 2, epochs=3, seed=[1, 2])
  flat = np.array(indices(batches)).reshape(3, 6)
  passes = [row[row >= 0] for row in flat]
  assert all(sorted(p) == [0, 1, 2, 3, 4] for p in passes)
  assert all(row[-1] == -1 for row in flat)  # padding only closes each pass
  assert len({tuple(p) for p in passes}) > 1
  np.testing.assert_array_equal(pack(numbered(5), 2, epochs=3, seed=[1, 2]).y, batches.y)
  assert not np.array_equal(pack(numbered(5), 2, epochs=3, seed=[1, 3]).y, batches.y)


def test_steps_cycle_through_the_data_in_full_batches():
  batches = pack(numbered(5), 2, steps=4, shuffle=False)
  assert indices(batches) == [[0, 1], [2, 3], [4, 0], [1, 2]]
  assert batches.num_examples == 8


def test_shuffled_steps_take_passes_end_to_end():
  stream = np.array(indices(pack(numbered(5), 2, steps=6, seed=[9]))).ravel()
  assert sorted(stream[:5]) == [0, 1, 2, 3, 4]
  assert sorted(stream[5:10]) == [0, 1, 2, 3, 4]
  assert len(set(stream[10:])) == 2


def test_steps_with_fewer_examples_than_a_batch_are_one_padded_pass_each():
  batches = pack(numbered(3), 5, steps=2, shuffle=False)
  assert indices(batches) == [[0, 1, 2, -1, -1], [0, 1, 2, -1, -1]]
  assert batches.num_examples == 6


def test_steps_override_epochs():
  assert pack(numbered(5), 2, epochs=3, steps=1, shuffle=False).x.shape == (1, 2, 1)


def test_image_features_keep_their_shape():
  batches = pack(numbered(5, (4, 4, 1)), 2, shuffle=False)
  assert batches.x.shape == (3, 2, 4, 4, 1)
  assert batches.x[2, 0].min() == 5 and batches.x[2, 1].max() == 0


@pytest.mark.parametrize("kwargs", [dict(batch_size=0), dict(batch_size=2, epochs=0),
                                    dict(batch_size=2, steps=0)])
def test_counts_below_one_are_rejected(kwargs):
  with pytest.raises(ValueError):
    pack(numbered(5), **kwargs)


def test_empty_client_is_rejected():
  with pytest.raises(ValueError, match="no examples"):
    pack(numbered(0), 2)


def test_stack_pads_short_clients_with_empty_batches():
  long, short = pack(numbered(5), 2, shuffle=False), pack(numbered(2), 2, shuffle=False)
  stacked = stack([long, short])
  assert stacked.x.shape == (2, 3, 2, 1) and stacked.y.shape == (2, 3, 2)
  np.testing.assert_array_equal(stacked.mask, [[[1, 1], [1, 1], [1, 0]],
                                               [[1, 1], [0, 0], [0, 0]]])
  np.testing.assert_array_equal(stacked.x[0], long.x)
  np.testing.assert_array_equal(stacked.x[1, 0], short.x[0])
  assert not stacked.x[1, 1:].any() and not stacked.y[1, 1:].any()
  assert stacked.num_examples == 7


def test_stack_rejects_different_batch_sizes_and_nothing():
  with pytest.raises(ValueError, match="differ"):
    stack([pack(numbered(5), 2), pack(numbered(5), 3)])
  with pytest.raises(ValueError):
    stack([])


@pytest.mark.parametrize("n", [1, 4, 5, 6, 13])
@pytest.mark.parametrize("epochs,steps", [(1, None), (3, None), (1, 1), (1, 7), (2, 3)])
def test_packed_examples_is_the_mask_sum_of_pack(n, epochs, steps):
  want = pack(numbered(n), 5, epochs=epochs, steps=steps, seed=[0]).mask.sum()
  assert packed_examples(n, 5, epochs=epochs, steps=steps) == want

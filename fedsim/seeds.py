"""Every random stream fedsim draws from the run seed, registered once.

A use draws from `np.random.default_rng([seed, STREAM, ...])`; the words after
the stream id are the use's own (a round, a client index). Two uses share
random numbers exactly when they share a stream id, so each id is registered
here once, with what it draws (tests/test_seed_streams.py checks that ids are
unique and that no other module defines one). A new use takes the next free
id; changing an id changes every result drawn from it.

The synthetic datasets split GENERATE_STREAM once more, by a substream word
after the stream id; those words are registered here too.

Not covered here: TensorFlow's stateless ops are seeded by their own tuples
(DP noise in aggregation/private.py, encoders' rounding noise in
compression/noise_seeds.py).
"""

from __future__ import annotations

import dataclasses

# The largest run seed (the config's `seed` and `seeds`, `--seeds`).
MAX_SEED = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Stream:
  name: str
  id: int
  purpose: str
  parent: str | None = None  # a substream's stream


STREAMS: list[Stream] = []


def _stream(name: str, stream_id: int, purpose: str, parent: str | None = None) -> int:
  STREAMS.append(Stream(name, stream_id, purpose, parent))
  return stream_id


SPLIT_STREAM = _stream("SPLIT_STREAM", 1, "train/test split of a centralized dataset")
PARTITION_STREAM = _stream("PARTITION_STREAM", 2, "which client gets which example")
CAP_STREAM = _stream("CAP_STREAM", 3,
                     "max_examples_per_client subsets, then client index")
GENERATE_STREAM = _stream("GENERATE_STREAM", 4, "synthetic examples, then a substream below")
SAMPLE_STREAM = _stream("SAMPLE_STREAM", 5, "clients per round, then round number")
PACK_STREAM = _stream("PACK_STREAM", 6,
                      "local shuffling, then round, client index and pass")
HOLDOUT_STREAM = _stream("HOLDOUT_STREAM", 7,
                         "per-client evaluation hold-out, then client index")
PROFILE_STREAM = _stream("PROFILE_STREAM", 8, "a client's device profile, then client key")
JITTER_STREAM = _stream("JITTER_STREAM", 9,
                        "per-round jitter of a profile, then round and client key")
SYSTEM_STREAM = _stream("SYSTEM_STREAM", 10,
                        "device speed and dropout of a round's clients, then round number")
SKETCH_STREAM = _stream("SKETCH_STREAM", 11,
                        "count_sketch's hash and sign functions, then its index in the chain")
POISSON_STREAM = _stream("POISSON_STREAM", 12,
                         "sampling: poisson, who is in a round, then round number")
DESCRIBE_STREAM = _stream("DESCRIBE_STREAM", 20,
                          "which clients `describe` reads labels of (seed 0, not the run's)")

EMNIST_CLIENT_SUBSTREAM = _stream("EMNIST_CLIENT_SUBSTREAM", 0,
                                  "emnist_synthetic's clients, then client index",
                                  "GENERATE_STREAM")
EMNIST_TEST_SUBSTREAM = _stream("EMNIST_TEST_SUBSTREAM", 1, "emnist_synthetic's test set",
                                "GENERATE_STREAM")
LEAF_CLIENT_SUBSTREAM = _stream("LEAF_CLIENT_SUBSTREAM", 2,
                                "leaf synthetic's clients, then client index and part",
                                "GENERATE_STREAM")
LEAF_SHARED_SUBSTREAM = _stream("LEAF_SHARED_SUBSTREAM", 3,
                                "the one model that leaf synthetic's `iid` clients share",
                                "GENERATE_STREAM")

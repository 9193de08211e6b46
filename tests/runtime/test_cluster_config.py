"""The `ray` runtime's keys and checks that need no cluster."""

from __future__ import annotations

import socket

import pytest

from fedsim.errors import UserError
from fedsim.experiment.config.loader import parse_config
from fedsim.runtime import cluster

CONFIG = {
    "name": "ray", "rounds": 1, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4}, "model": {"name": "logistic"},
}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("runtime,message", [
    ({"address": "nohost"}, "runtime.address: 'nohost' is not local, auto or HOST:PORT"),
    ({"workers": 0}, "runtime.workers"),
    ({"cpus_per_worker": 0}, "runtime.cpus_per_worker"),
    ({"keep_workers": "yes"}, "runtime.keep_workers"),
])
def test_bad_runtime_keys_are_refused_by_name(runtime, message):
  with pytest.raises(UserError, match=message):
    parse_config({**CONFIG, "runtime": {"name": "ray", **runtime}})


def test_ray_keys_without_ray_are_refused():
  with pytest.raises(UserError, match="^runtime.workers: unknown key"):
    parse_config({**CONFIG, "runtime": {"name": "inprocess", "workers": 4}})


def test_an_address_where_nothing_listens_is_refused_at_once():
  port = _free_port()  # closed again: nothing listens there
  with pytest.raises(UserError, match=f"runtime.address: no Ray cluster answers at"
                                      f" 127.0.0.1:{port}"):
    cluster.ClusterProcess(None, None, cluster.ClusterSpec(address=f"127.0.0.1:{port}"))
  import ray
  assert not ray.is_initialized()


@pytest.mark.parametrize("count,workers,bounds", [
    (5, 2, [(0, 2), (2, 5)]), (4, 2, [(0, 2), (2, 4)]), (1, 3, [(0, 0), (0, 0), (0, 1)]),
    (7, 3, [(0, 2), (2, 4), (4, 7)]),
])
def test_chunks_are_contiguous_and_cover_the_round(count, workers, bounds):
  assert cluster.chunk_bounds(count, workers) == bounds


@pytest.mark.parametrize("text,cause", [
    ("The actor died because of an error raised in its creation task, \x1b[36mray::"
     "ClientWorker.__init__()\x1b[39m (pid=1, ip=1.2.3.4)\nTraceback (most recent call last):\n"
     '  File "x.py", line 3, in build\n    raise UserError("data.path: gone")\n'
     "fedsim.errors.UserError: data.path: gone",
     "UserError: data.path: gone"),
    ("The actor died unexpectedly before finishing this task.\n\tclass_name: ClientWorker",
     "The actor died unexpectedly before finishing this task."),
])
def test_a_dead_workers_cause_is_one_line(text, cause):
  assert cluster.failures.actor_cause(Exception(text)) == cause

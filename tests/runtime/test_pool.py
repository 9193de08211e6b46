"""The pool's decisions (fedsim/runtime/cluster/pool.py) against a fake Ray: which
idle actors a run leases, which it replaces or kills, when a connection is kept,
replaced or refused. No Ray process starts; test_cluster runs the real thing."""

from __future__ import annotations

import itertools

import pytest

from fedsim.errors import RunFailed, UserError
from fedsim.runtime.cluster import pool


class FakeRef:
  def __init__(self, handle):
    self.handle = handle


class FakeHandle:
  """An actor: answers `pid` with its process id while alive; `restarted` gives
  it a new id, as Ray's restart of a dead actor does."""

  def __init__(self, ray, args):
    self.ray, self.args = ray, args
    self.process = next(ray.pids)
    self.alive = True
    self.pid = self  # handle.pid.remote()

  def remote(self):
    return FakeRef(self)

  def restarted(self):
    self.process = next(self.ray.pids)


class FakeClass:
  def __init__(self, ray, cls):
    self.ray, self.cls, self.options_given = ray, cls, None

  def options(self, **options):
    self.options_given = options
    return self

  def remote(self, *args):
    handle = FakeHandle(self.ray, args)
    self.ray.started.append(handle)
    return handle


class FakeContext:
  def __init__(self, ray):
    self.ray = ray
    self.gcs_address = ray.gcs

  def get_job_id(self):
    return self.ray.job


class FakeRay:
  """What pool.py calls of `ray`, recording inits, shutdowns, kills and starts."""

  def __init__(self):
    self.initialized = False
    self.jobs = (f"job{i}" for i in itertools.count())
    self.job = None
    self.gcs = "127.0.0.1:6379"
    self.pids = itertools.count(1000)
    self.inits, self.shutdowns, self.killed, self.started = [], 0, [], []

  def is_initialized(self):
    return self.initialized

  def init(self, **kwargs):
    self.initialized, self.job = True, next(self.jobs)
    self.inits.append(kwargs)

  def shutdown(self):
    self.initialized = False
    self.shutdowns += 1

  def get_runtime_context(self):
    return FakeContext(self)

  def remote(self, cls):
    return FakeClass(self, cls)

  def wait(self, refs, num_returns, timeout):
    return refs, []

  def get(self, ref, timeout=None):
    if not ref.handle.alive:
      raise RuntimeError("the actor died")
    return ref.handle.process

  def kill(self, handle, no_restart=True):
    assert no_restart
    handle.alive = False
    self.killed.append(handle)


class FakeReaper:
  swept = 0

  def tagged(self):
    return _nothing()

  def sweep(self):
    FakeReaper.swept += 1


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


@pytest.fixture
def ray(monkeypatch):
  fake = FakeRay()
  monkeypatch.setattr(pool, "import_ray", lambda: fake)
  monkeypatch.setattr(pool, "Reaper", FakeReaper)
  monkeypatch.setattr(pool, "process_handlers_kept", _nothing)
  monkeypatch.setattr(pool, "ray_log_off_the_terminal", _nothing)
  monkeypatch.setattr(pool, "check_reachable", lambda *args: None)
  monkeypatch.setattr(pool, "auto_address", lambda key="": "10.0.0.9:6379")
  for name, value in (("_connection", None), ("_idle", {}), ("_leased", {}),
                      ("_atexit_registered", True)):  # no atexit hook for a fake
    monkeypatch.setattr(pool, name, value)
  FakeReaper.swept = 0
  return fake


class Worker:
  pass


class OtherWorker:
  pass


SHAPE = pool.Shape(Worker, cpus=1.0, gpus=0.0, one_thread_ops=True, workdir="/w")


def _built(actors):
  """As a run's first task does: records the pid each actor was built in."""
  for actor in actors:
    actor.pid = actor.handle.process
  return actors


def test_a_clean_runs_actors_serve_the_next_run_of_the_same_shape(ray):
  pool.connection("local", "runtime.address", 2, 0)
  first = _built(pool.lease(SHAPE, 2, reuse=True))
  assert [a.pid for a in first] == [1000, 1001]
  assert ray.started[0].args == (1, "/w", True)  # threads, workdir, one-thread ops
  pool.give_back(SHAPE, first)
  assert len(pool.idle_actors()) == 2
  again = pool.lease(SHAPE, 2, reuse=True)
  assert [a.handle for a in again] == [a.handle for a in first]
  assert len(ray.started) == 2 and ray.killed == [] and pool.idle_actors() == []


def test_reuse_false_starts_new_actors_and_kills_the_idle_ones(ray):
  pool.connection("local", "runtime.address", 2, 0)
  pool.give_back(SHAPE, _built(pool.lease(SHAPE, 2, reuse=True)))
  kept = pool.idle_actors()
  fresh = pool.lease(SHAPE, 2, reuse=False)
  assert ray.killed == kept  # they held the CPUs the new ones need
  assert [a.pid for a in fresh] == [0, 0] and len(ray.started) == 4


def test_an_idle_actor_that_died_or_was_restarted_is_replaced(ray):
  pool.connection("local", "runtime.address", 3, 0)
  actors = _built(pool.lease(SHAPE, 3, reuse=True))
  pool.give_back(SHAPE, actors)
  actors[0].handle.alive = False       # died while idle
  actors[1].handle.restarted()         # Ray restarted it: its build is gone
  got = pool.lease(SHAPE, 3, reuse=True)
  assert got[0].handle is actors[2].handle
  assert ray.killed == [actors[0].handle, actors[1].handle]
  assert [a.pid for a in got[1:]] == [0, 0] and len(ray.started) == 5


def test_a_run_of_fewer_actors_leaves_the_rest_idle_and_another_shape_kills_them(ray):
  pool.connection("local", "runtime.address", 2, 0)
  pool.give_back(SHAPE, _built(pool.lease(SHAPE, 2, reuse=True)))
  one = pool.lease(SHAPE, 1, reuse=True)
  assert len(pool.idle_actors()) == 1 and ray.killed == []
  other = pool.Shape(OtherWorker, 1.0, 0.0, True, "/w")
  pool.lease(other, 1, reuse=True)
  assert len(ray.killed) == 1 and ray.killed[0] is not one[0].handle
  assert pool.idle_actors() == []


def test_a_private_instance_is_kept_while_it_is_big_enough(ray):
  assert pool.connection("local", "runtime.address", 2, 0) == ray.gcs
  pool.connection("local", "runtime.address", 1, 0)
  assert len(ray.inits) == 1 and ray.inits[0]["num_cpus"] == 2
  pool.give_back(SHAPE, _built(pool.lease(SHAPE, 2, reuse=True)))
  pool.connection("local", "runtime.address", 4, 0)  # bigger: a new instance
  assert [i["num_cpus"] for i in ray.inits] == [2, 4]
  assert ray.shutdowns == 1 and len(ray.killed) == 2 and FakeReaper.swept == 1
  assert pool.idle_actors() == []
  pool.connection("local", "runtime.address", 2, 1)  # a GPU it does not have: new again
  assert [i["num_gpus"] for i in ray.inits] == [None, None, 1]


def test_a_cluster_connection_serves_its_address_and_auto_only_when_it_is_that_address(ray):
  pool.connection("10.0.0.9:6379", "runtime.address", 1, 0)
  pool.connection("auto", "runtime.address", 1, 0)  # resolves to the same head
  pool.connection("10.0.0.9:6379", "runtime.address", 8, 0)  # a cluster's size is not ours
  assert len(ray.inits) == 1 and ray.inits[0]["address"] == "10.0.0.9:6379"
  pool.connection("10.0.0.7:6379", "runtime.address", 1, 0)
  pool.connection("local", "runtime.address", 1, 0)
  assert [i["address"] for i in ray.inits] == ["10.0.0.9:6379", "10.0.0.7:6379", "local"]
  assert ray.shutdowns == 2 and FakeReaper.swept == 0  # no instance of fedsim's stopped yet


def test_after_the_users_own_shutdown_and_init_a_run_refuses_their_connection(ray):
  pool.connection("local", "runtime.address", 2, 0)
  pool.give_back(SHAPE, _built(pool.lease(SHAPE, 2, reuse=True)))
  ray.shutdown()
  ray.init()  # the user's: another job
  with pytest.raises(UserError, match=r"^runtime.address: Ray is already initialized in this"
                                      r" process; call ray.shutdown\(\) first"):
    pool.connection("local", "runtime.address", 2, 0)
  assert pool.idle_actors() == [] and ray.killed == []  # theirs ended with the connection
  assert ray.initialized and ray.shutdowns == 1  # the user's connection is left alone
  assert FakeReaper.swept == 1


def test_actors_given_back_after_the_connection_changed_are_not_kept(ray):
  pool.connection("local", "runtime.address", 2, 0)
  actors = _built(pool.lease(SHAPE, 2, reuse=True))
  ray.shutdown()
  pool.give_back(SHAPE, actors)
  assert pool.idle_actors() == []


def test_a_lost_cluster_fails_the_next_run_and_is_never_touched_again(ray):
  pool.connection("10.0.0.9:6379", "runtime.address", 1, 0)
  actors = pool.lease(SHAPE, 2, reuse=True)
  pool.lose()
  pool.discard(actors, disconnect=True)
  pool.release()
  assert ray.killed == [] and ray.shutdowns == 0
  with pytest.raises(RunFailed, match=r"^start-up: this process lost its ray cluster \(head"
                                      r" 127.0.0.1:6379\) in an earlier run; start a new"
                                      r" process$"):
    pool.connection("10.0.0.9:6379", "runtime.address", 1, 0)


def test_discard_kills_a_runs_actors_and_disconnects_when_nothing_is_left(ray):
  pool.connection("local", "runtime.address", 4, 0)
  a = pool.lease(SHAPE, 2, reuse=True)
  b = pool.lease(pool.Shape(OtherWorker, 1.0, 0.0, True, "/w"), 2, reuse=True)
  pool.discard(a, disconnect=True)
  assert ray.killed == [x.handle for x in a] and ray.shutdowns == 0  # b is still held
  pool.discard(b, disconnect=True)
  assert ray.shutdowns == 1 and FakeReaper.swept == 1 and pool.idle_actors() == []


def test_connect_ends_the_pools_connection_and_its_actors_first(ray):
  pool.connection("local", "runtime.address", 2, 0)
  pool.give_back(SHAPE, _built(pool.lease(SHAPE, 2, reuse=True)))
  kept = pool.idle_actors()
  reaper = pool.connect("local", "--ray-address", num_cpus=3)
  assert isinstance(reaper, FakeReaper)
  assert ray.killed == kept and ray.shutdowns == 1 and ray.inits[-1]["num_cpus"] == 3
  with pytest.raises(UserError, match=r"^--ray-address: Ray is already initialized"):
    pool.connect("10.0.0.7:6379", "--ray-address", num_cpus=1)  # the caller's own, not ended

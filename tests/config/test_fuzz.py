"""Property-based: every malformed config ends in one clean line and exit code 2.

Hypothesis mutates a small valid config (wrong types, unknown keys,
out-of-range and huge numbers, missing keys and sections, deep nesting) or
replaces the file by non-YAML text, non-mapping YAML or binary junk. Both
`fedsim validate` and `fedsim run` must then exit 2 with exactly one stderr
line `fedsim: error: ...` and no traceback; a mutation that happens to stay
valid must validate (exit 0) and is not run. Nothing here imports TF.
"""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from fedsim import cli

VALID = {
    "name": "fuzz", "seed": 0, "rounds": 2, "clients_per_round": 2,
    "data": {"name": "digits", "num_clients": 4, "partition": "iid", "batch_size": 16},
    "model": {"name": "mlp", "hidden": [8]},
    "algorithm": {"name": "fedavg", "client_optimizer": {"name": "sgd", "learning_rate": 0.1}},
    "eval": {"every": 1},
    "checkpoint": {"every": 1, "keep": 2},
    "compression": {"aggregation": {"encoder": "uniform", "bits": 8}},
    "system": {"speed": "lognormal", "dropout_probability": 0.1},
    "variants": {"a": {}, "b": {"model": {"hidden": [4]}}},
}


def _paths(node, prefix=()):
  """Every key path of a nested mapping (sections and leaves)."""
  for key, value in node.items():
    yield prefix + (key,)
    if isinstance(value, dict):
      yield from _paths(value, prefix + (key,))


PATHS = list(_paths(VALID))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from([0, -1, 10**30, 1e308, "mlp", "digits", "fedavg", "", "1e3"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


def _deep(depth: int, as_list: bool):
  node = 1
  for _ in range(depth):
    node = [node] if as_list else {"k": node}
  return node


@st.composite
def structured(draw):
  config = copy.deepcopy(VALID)
  for _ in range(draw(st.integers(1, 3))):
    path = draw(st.sampled_from(PATHS))
    parent = config
    for key in path[:-1]:
      parent = parent.get(key) if isinstance(parent, dict) else None
    if not isinstance(parent, dict):
      continue
    action = draw(st.sampled_from(["set", "delete", "unknown", "deep"]))
    if action == "set":
      parent[path[-1]] = draw(values)
    elif action == "delete":
      parent.pop(path[-1], None)
    elif action == "unknown":
      parent[draw(st.text(min_size=1, max_size=12))] = draw(values)
    else:
      parent[path[-1]] = _deep(draw(st.integers(20, 300)), draw(st.booleans()))
  return yaml.safe_dump(config, allow_unicode=True).encode()


raw_files = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"[1, 2]", b"42", b"- name: x", b"{a: [", b"name: x\n\tbad: 1",
                     b"!!python/object/apply:os.system ['true']", b"\xff\xfe\x00",
                     b"[" * 5000 + b"]" * 5000, b"{a: " * 3000 + b"1" + b"}" * 3000,
                     b"a: &x [*x]", b"rounds: 1e400"]),
    values.map(lambda v: yaml.safe_dump(v).encode()))


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(content=st.one_of(structured(), raw_files))
def test_malformed_configs_exit_2_with_one_line(tmp_path, capsys, content):
  path = tmp_path / "config.yaml"
  path.write_bytes(content)
  code = cli.main(["validate", str(path)])
  out, err = capsys.readouterr()
  if code == 0:
    assert err == "" and out.startswith(f"{path}: ok")
    return
  _assert_clean(code, err)
  code = cli.main(["run", str(path), "--logdir", str(tmp_path / "runs"), "--no-progress"])
  _assert_clean(code, capsys.readouterr().err)
  assert not (tmp_path / "runs").exists()


def _assert_clean(code: int, err: str) -> None:
  lines = err.splitlines()
  assert code == 2, err
  assert len(lines) == 1 and lines[0].startswith("fedsim: error: "), err
  assert "Traceback" not in err

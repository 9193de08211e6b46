"""The peers' own virtual environment: pinned Flower and pfl-research on a CPU PyTorch.

Kept outside the repository (default ~/.cache/fedsim-peers) and never a dependency of
fedsim. Created on first use and reused while its record of the pins matches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DEFAULT = Path("~/.cache/fedsim-peers").expanduser()
# torch alone first and by plain pip: that takes the CPU wheel lying on this machine's
# disk; letting a resolver pick torch for flwr or pfl pulls a CUDA build of several GB.
TORCH = "torch==2.13.0"
PEERS = ("flwr[simulation]==1.42.*", "pfl==0.6.*")
RECORD = "fedsim-peers.json"
REPORTED = ("torch", "flwr", "pfl", "ray", "numpy")


def python(venv: Path) -> Path:
  return venv / "bin" / "python"


def ensure(venv: Path = DEFAULT, log=print) -> dict:
  """Returns the venv's record ({"python": path, "versions": {package: version}}).

  Creates the venv and installs the pins when the record is missing or names other
  pins; raises subprocess.CalledProcessError when pip fails.
  """
  record = venv / RECORD
  pins = [TORCH, *PEERS]
  if record.exists():
    saved = json.loads(record.read_text())
    if saved.get("pins") == pins and python(venv).exists():
      return saved
  log(f"creating the peers' environment in {venv} (once; several minutes)")
  subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
  pip = [str(python(venv)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
  subprocess.run([*pip, TORCH], check=True)
  subprocess.run([*pip, *PEERS, TORCH], check=True)
  versions = json.loads(subprocess.run(
      [str(python(venv)), "-c",
       "import importlib.metadata as m, json, sys; "
       "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))", *REPORTED],
      check=True, capture_output=True, text=True).stdout)
  saved = {"pins": pins, "python": str(python(venv)), "versions": versions}
  record.write_text(json.dumps(saved, indent=1))
  return saved


if __name__ == "__main__":
  print(json.dumps(ensure(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT), indent=1))

"""Takes the screenshots of docs/tensorboard.md: a small run of
experiments/compare_encoders.yaml served by TensorBoard on 127.0.0.1 and
opened in headless Chromium (`apt-get install -y chromium`).

  uv run python docs/tensorboard_screenshots.py [--rounds 20] [--target 0.9] [--logdir DIR]

Runs `fedsim compare --target` on it (the HParams tab's target), then writes
docs/images/tensorboard_{scalars,custom_scalars,images,hparams}.png.
The TensorBoard server and the browser are killed when the script ends,
whatever happens.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = {  # screenshot name -> TensorBoard page
    # Smoothing off, as docs/tensorboard.md advises. (Time Series, the page TensorBoard
    # opens on, draws its charts in a worker that headless Chromium leaves blank.)
    "tensorboard_scalars": "#scalars&_smoothingWeight=0",
    "tensorboard_custom_scalars": "#custom_scalars",
    "tensorboard_images": "#images",
    "tensorboard_hparams": "#hparams",
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--target", type=float, default=0.9, help="for `fedsim compare --target`")
  parser.add_argument("--logdir", default=None, help="default: a new temporary directory")
  parser.add_argument("--skip-run", action="store_true", help="the logdir holds the run already")
  args = parser.parse_args()
  logdir = pathlib.Path(args.logdir or tempfile.mkdtemp(prefix="fedsim-shots-"))
  if not args.skip_run:
    subprocess.run([sys.executable, "-m", "fedsim.cli", "run",
                    str(ROOT / "experiments/compare_encoders.yaml"),
                    "--set", f"rounds={args.rounds}", "--logdir", str(logdir)], check=True)
  experiment = logdir / "compare_encoders"
  subprocess.run([sys.executable, "-m", "fedsim.cli", "compare", str(experiment),
                  "--target", str(args.target)], check=True)
  log = logdir / "tensorboard.log"
  with open(log, "wb") as out:
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(experiment),
         "--host", "127.0.0.1", "--port", "0", "--load_fast", "false"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
  try:
    url = _address(log)
    time.sleep(10)  # the first load of the logdir
    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    for name, page in PAGES.items():
      output = images / f"{name}.png"
      browser = subprocess.Popen(
          ["chromium", "--headless", "--no-sandbox", "--use-angle=swiftshader",
           "--enable-unsafe-swiftshader", "--hide-scrollbars",
           "--window-size=1600,1000", "--virtual-time-budget=15000",
           f"--screenshot={output}", f"{url}/{page}"],
          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
      try:
        if browser.wait(timeout=180):
          raise SystemExit(f"chromium failed on {url}/{page}")
      finally:
        os.killpg(browser.pid, signal.SIGKILL)  # its helper processes too
        browser.wait()
      print(output)
  finally:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def _address(log: pathlib.Path) -> str:
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline:
    found = re.search(r"http://127\.0\.0\.1:\d+", log.read_text(errors="replace"))
    if found:
      return found.group(0)
    time.sleep(0.5)
  raise SystemExit(f"TensorBoard did not start: {log.read_text(errors='replace')}")


if __name__ == "__main__":
  main()

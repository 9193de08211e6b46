"""Small builders of the controllers' typed views for the tests of this folder."""

from __future__ import annotations

from fedsim.control import ClientView, Knob, ServerView


def knob(param: str = "bits", initial: float = 2, minimum: float = 1, maximum: float = 8,
         integer: bool = True, encoder: str = "uniform", upload_bits=lambda v: 0) -> Knob:
  return Knob(encoder=encoder, param=param, initial=initial, minimum=minimum, maximum=maximum,
              integer=integer, upload_bits=upload_bits)


def client(cid: str, examples: int = 10, up_bps: float | None = None,
           down_bps: float | None = None, latency_s: float = 0.0, compute_seconds: float = 0.0,
           download_bits: int = 0) -> ClientView:
  return ClientView(id=cid, examples=examples, up_bps=up_bps, down_bps=down_bps,
                    latency_s=latency_s, compute_seconds=compute_seconds,
                    download_bits=download_bits)


def view(round_num: int, the_knob: Knob, losses=(), clients=(client("a"),),
         deadline_s: float | None = None) -> ServerView:
  """The view before round `round_num`, whose earlier rounds had training `losses`."""
  history = tuple({"round": r, "train/loss": loss} for r, loss in enumerate(losses, start=1))
  return ServerView(round=round_num, history=history, clients=tuple(clients),
                    deadline_s=deadline_s, knob=the_knob)

"""The `ray` runtime: a round's clients split over Ray actors, merged on the driver.

The round runs in the phases of its MapReduceForm (see `fedsim.runtime.inprocess`):

    client_input, zero = prepare(state), zero()                      driver
    acc_w = accumulate over chunk w of the clients: work(data_c, client_input)
                                                                      actor w
    acc = merge(...merge(merge(acc_0, acc_1), acc_2)...)             driver, chunk order
    state', measurements = update(state, report(acc))                driver

Each actor builds its data, model and compiled round once per run, from the
experiment config (a worker builder the experiment layer hands in), not from
pickled TensorFlow objects; actors outlive a run that ends cleanly and serve
the next one of this process (`pool`; `release()` ends them). When the round's client data knows its client ids and
round (`ids`, `round_num`), actors are sent only the ids and pack their own
clients, seeded as the run loop packs them; a plain list of packed clients is
shipped as it is. Chunks are contiguous runs of the round's clients, one per
actor, so the result is `inprocess`'s to float rounding (bit for bit with one
worker).

Ray is imported only in this package (`pool.import_ray`, and by an actor
fetching its run's build), its private address lookup in one place
(`address.auto_address`). Modules: `worker` (the actor and the keys),
`address`, `pool` (the process's connection and idle actors), `process` (the
driver's side of a run), `lifetime` (a private instance dies with the driver;
Ray leaves the driver's signal handlers alone).
"""

from fedsim.runtime.cluster.address import check_address
from fedsim.runtime.cluster.pool import RESTARTS, release
from fedsim.runtime.cluster.process import ClusterProcess
from fedsim.runtime.cluster.worker import ClientWorker, ClusterSpec, chunk_bounds

__all__ = ["RESTARTS", "ClientWorker", "ClusterProcess", "ClusterSpec", "chunk_bounds",
           "check_address", "release"]

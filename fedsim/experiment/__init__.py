"""Running an experiment, and only that: its config, the simulation a config
becomes, the round loop (synchronous or buffered) with its evaluation, encoder
control and callbacks, and which run directory a run continues. What a run keeps
on disk is `fedsim.state`; the simulated devices and links, `fedsim.system`."""

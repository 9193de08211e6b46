"""The simulated devices and links: each client's device and link profile, and the
clock that says which sampled clients finish a round and how long it takes."""

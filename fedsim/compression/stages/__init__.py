"""tensor_encoding encoding stages of the encoders research papers compare.

Each module holds one stage (or a small family) written against the names
`fedsim.compression.tensor_encoding_api` re-exports; the encoders built from
them are registered in `fedsim.compression.encoder_catalog`. Every stage but `threshold`
keeps static shapes (its outputs' sizes follow from its input's),
so the compiled round sizes what crosses the wire exactly; `threshold`'s
depend on the values and the server measures them each round
(`fedsim.compression.wire_meter`). Stages that draw noise seed it with
`noise_seeds.noise_seed`. None of them commutes with the sum (each
client has its own scale, coordinates or rotation): the server decodes each
client's value before summing (`base.PerClientStage`). `low_rank` alone
keeps state across rounds (PowerSGD's warm-start factor, a tensor_encoding
adaptive stage, on the server).
"""

"""fedsim's door to TFF's internals: an upgrade of TFF touches this package.

* `quiet`: TensorFlow and TFF imported without their start-up noise.
* `contexts`: TFF execution contexts on a worker, and their installation.
* `mapreduce`: a process's MapReduceForm, compiled once (sizing and inprocess).
* `computations`: TFF computation protos as TensorFlow functions.

Kept free of TensorFlow imports, as is `quiet`; the others import TFF.
"""

"""fedsim's door to TFF's internals: an upgrade of TFF touches this package.

* `quiet`: TensorFlow and TFF imported without their start-up noise.
* `lazy_imports`: TFF's differential-privacy packages run at first use.
* `contexts`: TFF execution contexts on a worker, and their installation.
* `mapreduce`: a process's MapReduceForm, compiled once (sizing and inprocess).
* `computations`: TFF computation protos as TensorFlow functions.
* `privacy`: what fedsim reads inside TFF's, tensorflow_privacy's and dp_accounting's DP code.

Kept free of TensorFlow imports, as are `quiet`, `lazy_imports` and `privacy`
(which imports inside its functions); the others import TFF.
"""

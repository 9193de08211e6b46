"""fedsim's door to TFF's execution internals (contexts, executors, the worker
binary's location): an upgrade of TFF touches this package, not the runtime.

Kept free of TensorFlow imports; `fedsim.backend.contexts` imports TFF.
"""
